"""A progress display for training: step, steps/s, ETA and loss, after every device loop.

On a terminal it rewrites one line, and other output to `sys.stdout` (the seed's `print_loss`)
erases that line first, so it scrolls above instead of landing on it. Otherwise (CI, files) it
prints a line after the first device loop, at most every `interval_s` seconds and at the last
step, so logs stay short: that rule is its schedule entry's trigger (`entry`).
The rate, and so the ETA, is the run's `StepRate`, the figure its `steps_per_second` summary
holds: from the end of the first device loop on (which excludes the time to trace the step
function), host work between the loops included.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

import tensorflow as tf

from orbitask.tasks import callbacks
from orbitask.trainers.actions.schedule import Periodic
from orbitask.trainers.actions.step_rate import StepRate
from orbitask.trainers.actions.triggers import Trigger


def _format_eta(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ProgressAction:
    """Shows progress after the device loops its schedule entry (`entry`) is due at; it never
    ends a device loop.

    Args:
      global_step: the trainer's step variable.
      total_steps: the step training stops at.
      stream: where to write (stdout by default).
      interval_s: minimum seconds between lines when `stream` is not a terminal (the seconds
        rule of the entry's `Trigger`; the first loop and the last step always print).
      clock: a `time.monotonic`-like function (injectable for tests).
      current_step: `current_step() -> int` after a loop (saves a read of `global_step`, an
        eager op); None reads the variable.
      epochs: `train_epochs`, when training counts epochs: the line shows the epoch the last
        step belongs to (`epoch 2/3`), taking `total_steps` as that many epochs.
      rate: the run's `StepRate` (the Controller's, so that the line and the summaries show
        one figure); None makes one reading `clock`.
    """

    def __init__(
        self,
        global_step: tf.Variable,
        total_steps: int,
        stream: TextIO | None = None,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        current_step: Callable[[], int] | None = None,
        epochs: int | None = None,
        rate: StepRate | None = None,
    ):
        self.global_step = global_step
        self.epochs = epochs
        self.current_step = current_step or (lambda: int(global_step.numpy()))
        self.total_steps = total_steps
        self.stream = stream or sys.stdout
        self.clock = clock
        self.interval_s = interval_s
        self.rate = rate or StepRate(clock)
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.shown = False  # the terminal line is on screen and the cursor is at its end

    def entry(self) -> Periodic:
        """The `progress` entry of a schedule: on a terminal after every device loop; else after
        the first loop, `interval_s` after the last line (this process's clock) and at the last
        step. It marks the start before the first loop. Eager; returns the `Periodic`."""
        when = None
        if not self.tty:
            last = (self.total_steps,) if self.total_steps else ()
            when = Trigger(every_secs=self.interval_s, at_steps=last, clock=self.clock, first=True)
        return Periodic("progress", self, when=when, local=True, at_start=self.start)

    def start(self, step: int) -> None:
        """Marks the first step (`step`) and time (`StepRate.start`): the entry's `at_start`.
        Eager, before the first device loop; returns None."""
        self.rate.start(step)

    @contextlib.contextmanager
    def attached(self) -> Iterator[None]:
        """While open, on a terminal that is `sys.stdout`, other prints erase the progress line
        first (`EraseLine`); `sys.stdout` is restored on exit, errors included. Eager; yields
        nothing."""
        if not (self.tty and self.stream is sys.stdout):
            yield
            return
        with contextlib.redirect_stdout(EraseLine(self.stream, self)):
            yield

    def line(self, step: int, logs: dict[str, Any]) -> str:
        """Returns the progress line for `step` (its rate: `StepRate.at`). Eager."""
        rate = self.rate.at(step)
        eta = _format_eta((self.total_steps - step) / rate) if rate else "?"
        losses = callbacks.loss_logs(logs)
        loss_text = "".join(f" | {name} {value:.4g}" for name, value in losses.items())
        epoch = ""
        if self.epochs:  # the epoch of step `step` (steps 1..total/epochs: epoch 1)
            current = min(self.epochs, max(1, math.ceil(step * self.epochs / self.total_steps)))
            epoch = f" | epoch {current}/{self.epochs}"
        return f"step {step}/{self.total_steps}{epoch} | {rate:.1f} steps/s | ETA {eta}{loss_text}"

    def __call__(self, train_output: dict) -> None:
        """Shows the line after a device loop its entry is due at (eager); returns None."""
        step = self.current_step()
        text = self.line(step, train_output)
        if self.tty:
            last = step >= self.total_steps
            self.stream.write("\r" + text.ljust(79) + ("\n" if last else ""))
            self.shown = not last
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


class EraseLine:
    """`sys.stdout` while a terminal progress line is shown: a write erases the line first.

    Without it, the seed's `print_loss` would append its text to the progress line. The progress
    action redraws its line after the next device loop.
    """

    def __init__(self, stream: TextIO, progress: ProgressAction):
        self.stream = stream
        self.progress = progress

    def write(self, text: str) -> int:
        """Erases the progress line if shown (ANSI erase-line), then writes `text`. Eager."""
        if self.progress.shown and text:
            self.stream.write("\r\x1b[K")
            self.progress.shown = False
        return self.stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)
