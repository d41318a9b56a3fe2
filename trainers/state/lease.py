"""One run per model directory on object storage (`gs://...`), where no `flock` reaches: a lease.

The chief of a run that writes checkpoints writes `<model_dir>/orbitask.lease`, a JSON object
naming its host and process id with a heartbeat time, and renews the heartbeat from a background
thread (every quarter of the staleness) until the run ends and removes it. A second run that
finds a lease renewed within `stale_minutes` (`orbitask.Lease.stale_minutes`, default 10) stops
in one line naming the holder; one that finds an older lease (a run killed with no chance to
remove it) takes it over and says so in one line.

What a lease promises: a run started while another one's heartbeat is fresh is refused, and a
directory whose run died is free again after `stale_minutes`. What it cannot promise: object
storage here has no atomic create, so two runs that start within the same second may both find
no lease and both write one; each reads the lease back after writing it and the one that finds
the other's stops, but a write landing between one's write and its read-back is not seen. Clocks
of the hosts are compared: keep them in sync (NTP) and `stale_minutes` well above their drift
and above the longest pause of a run (a heartbeat missed for longer lets another run in).
"""

from __future__ import annotations

import os
import socket
import threading
import time

import gin

from orbitask.common import files
from orbitask.trainers.errors import ConfigError

LEASE_FILE = "orbitask.lease"


@gin.configurable("Lease", module="orbitask")
class Lease:
    """The lease of `model_dir` (module docstring). Eager; the chief of a training run.

    Args:
      model_dir: the run's model directory (on object storage).
      stale_minutes: a lease whose heartbeat is older than this is a dead run's, taken over.
    """

    def __init__(self, model_dir: str, stale_minutes: float = 10.0):
        if not isinstance(stale_minutes, (int, float)) or not stale_minutes > 0:
            raise ConfigError(
                f"orbitask.Lease.stale_minutes must be a positive number of minutes; received "
                f"{stale_minutes!r}. Set it in your experiment's .gin file or with --gin_params."
            )
        self.model_dir, self.stale_minutes = model_dir, float(stale_minutes)
        self.path = f"{model_dir.rstrip('/')}/{LEASE_FILE}"
        self.me = {"host": socket.gethostname(), "pid": os.getpid()}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self) -> None:
        """Takes the lease (a stale one is taken over with a line) and starts its heartbeat.

        Raises:
          ConfigError: when another run's lease is fresh (one line naming its host and pid).
        """
        found = self._holder()
        if found is not None:
            age = time.time() - float(found.get("heartbeat", 0))
            if age < self.stale_minutes * 60:
                raise self._in_use(found, age)
            print(
                f"orbitask: --model_dir {self.model_dir}: taking over the lease of "
                f"{_who(found)}, not renewed for {age / 60:.1f} minutes (a run that died)",
                flush=True,
            )
        self._renew()
        found = self._holder()  # no atomic create: another run may have written at once
        if found is not None:
            raise self._in_use(found, time.time() - float(found.get("heartbeat", 0)))
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="orbitask-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stops the heartbeat and removes the lease if it is still this run's. Eager."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        if self._holder() is None and files.read_json(self.path) is not None:
            files.remove(self.path)

    def _holder(self) -> dict | None:
        """The lease's content when another process holds it; None when free or this one's."""
        found = files.read_json(self.path)
        if not isinstance(found, dict):
            return None
        mine = found.get("host") == self.me["host"] and found.get("pid") == self.me["pid"]
        return None if mine else found

    def _renew(self) -> None:
        files.write_json(self.path, {**self.me, "heartbeat": time.time()})

    def _beat(self) -> None:
        while not self._stop.wait(self.stale_minutes * 60 / 4):
            self._renew()

    def _in_use(self, found: dict, age: float) -> ConfigError:
        return ConfigError(
            f"--model_dir {self.model_dir!r} is in use by another run ({_who(found)}, lease "
            f"renewed {age:.0f} s ago); wait for it to end or stop it, or pass another "
            f"--model_dir (a lease not renewed for {self.stale_minutes:g} minutes is taken over: "
            "orbitask.Lease.stale_minutes)."
        )


def _who(found: dict) -> str:
    return f"host {found.get('host', '?')}, pid {found.get('pid', '?')}"
