"""The run's checkpoint and its manager: building them and saving safely on a full device (the
operative gin config is `trainers.state.settings_record`).

- A damaged state file (`checkpoint`: unreadable, empty, garbled, missing, or naming a checkpoint
  that is not there) is named in a warning, and the manager holds the checkpoints found by their
  files (`ckpt-<N>.index`, `trainers.state.checkpoint_files`). A run starts afresh over
  existing checkpoint files only when none of them finished saving (the state file names none
  and none reads back: `trainers.state.checkpoint_restore`).
- A save that finds the device full removes its half-written files, keeps the previous
  checkpoint, and stops with one line (`SafeCheckpointManager`).
- A non-chief worker's manager restores the chief's checkpoints and saves into a temporary
  folder (`for_this_worker`, `WorkerCheckpointManager`): under `multi_worker_mirrored` every
  worker saves (reading a SyncOnRead variable is a collective), but only the chief's checkpoints,
  in the model directory, count (`trainers.distribution.cluster`).

Restoring the newest readable checkpoint, completely or not at all, is
`trainers.state.checkpoint_restore`.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import hashlib
import os
import re
import shutil
import tempfile
import time

import tensorflow as tf
from absl import logging
from tensorflow.python.checkpoint import checkpoint_management as _management

from orbitask.common import files
from orbitask.trainers import compat
from orbitask.trainers.distribution.cluster import is_chief, tf_config
from orbitask.trainers.errors import ConfigError, NoSpaceError
from orbitask.trainers.state import checkpoint_files, model_dir_lock
from orbitask.trainers.state.checkpoint_files import scan, state_damage
from orbitask.trainers.state.full_disk import is_no_space


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
        files.flush_appends()  # on object storage, the logs up to this checkpoint: one segment
        files.before_rewrite(f"{prefix}.index")  # the same step saved again (its evaluation)
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
            f"files were removed and the previous checkpoint ({before}) is intact. Free space "
            "(or lower run_experiment.max_to_keep), then rerun the same command to resume."
        ) from None


def _warn(message: str) -> None:
    logging.warning(message)
    print(f"orbitask: warning: {message}", flush=True)


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


def build(
    *,
    task,
    model_dir: str,
    global_step,
    lr,
    optimizer,
    model,
    loss_fn,
    train_input,
    stateful_callbacks: dict,
    extra_state: dict,
    asynchronous: bool = False,
    max_to_keep: int | None = None,
):
    """Returns the task's checkpoint (plus the input position `train_input`, the state of
    stateful callbacks and `extra_state`) and a manager for it, keeping `max_to_keep`
    checkpoints (None: as many as the task's manager keeps). Eager, in the strategy's scope.
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
    # Re-made without an interval: `trainers.run.controller.Controller` decides when to save (its
    # schedule's "checkpoint" entry), and a manager with an interval silently refuses a second
    # save at the same step (needed after an evaluation changed checkpointed state, or SIGTERM).
    kept = compat.manager_settings(manager)
    del kept["step_counter"]
    if max_to_keep is not None:
        kept["max_to_keep"] = max_to_keep
    with _tolerant_state_reads():
        manager = SafeCheckpointManager(checkpoint, manager.directory, **kept)
    adopt_found_checkpoints(manager)
    return checkpoint, manager


def for_this_worker(
    manager: tf.train.CheckpointManager, strategy: tf.distribute.Strategy
) -> tf.train.CheckpointManager:
    """`manager` on the chief; on any other worker, a `WorkerCheckpointManager` like it."""
    if is_chief(strategy):
        return manager
    task = tf_config().get("task", {})
    settings = compat.manager_settings(manager)
    return WorkerCheckpointManager(
        manager.checkpoint,
        manager.directory,
        worker=f"{task.get('type', 'worker')}-{task.get('index', 0)}",
        chief_keep=settings["max_to_keep"],
        checkpoint_name=settings["checkpoint_name"],
        step_counter=settings["step_counter"],
        checkpoint_interval=manager.checkpoint_interval,
    )


class WorkerCheckpointManager(SafeCheckpointManager):
    """A non-chief worker's manager: restores the chief's checkpoints, saves into a temp folder.

    `directory` and `checkpoints` are the chief's (what restores and continuous evaluation
    read); `save` writes into a temporary folder keeping one checkpoint, deleted at exit. The
    folder is made by `tempfile.mkdtemp` (an unpredictable name, mode 0700) with a prefix from
    the chief's directory and `worker`, and this worker holds a `flock` on a file in it; a start
    removes this user's folders of the same prefix whose lock nobody holds, so a worker killed
    with SIGKILL (no exit handlers) leaves at most one checkpoint behind, removed when it
    restarts;
    `latest_checkpoint` is this worker's last save, or the chief's latest when it started, so
    that every worker sees the same step and takes the same decision to save or not (saves may
    be collectives). The chief's checkpoints are read as the chief's manager holds them: from
    its state file, or by their files when the state file is damaged
    (`checkpoint_files.held_checkpoints`), so every worker restores the same step.

    Args:
      checkpoint: this worker's `tf.train.Checkpoint`.
      chief_directory: the model directory the chief saves into.
      worker: this worker's name in the cluster (e.g. "worker-1").
      chief_keep: the chief's `max_to_keep` (None: all).
      **kwargs: passed to `tf.train.CheckpointManager` (step_counter, checkpoint_interval).
    """

    def __init__(
        self,
        checkpoint: tf.train.Checkpoint,
        chief_directory: str,
        worker: str = "worker",
        chief_keep: int | None = None,
        **kwargs,
    ):
        self.chief_directory = chief_directory
        self._chief_name = kwargs.get("checkpoint_name", "ckpt")
        self._chief_keep = chief_keep
        run = hashlib.sha1(os.path.abspath(chief_directory).encode()).hexdigest()[:12]
        prefix = f"orbitask-{run}-{_safe_name(worker)}-"
        _remove_abandoned(prefix)  # a killed predecessor's
        self.temp_directory = tempfile.mkdtemp(prefix=prefix)
        self._lock = model_dir_lock.FileLock(os.path.join(self.temp_directory, "worker.lock"))
        self._lock.acquire()
        atexit.register(shutil.rmtree, self.temp_directory, True)
        held = self.checkpoints
        self._chief_latest = held[-1] if held else None
        super().__init__(checkpoint, self.temp_directory, max_to_keep=1, **kwargs)
        logging.info("non-chief worker: saving into %s", self.temp_directory)

    @property
    def directory(self) -> str:
        """The chief's model directory."""
        return self.chief_directory

    @property
    def checkpoints(self) -> list[str]:
        """The chief's checkpoints, oldest first."""
        return checkpoint_files.held_checkpoints(
            self.chief_directory, self._chief_name, self._chief_keep
        )

    @property
    def latest_checkpoint(self) -> str | None:
        """This worker's last save, else the chief's latest checkpoint when this worker started."""
        return super().latest_checkpoint or self._chief_latest


def _remove_abandoned(prefix: str) -> None:
    """Removes this user's temp folders named `prefix...` whose worker lock nobody holds."""
    root = tempfile.gettempdir()
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if not name.startswith(prefix) or os.path.islink(path) or not os.path.isdir(path):
            continue
        if os.lstat(path).st_uid != os.getuid():
            continue
        lock = model_dir_lock.FileLock(os.path.join(path, "worker.lock"))
        try:
            if not lock.acquire():
                continue  # a live worker's
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        lock.release()


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)
