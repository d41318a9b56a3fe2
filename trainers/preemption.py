"""Preemption: on SIGTERM, save a checkpoint at the next device-loop boundary and exit cleanly.

Schedulers and spot machines send SIGTERM before killing a job. Python runs signal handlers only
between device loops (the main thread is inside TensorFlow during one), so the save happens at
most `steps_per_loop` steps after the signal (about a second where quick loops have grown,
`loop_seconds`); the run then raises `Preempted`, which the binary turns into exit status 75
("temporary failure: run the same command again to resume").
"""

from __future__ import annotations

import signal
import threading

from absl import logging

from orbitask.trainers.errors import Preempted


class PreemptionWatcher:
    """An Orbit train action that saves and stops after SIGTERM was received.

    Use as a context manager around the run, so the previous handler is restored afterwards.
    """

    def __init__(self, manager, global_step, signals=(signal.SIGTERM,)):
        self.manager = manager
        self.global_step = global_step
        self.signals = signals
        self.received = None
        self._previous = {}

    def _handle(self, signum, frame):
        del frame
        self.received = signum

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        return False

    def __call__(self, train_output) -> None:
        del train_output
        if self.received is None:
            return
        step = int(self.global_step.numpy())
        self.manager.sync()  # an async save of this step shows in `latest_checkpoint` once written
        latest = self.manager.latest_checkpoint
        if not (latest and latest.endswith(f"-{step}")):
            latest = self.manager.save(checkpoint_number=step, check_interval=False)
        name = signal.Signals(self.received).name
        logging.warning("%s received: saved %s at step %d; stopping.", name, latest, step)
        raise Preempted(
            f"{name} received: saved checkpoint {latest} at step {step}; run the same command "
            "again to resume from it."
        )
