"""Restoring the run's checkpoint: the newest one that reads back in full, binding every
variable of the run or stopping with one line that says what does not fit.

- The newest checkpoint that reads back in full is restored; newer unreadable ones are left in
  place, and the manager's latest becomes the restored one, so the step of a corrupt one is
  saved again when it is trained again (replacing it).
- When none reads back and the state file names none of them (it is written after a checkpoint's
  files are whole), they are saves cut short: the run starts afresh, saying so. Otherwise a
  directory of unreadable checkpoints is refused in one line.
- A restore binds every variable of the run (model, optimizer, run state) or stops with one line
  naming what is missing or extra. Run state that a checkpoint lacks entirely (written by an older
  orbitask or another setting, e.g. `random_state`, `evaluated_step`) is named in a warning and
  keeps its current value. A checkpoint written by Model Garden's trainer (`global_step`, `model`,
  `optimizer`; a `ModelGardenTask`'s checkpoint holds the same objects under those names too)
  restores the model, optimizer and step, and says in one warning what keeps its current value.
"""

from __future__ import annotations

import contextlib
import os

import tensorflow as tf
from absl import logging
from tensorflow.python.checkpoint import checkpoint as _checkpoint_lib
from tensorflow.python.checkpoint import graph_view as _graph_view
from tensorflow.python.util import object_identity

from orbitask.common.errors import one_line
from orbitask.trainers.errors import ConfigError
from orbitask.trainers.state import input_position
from orbitask.trainers.state.checkpoint_files import unreadable_reason


def _warn(message: str) -> None:
    logging.warning(message)
    print(f"orbitask: warning: {message}", flush=True)


def restore_newest_readable(
    checkpoint: tf.train.Checkpoint, manager: tf.train.CheckpointManager
) -> str | None:
    """Restores the newest checkpoint that reads back in full, its input position included;
    returns its path (None: none).

    An unreadable checkpoint, or one whose saved input position is there but unreadable, is
    reported with a warning naming its files and is left in place. When only checkpoints with
    unreadable input positions remain, the newest is restored and its input restarts from its
    beginning (saying so).

    Raises:
      ConfigError: when checkpoints exist but none is readable, or when a readable one does not
        fit the model (names the variable and both shapes).
    """
    paths = list(reversed(manager.checkpoints))
    latest = manager.latest_checkpoint  # also one a plain `tf.train.Checkpoint.save` wrote
    if latest and latest not in paths:
        paths.insert(0, latest)
    position = getattr(checkpoint, "input_position", None)
    strict = getattr(position, "strict_reads", contextlib.nullcontext)
    position_only = []
    for path in paths:
        newer = _rotated_away(path, manager.directory, paths)
        if newer is not None:  # a training run beside this one deleted it and saved `newer`
            paths.insert(paths.index(path) + 1, newer)
            continue
        reason = unreadable_reason(path)
        if reason is None:
            try:
                with strict():
                    restore(checkpoint, path)
            except input_position.UnreadablePosition as e:
                reason = f"its input position {e}"
                position_only.append(path)
            else:
                _go_on_from(manager, path, paths)
                return path
        _warn(
            f"checkpoint {path} (files {os.path.basename(path)}.index / .data-*) is "
            f"unreadable: {reason}. Trying the previous one; the file is left in place "
            "until its step is saved again."
        )
    if position_only:  # the newest whose model and optimizer read back; the input restarts
        path = position_only[0]
        restore(checkpoint, path)
        _go_on_from(manager, path, paths)
        return path
    if paths and not _recorded(manager.directory, paths):
        _start_afresh(manager, paths)
        return None
    if paths:
        raise ConfigError(
            f"none of the {len(paths)} checkpoint(s) in {manager.directory} is readable; "
            "move that directory away (or use a new --model_dir) to start afresh."
        )
    return None


def _start_afresh(manager: tf.train.CheckpointManager, paths: list[str]) -> None:
    """Forgets the unreadable `paths` that the state file does not name, saying so.

    TensorFlow writes the state file only after a checkpoint's files are whole, so unreadable
    checkpoints that it does not name are saves cut short (a kill -9 while the first one was
    written): there is nothing to resume, and nothing good to lose."""
    _warn(
        f"no checkpoint in {manager.directory} finished saving (the state file names none "
        "of them): a save was cut short; starting afresh, the files are replaced as their "
        "steps are saved again."
    )
    for bad in paths:
        manager._maybe_delete.pop(bad, None)  # noqa: SLF001
    manager._latest_checkpoint = None  # noqa: SLF001


