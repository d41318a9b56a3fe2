"""Profiling steps N..M of a run into TensorBoard's profile format (`tf.profiler.experimental`).

`run_experiment.profile_steps = (N, M)` traces the device loops of steps N to M (counted from 1)
into `<model_dir>/train/plugins/profile/<time>/` (TensorBoard's Profile tab, `--logdir
<model_dir>`). Device loops end after step N-1 and after step M, so the trace holds those steps
and no others. The trace starts before the first loop when the run starts at step N-1 (N = 1, or
a resume there), or after the loop ending at step N-1; a run resumed inside the window traces
from its first loop to M.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from absl import logging

from orbitask.common.setting_rules import POSITIVE_INT
from orbitask.trainers.actions.schedule import Periodic
from orbitask.trainers.actions.triggers import Trigger
from orbitask.trainers.errors import ConfigError


class Profiler:
    """Starts and stops the TensorFlow profiler around steps `first`..`last` (chief only).

    The action of its schedule entry (`entry`), after the loops ending at steps first-1 and
    last. Eager.

    Args:
      steps: `(first, last)`, 1 <= first <= last.
      logdir: the summary folder the `plugins/profile` folder goes into.
      current_step: `current_step() -> int`, the global step after the last loop.
      trainer: the `TaskTrainer`, whose device loops are marked as "train" steps while tracing.
      trace: False on a non-chief worker: its loops end where the chief's do, untraced.
    """

    def __init__(self, steps: Any, logdir: str, current_step, trainer, trace: bool = True):
        check(steps)
        self.first, self.last = int(steps[0]), int(steps[1])
        self.logdir, self.trainer, self.trace = logdir, trainer, trace
        self.current_step = current_step
        self.running = False
        self.done = False

    def entry(self) -> Periodic:
        """The `profiler` entry: due at steps first-1 and last, where device loops end, and
        starting the trace before the first loop when training starts inside the window. Eager;
        returns the `Periodic`."""
        edges = Trigger(at_steps=[s for s in (self.first - 1, self.last) if s > 0])
        return Periodic("profiler", self, when=edges, ends_loop=True, at_start=self.start_if_due)

    def start_if_due(self, step: int) -> None:
        """Starts tracing when the next loop begins inside the window. Eager; returns None."""
        if self.trace and not self.running and not self.done and self.first - 1 <= step < self.last:
            tf.profiler.experimental.start(self.logdir)
            self.running = self.trainer.mark_loops = True
            logging.info("profiling steps %d-%d into %s", step + 1, self.last, self.logdir)

    def __call__(self, output: Any) -> None:
        """The entry's action: stops after step `last`, else starts when the next loop is
        inside the window. Eager; returns None."""
        del output
        step = self.current_step()
        if self.running and step >= self.last:
            tf.profiler.experimental.stop()
            self.running = self.trainer.mark_loops = False
            self.done = True
            print(f"orbitask: profile of steps {self.first}-{self.last} in {self.logdir}")
            return
        self.start_if_due(step)

    def close(self) -> None:
        """Stops a trace still running (the run ended inside the window). Eager; returns None."""
        if self.running:
            tf.profiler.experimental.stop()
            self.running = self.trainer.mark_loops = False


def check(steps: Any) -> None:
    """Raises ConfigError unless `steps` is `(first, last)` with 1 <= first <= last."""
    ok = (
        isinstance(steps, (tuple, list))
        and len(steps) == 2
        and all(POSITIVE_INT.accepts(s) for s in steps)
        and steps[0] <= steps[1]
    )
    if not ok:
        raise ConfigError(
            f"`profile_steps` must be (first, last) with 1 <= first <= last; received {steps!r}. "
            "Set run_experiment.profile_steps in your .gin file, e.g. (100, 110)."
        )
