"""The model directory's state: building the run's checkpoint, writing the operative gin config,
and restoring checkpoints safely (skip unreadable ones, explain incompatible ones, delete
nothing)."""

from __future__ import annotations

import errno
import os

import gin
import tensorflow as tf
from absl import logging

from orbitask.tasks.errors import one_line
from orbitask.trainers import compat
from orbitask.trainers.errors import ConfigError, NoSpaceError


def is_no_space(error: BaseException) -> bool:
    """Whether `error` says the device is full (ENOSPC, from TensorFlow or Python)."""
    return getattr(error, "errno", None) == errno.ENOSPC or "No space left on device" in str(error)


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
    except (tf.errors.OpError, ValueError, OSError) as e:
        return one_line(e, 300)
    return None


def restore_newest_readable(
    checkpoint: tf.train.Checkpoint, manager: tf.train.CheckpointManager
) -> str | None:
    """Restores the newest checkpoint that reads back in full; returns its path (None: none).

    An unreadable checkpoint is reported with a warning naming its files and is left in place.

    Raises:
      ConfigError: when checkpoints exist but none is readable, or when a readable one does not
        fit the model (names the variable and both shapes).
    """
    paths = list(reversed(manager.checkpoints))
    latest = manager.latest_checkpoint  # also one a plain `tf.train.Checkpoint.save` wrote
    if latest and latest not in paths:
        paths.insert(0, latest)
    for path in paths:
        reason = unreadable_reason(path)
        if reason:
            message = (
                f"checkpoint {path} (files {os.path.basename(path)}.index / .data-*) is "
                f"unreadable: {reason}. Trying the previous one; the file is left in place."
            )
            logging.warning(message)
            print(f"orbitask: warning: {message}", flush=True)
            continue
        restore(checkpoint, path)
        return path
    if paths:
        raise ConfigError(
            f"none of the {len(paths)} checkpoint(s) in {manager.directory} is readable; "
            "move that directory away (or use a new --model_dir) to start afresh."
        )
    return None


def restore(checkpoint: tf.train.Checkpoint, path: str) -> None:
    """Restores `path`, turning a shape mismatch into a one-line ConfigError."""
    try:
        checkpoint.restore(path)
    except (ValueError, tf.errors.InvalidArgumentError) as e:
        text = one_line(e)
        raise ConfigError(
            f"checkpoint {path} does not fit this model: {text} Use a new --model_dir, or "
            "warm-start from it with init_checkpoint."
        ) from e


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
    manager = SafeCheckpointManager(checkpoint, manager.directory, **kept)
    return checkpoint, manager


def write_operative_config(model_dir: str) -> None:
    """Writes gin's operative config (what this run actually used) into `model_dir`. Eager;
    returns None."""
    text = gin.operative_config_str()
    if text.strip():
        with tf.io.gfile.GFile(os.path.join(model_dir, "operative_config.gin"), "w") as f:
            f.write(text)
