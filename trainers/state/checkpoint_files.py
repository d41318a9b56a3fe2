"""A model directory's checkpoints found by their files: the state file's damage, the
checkpoints a manager holds, and whether a checkpoint reads back in full.

A damaged state file (`checkpoint`: unreadable, empty, garbled, missing, or naming a checkpoint
that is not there) is told apart from a sound one, and the checkpoints are then found by their
files (`ckpt-<N>.index`).
"""

from __future__ import annotations

import os
import re

import tensorflow as tf
from google.protobuf import text_format
from tensorflow.python.checkpoint import checkpoint_management as _management

from orbitask.common import files
from orbitask.common.errors import one_line


def scan(directory: str, name: str = "ckpt") -> list[str]:
    """The checkpoints in `directory` found by their files (`<name>-<N>.index`), oldest first."""
    if not tf.io.gfile.isdir(directory):
        return []
    pattern = re.compile(rf"^{re.escape(name)}-(\d+)\.index$")
    found = [(m, entry) for entry in tf.io.gfile.listdir(directory) if (m := pattern.match(entry))]
    found.sort(key=lambda item: int(item[0].group(1)))
    return [os.path.join(directory, entry[: -len(".index")]) for _, entry in found]


def state_damage(directory: str, name: str = "ckpt") -> str | None:
    """What is wrong with the state file (`<directory>/checkpoint`), or None when it is sound
    (or absent in a directory without checkpoints)."""
    state_path = os.path.join(directory, "checkpoint")
    if not tf.io.gfile.exists(state_path):
        return f"the state file {state_path} is missing" if scan(directory, name) else None
    try:
        with tf.io.gfile.GFile(state_path, "rb") as f:
            text = f.read().decode("utf-8")
        state = text_format.Parse(text, _management.CheckpointState())
    except (UnicodeDecodeError, text_format.ParseError, tf.errors.OpError) as e:
        return f"the state file {state_path} does not parse ({one_line(e, 120)})"
    if not state.model_checkpoint_path:
        return f"the state file {state_path} names no checkpoint"
    latest = state.model_checkpoint_path
    if not os.path.isabs(latest):
        latest = os.path.join(directory, latest)
    if not tf.io.gfile.exists(latest + ".index"):
        return f"the state file {state_path} names {latest}, which does not exist"
    return None


def held_checkpoints(directory: str, name: str = "ckpt", keep: int | None = None) -> list[str]:
    """The checkpoints a manager of `directory` holds, oldest first: the state file's list when
    it is sound, else those found by their files (the newest `keep`), as
    `checkpoints.adopt_found_checkpoints` makes the chief's manager hold them."""
    if state_damage(directory, name) is None:
        state = tf.train.get_checkpoint_state(directory)
        return list(state.all_model_checkpoint_paths) if state else []
    found = scan(directory, name)
    return found[-keep:] if keep else found


def unreadable_reason(path: str) -> str | None:
    """Why the checkpoint at `path` cannot be read in full, or None if every tensor reads back.

    Reads every tensor once, so a truncated or overwritten data file (CRC mismatch) is found
    before anything is restored from it.
    """
    try:
        reader = files.checkpoint_reader(path)
        for key, dtype in reader.get_variable_to_dtype_map().items():
            if dtype != tf.variant:  # iterator state: not readable as NumPy
                reader.get_tensor(key)
    except (tf.errors.OpError, ValueError, OSError, IndexError) as e:  # IndexError: truncated
        return one_line(e, 300)
    return None