def _recorded(directory: str, paths: list[str]) -> list[str]:
    """Those of `paths` that the state file of `directory` names (none when it is missing or
    does not parse)."""
    try:
        state = tf.train.get_checkpoint_state(directory)
    except (ValueError, tf.errors.OpError):
        return []
    if state is None:
        return []
    named = {os.path.basename(p) for p in state.all_model_checkpoint_paths}
    named.add(os.path.basename(state.model_checkpoint_path))
    return [p for p in paths if os.path.basename(p) in named]


# How many checkpoints an evaluation follows while a training run's rotation deletes them under
# it, before it gives up on that directory.
MOST_FOLLOWED = 1000


def _rotated_away(path: str, directory: str, tried: list[str]) -> str | None:
    """The newest checkpoint of `directory` when `path`'s files are gone and it is one not in
    `tried` (a training run's rotation deleted `path` after it was listed; at most
    `MOST_FOLLOWED` of them), else None."""
    if tf.io.gfile.exists(f"{path}.index") or len(tried) > MOST_FOLLOWED:
        return None
    newest = tf.train.latest_checkpoint(directory)
    return newest if newest and newest not in tried else None


def _go_on_from(manager: tf.train.CheckpointManager, path: str, paths: list[str]) -> None:
    """After restoring `path`: the newer checkpoints of `paths` (newest first) leave the
    manager's keeping and `path` becomes its latest, so the next saves go on from here and
    replace a corrupt one at its step."""
    newer = paths[: paths.index(path)]
    if not newer:
        return
    kept = manager._maybe_delete  # noqa: SLF001
    for bad in newer:
        kept.pop(bad, None)
    manager._latest_checkpoint = path  # noqa: SLF001


# The checkpoint's children that every restore must bind in full; any other child is run state.
CORE = ("step", "lr", "optimizer", "train_model", "train_loss")
# Those that a checkpoint of Model Garden's trainer (`official.core.base_trainer.Trainer`) holds,
# the step and the model under its names `global_step` and `model`.
MODEL_GARDEN_CORE = ("step", "optimizer", "train_model")


def written_by_model_garden(top_level: set[str]) -> bool:
    """Whether a checkpoint whose top-level names are `top_level` was written by Model Garden's
    trainer: `global_step` and `model`, without orbitask's `train_model`."""
    return "train_model" not in top_level and {"global_step", "model"} <= top_level


def restore(checkpoint: tf.train.Checkpoint, path: str) -> None:
    """Restores `path` into every variable of `checkpoint` (`require_complete`), turning a
    shape mismatch or a partial restore into a one-line ConfigError."""
    try:
        status = checkpoint.restore(path)
    except (ValueError, tf.errors.InvalidArgumentError) as e:
        text = one_line(e)
        raise ConfigError(
            f"checkpoint {path} does not fit this model: {text} Use a new --model_dir, or "
            "warm-start from it with init_checkpoint."
        ) from e
    require_complete(checkpoint, status, path)
    # The model and run state are bound: what stays pending (the slots of an optimizer that an
    # evaluation never builds, restored when built) is no cause for TensorFlow's warnings.
    status.expect_partial()


def _variables_by_path(checkpoint: tf.train.Checkpoint) -> dict[str, object]:
    """Every object holding saved values under `checkpoint`, by its path from a top-level child
    (the model's own path preferred over the optimizer's reference to the same variable)."""
    children = dict(checkpoint._trackable_children())  # noqa: SLF001
    order = sorted(children, key=lambda n: (n != "train_model", n not in CORE, n))
    named = object_identity.ObjectIdentityDictionary()
    for child in order:
        objects, paths = _graph_view.ObjectGraphView(children[child]).breadth_first_traversal()
        for obj in _checkpoint_lib._objects_with_attributes(objects):  # noqa: SLF001
            if obj not in named:
                named[obj] = "/".join([child, *(ref.name for ref in paths[obj])])
    return {name: obj for obj, name in named.items()}


def _model_children(checkpoint: tf.train.Checkpoint) -> list[str]:
    """The top-level names of `checkpoint` that hold the model or a part of it: `train_model`
    and its aliases (a `ModelGardenTask`'s `model`, `encoder`, ...)."""
    children = dict(checkpoint._trackable_children())  # noqa: SLF001
    model = children.get("train_model")
    if model is None:
        return []
    parts, _ = _graph_view.ObjectGraphView(model).breadth_first_traversal()
    parts = object_identity.ObjectIdentitySet(parts)
    return [
        n for n, obj in children.items() if n == "train_model" or (n not in CORE and obj in parts)
    ]


