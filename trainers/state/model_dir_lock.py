"""One run per model directory: a lock file held with `fcntl.flock`, and leftovers removed.

A run that writes checkpoints (`train`, `train_and_eval`) holds `<model_dir>/orbitask.lock` for
its whole life (`ExperimentRunner.build` takes it once the strategy says which process is the
chief; `run` releases it); the file names the holder (host, pid). A second such run on the same
directory stops with one line naming the holder (a `ConfigError`, exit 2). The kernel releases a
`flock` when its process dies, so the lock of a killed run (SIGKILL included) is taken over by the
next run. Only the chief of a multi-worker job takes the lock: its workers share the directory.
`eval` and `continuous_eval` only read checkpoints and take no lock, so they run beside training.

Holding the lock, the run removes what a killed save left: `ckpt-N_temp/` folders and the
`*.tmp<hex>` files of atomic writes, in the model directory and `best/`, and the `<name>_temp/`
folders of input positions under `input/ckpt-N/`.

The lock needs a local or NFS path; a directory on object storage (`gs://...`) is held by a
lease instead (`lease.Lease`: host, pid and a heartbeat in `<model_dir>/orbitask.lease`).
"""

from __future__ import annotations

import fcntl
import os
import re
import socket

import tensorflow as tf
from absl import logging

from orbitask.common import files
from orbitask.trainers.errors import ConfigError
from orbitask.trainers.state.lease import Lease

LOCK_FILE = "orbitask.lock"
_LEFTOVER = re.compile(r".+-\d+_temp|.+\.tmp[0-9a-f]{32}")
_INPUT_LEFTOVER = re.compile(r".+_temp|.+\.tmp[0-9a-f]{32}")  # input/ckpt-N/ holds saves only


class FileLock:
    """An exclusive, non-blocking `flock` on `path` (created if needed); `holder` describes
    whoever holds it. Released by `release`, or by the kernel when the process dies."""

    def __init__(self, path: str):
        self.path = path
        self.fd: int | None = None

    def acquire(self) -> bool:
        """Takes the lock and writes this host and pid into it; False when another holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"host {socket.gethostname()} pid {os.getpid()}\n".encode())
        self.fd = fd
        return True

    def holder(self) -> str:
        """`host H, pid P` as the holder wrote it (or "unknown")."""
        try:
            with open(self.path) as f:
                found = re.match(r"host (\S+) pid (\d+)", f.read())
        except OSError:
            found = None
        return f"host {found[1]}, pid {found[2]}" if found else "host and pid unknown"

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the only descriptor releases the flock
            self.fd = None


class ModelDirLock:
    """The lock of `model_dir` for one run: taken by `take`, released on leaving the `with`
    block (or by the kernel when the process dies)."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir
        self._lock: FileLock | Lease | None = None

    def take(self, writes_checkpoints: bool) -> None:
        """On the chief of a run that writes checkpoints (`writes_checkpoints`), takes the lock
        and removes the leftovers of killed saves; otherwise does nothing. Eager; returns None.

        Raises:
          ConfigError: when another process holds the lock (one line naming its host and pid).
        """
        if not writes_checkpoints:
            return
        if not files.is_local(self.model_dir):
            lease = Lease(self.model_dir)
            lease.take()
            self._lock = lease
            remove_leftovers(self.model_dir)
            return
        folder = self.model_dir.removeprefix("file://")
        lock = FileLock(os.path.join(folder, LOCK_FILE))
        if not lock.acquire():
            raise ConfigError(
                f"--model_dir {self.model_dir!r} is in use by another run ({lock.holder()}); "
                "wait for it to end or stop it, or pass another --model_dir."
            )
        self._lock = lock
        remove_leftovers(self.model_dir)

    def release(self) -> None:
        """Releases the lock if this run holds it. Eager; returns None."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> ModelDirLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def remove_leftovers(model_dir: str) -> None:
    """Removes the half-written files of killed saves: `ckpt-N_temp/` folders and `*.tmp<hex>`
    files, in `model_dir` and `model_dir/best`, and `*_temp/` folders in `model_dir/input/ckpt-N`
    (input positions). Eager; the caller holds the lock."""
    folders = [(model_dir, _LEFTOVER), (os.path.join(model_dir, "best"), _LEFTOVER)]
    inputs = os.path.join(model_dir, "input")
    for name in files.listdir(inputs):
        if re.fullmatch(r"ckpt-\d+", name):
            folders.append((os.path.join(inputs, name), _INPUT_LEFTOVER))
    for folder, pattern in folders:
        for name in files.listdir(folder):
            if not pattern.fullmatch(name):
                continue
            path = os.path.join(folder, name)
            logging.info("removing %s, left by a save that did not finish", path)
            if tf.io.gfile.isdir(path):
                tf.io.gfile.rmtree(path)
            else:
                tf.io.gfile.remove(path)
