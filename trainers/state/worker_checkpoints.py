"""A non-chief worker's checkpoints: it restores the chief's and saves into a temporary folder.

Under `multi_worker_mirrored` every worker saves (reading a SyncOnRead variable is a collective),
but only the chief's checkpoints, in the model directory, count (`trainers.distribution.cluster`).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import shutil
import tempfile

import tensorflow as tf
from absl import logging

from orbitask.trainers import compat
from orbitask.trainers.distribution.cluster import is_chief, tf_config
from orbitask.trainers.state import checkpoint_files, checkpoints, model_dir_lock


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


class WorkerCheckpointManager(checkpoints.SafeCheckpointManager):
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