def _names(paths: list[str], limit: int = 4) -> str:
    more = f" and {len(paths) - limit} more" if len(paths) > limit else ""
    return ", ".join(paths[:limit]) + more


def require_complete(checkpoint: tf.train.Checkpoint, status, path: str) -> None:
    """Checks that the restore of `path` (`status`) bound every variable of `checkpoint`, and
    that `path` holds nothing for the model that the model lacks. Eager; returns None.

    Run state that `path` lacks entirely (a top-level child other than `CORE`) is named in a
    warning. Optimizer slots not created yet are restored when created (TensorFlow defers them).

    Raises:
      ConfigError: naming the missing or extra variables and `path`.
    """
    coordinator = status._checkpoint  # noqa: SLF001
    in_file = {ref.local_name for ref in coordinator.object_graph_proto.nodes[0].children}
    model_garden = written_by_model_garden(in_file)
    missing, absent_state = _unbound(checkpoint, coordinator, in_file, model_garden)
    extra = _extra(checkpoint, coordinator)
    if missing or extra:
        status.expect_partial()
        parts = []
        if missing:
            parts.append(
                f"{len(missing)} variable(s) of this run are not in it ({_names(missing)})"
            )
        if extra:
            parts.append(f"it holds {len(extra)} this run does not have ({_names(extra)})")
        raise ConfigError(
            f"checkpoint {path} does not restore this run completely: {'; '.join(parts)}. "
            "It was written by another model or program. Use a new --model_dir, or warm-start "
            "part of it with init_checkpoint."
        )
    if model_garden:
        _warn_model_garden(path, sorted(absent_state))
        return
    for child, names in absent_state.items():
        _warn(
            f"checkpoint {path} has no {child!r} (written by an older orbitask or another "
            f"setting): {_names(names)} keep their current values."
        )


def _unbound(
    checkpoint: tf.train.Checkpoint, coordinator, in_file: set[str], model_garden: bool
) -> tuple[list[str], dict[str, list[str]]]:
    """The variables of `checkpoint` that the restore (`coordinator`) left unbound: `(missing,
    absent_state)`, the second the run state a checkpoint with top-level names `in_file` lacks
    entirely, by top-level child."""
    core = MODEL_GARDEN_CORE if model_garden else CORE
    matched = object_identity.ObjectIdentitySet(coordinator.object_by_proto_id.values())
    missing, absent_state = [], {}
    for name, obj in _variables_by_path(checkpoint).items():
        if obj in matched or name == "save_counter":  # the Checkpoint's own count of saves
            continue
        child = name.split("/", 1)[0]
        if child not in core and child not in in_file:
            absent_state.setdefault(child, []).append(name)
        else:
            missing.append(name)
    return missing, absent_state


def _extra(checkpoint: tf.train.Checkpoint, coordinator) -> list[str]:
    """The paths of the values the restored file (`coordinator`) holds for the model (and a
    built Keras 3 optimizer) that `checkpoint` has nothing for."""
    proto = coordinator.object_graph_proto
    printer = _checkpoint_lib.ObjectGraphProtoPrettyPrinter(proto)
    optimizer = getattr(checkpoint, "optimizer", None)
    checked = [f"(root).{name}." for name in _model_children(checkpoint)]
    if getattr(optimizer, "built", False) is True:  # Keras 3: built eagerly, no deferred slots
        checked.append("(root).optimizer.")
    return [
        printer.node_names[i].replace("(root).", "").replace(".", "/")
        for i, node in enumerate(proto.nodes)
        if node.attributes
        and i not in coordinator.object_by_proto_id
        and printer.node_names[i].startswith(tuple(checked))
    ]


def _warn_model_garden(path: str, absent: list[str]) -> None:
    """Says what a restore of Model Garden's checkpoint `path` left at its current value."""
    kept = f"; {', '.join(absent)} keep their current values" if absent else ""
    restarts = (
        ", so the training input starts from its beginning" if "input_position" in absent else ""
    )
    _warn(
        f"checkpoint {path} was written by Model Garden's trainer: restored its model, "
        f"optimizer and global step{kept}{restarts}."
    )
