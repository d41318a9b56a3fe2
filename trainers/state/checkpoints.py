"""The model directory's state: building the run's checkpoint, writing the operative gin config,
and restoring checkpoints safely (skip unreadable ones, explain incompatible ones, delete
nothing).

- A damaged state file (`checkpoint`: unreadable, empty, garbled, missing, or naming a checkpoint
  that is not there) is named in a warning, and the checkpoints are found by their files
  (`ckpt-<N>.index`); a run never starts afresh over existing checkpoints.
- The newest checkpoint that reads back in full is restored; newer unreadable ones are left in
  place, and the manager's latest becomes the restored one, so the step of a corrupt one is
  saved again when it is trained again (replacing it).
- A restore binds every variable of the run (model, optimizer, run state) or stops with one line
  naming what is missing or extra. Run state that a checkpoint lacks entirely (written by an older
  orbitask or another setting, e.g. `random_state`, `evaluated_step`) is named in a warning and
  keeps its current value. A checkpoint written by Model Garden's trainer (`global_step`, `model`,
  `optimizer`; a `ModelGardenTask`'s checkpoint holds the same objects under those names too)
  restores the model, optimizer and step, and says in one warning what keeps its current value.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import time

import gin
import tensorflow as tf
from absl import logging
from google.protobuf import text_format
from tensorflow.python.checkpoint import checkpoint as _checkpoint_lib
from tensorflow.python.checkpoint import checkpoint_management as _management
from tensorflow.python.checkpoint import graph_view as _graph_view
from tensorflow.python.util import object_identity

from orbitask.tasks.errors import one_line
from orbitask.trainers import compat
from orbitask.trainers.errors import ConfigError, NoSpaceError
from orbitask.trainers.state import input_position
from orbitask.trainers.state.full_disk import is_no_space, write_text


def remove_partial_save(prefix: str, keep: list[str]) -> None:
    """Removes what a failed save of checkpoint `prefix` left (its `_temp` folder; its files
    unless `prefix` is one of the intact checkpoints `keep`). Eager; returns None."""
    for path in tf.io.gfile.glob(prefix + "_temp*"):
        if tf.io.gfile.isdir(path):
            tf.io.gfile.rmtree(path)
        else:
            tf.io.gfile.remove(path)
    if prefix not in keep:
        for path in tf.io.gfile.glob(prefix + ".*"):
            tf.io.gfile.remove(path)


class SafeCheckpointManager(tf.train.CheckpointManager):
    """`tf.train.CheckpointManager` whose `save` on a full device removes the half-written
    checkpoint, keeps the previous one, and raises `NoSpaceError` (one line naming the path).

    An async save (`options=CheckpointOptions(enable_async=True)`) is written by a background
    thread; the next `save` or `sync` waits for it and raises its error the same way. Every
    save waits for the one before it, so saves never overlap.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._writing: str | None = None  # the prefix a background thread is writing

    def save(self, checkpoint_number=None, check_interval=True, options=None):
        """Saves like `tf.train.CheckpointManager.save`. Eager; returns the path (or None).

        Raises:
          NoSpaceError: when the device holding the checkpoint (this one, or the async one
            before it) is full.
        """
        self.sync()
        number = checkpoint_number
        if number is None:
            number = int(self.checkpoint.save_counter.numpy()) + 1
        prefix = f"{compat.checkpoint_prefix(self)}-{int(number)}"
        try:
            path = super().save(checkpoint_number, check_interval, options)
        except (tf.errors.OpError, OSError) as e:
            self._raise_no_space(e, prefix)
            raise
        if path is not None and options is not None and options.enable_async:
            self._writing = prefix
        return path

    def sync(self) -> None:
        """Waits for the async save under way, if any. Eager; returns None.

        Raises:
          NoSpaceError: when that save found the device full (its files are removed).
        """
        super().sync()
        prefix, self._writing = self._writing, None
        error = compat.take_async_error(self.checkpoint)
        if error is not None:
            self._raise_no_space(error, prefix)
            raise error

    def sync_after_error(self) -> None:
        """Waits for the async save under way while an error (or SIGTERM's exit) is on its way
        out; a failure of that write is logged, not raised over it. Eager; returns None."""
        try:
            self.sync()
        except Exception as e:
            logging.error("the async checkpoint write failed too: %s", e)

    def _raise_no_space(self, error: BaseException, prefix: str | None) -> None:
        """Raises `NoSpaceError` for `prefix` after removing its files, if `error` says the
        device is full; else returns."""
        if not is_no_space(error) or prefix is None:
            return
        intact = list(self.checkpoints)
        remove_partial_save(prefix, intact)
        before = intact[-1] if intact else "none"
        raise NoSpaceError(
            f"no space left on the device to write checkpoint {prefix}; the half-written "
            f"files were removed and the previous checkpoint ({before}) is intact. Free "
            "space (or lower Task.max_to_keep), then rerun the same command to resume."
        ) from None


def unreadable_reason(path: str) -> str | None:
    """Why the checkpoint at `path` cannot be read in full, or None if every tensor reads back.

    Reads every tensor once, so a truncated or overwritten data file (CRC mismatch) is found
    before anything is restored from it.
    """
    try:
        reader = tf.train.load_checkpoint(path)
        for key, dtype in reader.get_variable_to_dtype_map().items():
            if dtype != tf.variant:  # iterator state: not readable as NumPy
                reader.get_tensor(key)
    except (tf.errors.OpError, ValueError, OSError, IndexError) as e:  # IndexError: truncated
        return one_line(e, 300)
    return None


