"""A full disk outside a checkpoint save: one line naming the full path, no half-written file.

Checkpoint saves handle their own full disk (`checkpoints.SafeCheckpointManager`). Every other
write of a run (summaries, also on their background thread, the operative config, a SavedModel)
that finds the device full ends the run through `no_space_error`: the runner first saves a
checkpoint of the current step where the checkpoint's device has room, so no training is lost.
"""

from __future__ import annotations

import errno
import re

import tensorflow as tf

from orbitask.common import files
from orbitask.trainers.errors import NoSpaceError

# TensorFlow names the file before the reason: "<path>; No space left on device".
_NAMED = re.compile(r"(\S+?)[;:,]? No space left on device")


def is_no_space(error: BaseException) -> bool:
    """Whether `error` says the device is full (ENOSPC, from TensorFlow or Python)."""
    return getattr(error, "errno", None) == errno.ENOSPC or "No space left on device" in str(error)


def is_unhandled(error: BaseException) -> bool:
    """Whether `error` says the device is full and is not yet the run's one-line error."""
    return not isinstance(error, NoSpaceError) and is_no_space(error)


def full_path(error: BaseException, default: str) -> str:
    """The path `error` names as the one it could not write, else `default`."""
    filename = getattr(error, "filename", None)
    if filename:
        return str(filename)
    found = _NAMED.search(str(error))
    return found.group(1) if found else default


def no_space_error(error: BaseException, default: str, kept: str) -> NoSpaceError:
    """The one-line error of a run stopped by a full disk (`error`), naming the path that is
    full (`default` when `error` names none) and, in `kept`, what became of the training."""
    return NoSpaceError(
        f"no space left on the device to write {full_path(error, default)}; {kept}. Free space, "
        "then rerun the same command."
    )


def write_text(path: str, text: str) -> None:
    """Writes `text` to `path` whole (`files.write_text`: locally under a temporary name renamed
    into place), before training starts (the operative config). Eager; returns None.

    Raises:
      NoSpaceError: when the device is full (the temporary file is removed).
    """
    try:
        files.write_text(path, text)  # the temporary file is removed on failure
    except (tf.errors.OpError, OSError) as e:
        if is_no_space(e):
            raise NoSpaceError(
                f"no space left on the device to write {path}; training had not started. Free "
                "space, then rerun the same command."
            ) from None
        raise