def _warn(message: str) -> None:
    logging.warning(message)
    print(f"orbitask: warning: {message}", flush=True)


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
    `adopt_found_checkpoints` makes the chief's manager hold them."""
    if state_damage(directory, name) is None:
        state = tf.train.get_checkpoint_state(directory)
        return list(state.all_model_checkpoint_paths) if state else []
    found = scan(directory, name)
    return found[-keep:] if keep else found


@contextlib.contextmanager
def _tolerant_state_reads():
    """Within: `tf.train.CheckpointManager` reads a state file that does not parse as none
    (TensorFlow raises for random bytes or an empty file) instead of failing."""
    original = _management.get_checkpoint_state

    def tolerant(checkpoint_dir, latest_filename=None):
        try:
            return original(checkpoint_dir, latest_filename)
        except (ValueError, tf.errors.OpError):  # UnicodeDecodeError is a ValueError
            return None

    _management.get_checkpoint_state = tolerant
    try:
        yield
    finally:
        _management.get_checkpoint_state = original


def adopt_found_checkpoints(manager: tf.train.CheckpointManager) -> None:
    """When the state file of `manager`'s directory is damaged: warns naming the damage and
    makes `manager` hold the checkpoints found by their files (the newest `max_to_keep`; older
    ones are left out of its keeping, so it never deletes them). Eager; returns None.

    Raises:
      ConfigError: when the state file is damaged and no checkpoint file is there.
    """
    name = compat.manager_settings(manager)["checkpoint_name"]
    damage = state_damage(manager.directory, name)
    if damage is None:
        return
    found = scan(manager.directory, name)
    if not found:
        raise ConfigError(
            f"{damage}, and {manager.directory} holds no {name}-<N>.index checkpoint; move that "
            "directory away (or use a new --model_dir) to start afresh."
        )
    keep = manager._max_to_keep  # noqa: SLF001
    if keep:
        found = found[-keep:]
    _warn(
        f"{damage}; going by the checkpoint files instead: {len(found)} found, newest "
        f"{os.path.basename(found[-1])}. The next save rewrites the state file."
    )
    now = time.time()
    manager._maybe_delete = collections.OrderedDict((p, now) for p in found)  # noqa: SLF001
    manager._latest_checkpoint = found[-1]  # noqa: SLF001


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
    if paths:
        raise ConfigError(
            f"none of the {len(paths)} checkpoint(s) in {manager.directory} is readable; "
            "move that directory away (or use a new --model_dir) to start afresh."
        )
    return None


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
    proto = coordinator.object_graph_proto
    in_file = {ref.local_name for ref in proto.nodes[0].children}
    model_garden = written_by_model_garden(in_file)
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
    printer = _checkpoint_lib.ObjectGraphProtoPrettyPrinter(proto)
    optimizer = getattr(checkpoint, "optimizer", None)
    checked = [f"(root).{name}." for name in _model_children(checkpoint)]
    if getattr(optimizer, "built", False) is True:  # Keras 3: built eagerly, no deferred slots
        checked.append("(root).optimizer.")
    extra = [
        printer.node_names[i].replace("(root).", "").replace(".", "/")
        for i, node in enumerate(proto.nodes)
        if node.attributes
        and i not in coordinator.object_by_proto_id
        and printer.node_names[i].startswith(tuple(checked))
    ]
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


def build(
    task,
    model_dir,
    global_step,
    lr,
    optimizer,
    model,
    loss_fn,
    train_input,
    stateful_callbacks,
    extra_state,
    asynchronous=False,
):
    """Returns the task's checkpoint (plus the input position `train_input`, the state of
    stateful callbacks and `extra_state`) and a manager for it. Eager, in the strategy's scope.
    With `asynchronous`, async saves of the checkpoint write all of it (`compat`)."""
    trackables = dict(step=global_step, lr=lr, optimizer=optimizer, train_model=model)
    trackables["train_loss"] = loss_fn
    with _tolerant_state_reads():
        checkpoint, manager = task.build_checkpoint(model_dir, **trackables)
    if train_input is not None:
        checkpoint.input_position = train_input
    if stateful_callbacks:
        checkpoint.callbacks = tf.train.Checkpoint(**stateful_callbacks)
    for name, value in extra_state.items():
        setattr(checkpoint, name, value)
    if asynchronous:
        compat.enable_async_writes(checkpoint)
    # Re-made without an interval: `trainers.Controller` decides when to save (at multiples of
    # the interval), and a manager with an interval silently refuses a second save at the same
    # step (needed after an evaluation changed checkpointed state, or on SIGTERM).
    kept = compat.manager_settings(manager)
    del kept["step_counter"]
    with _tolerant_state_reads():
        manager = SafeCheckpointManager(checkpoint, manager.directory, **kept)
    adopt_found_checkpoints(manager)
    return checkpoint, manager


def write_operative_config(model_dir: str) -> None:
    """Writes gin's operative config (what this run actually used) into `model_dir`, whole or
    not at all. Eager; returns None.

    Raises:
      NoSpaceError: when the device is full.
    """
    text = gin.operative_config_str()
    if text.strip():
        write_text(os.path.join(model_dir, "operative_config.gin"), text)
