"""A progress display for training: step, steps/s, ETA and loss, after every device loop.

On a terminal it rewrites one line; otherwise (CI, files) it prints a line at most every
`interval_s` seconds and at the last step, so logs stay short.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import tensorflow as tf


def _format_eta(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ProgressAction:
    """An Orbit train action that shows progress; it never ends a device loop by itself.

    Args:
      global_step: the trainer's step variable.
      total_steps: the step training stops at.
      stream: where to write (stdout by default).
      interval_s: minimum seconds between lines when `stream` is not a terminal.
      clock: a `time.monotonic`-like function (injectable for tests).
    """

    def __init__(
        self,
        global_step: tf.Variable,
        total_steps: int,
        stream: TextIO | None = None,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.global_step = global_step
        self.total_steps = total_steps
        self.stream = stream or sys.stdout
        self.interval_s = interval_s
        self.clock = clock
        self._start: tuple[float, int] | None = None
        self._last_print = None
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def start(self) -> None:
        """Marks the first step and time (excluding tracing of the first loop from ETA)."""
        self._start = (self.clock(), int(self.global_step.numpy()))

    def line(self, step: int, logs: dict[str, Any]) -> str:
        """The progress line for `step`."""
        now = self.clock()
        if self._start is None:
            self._start = (now, step)
        t0, s0 = self._start
        rate = (step - s0) / (now - t0) if now > t0 and step > s0 else 0.0
        eta = _format_eta((self.total_steps - step) / rate) if rate else "?"
        loss = logs.get("loss")
        loss_text = f" | loss {float(loss):.4g}" if loss is not None else ""
        return f"step {step}/{self.total_steps} | {rate:.1f} steps/s | ETA {eta}{loss_text}"

    def __call__(self, train_output: dict) -> None:
        step = int(self.global_step.numpy())
        now = self.clock()
        text = self.line(step, train_output)
        last = step >= self.total_steps
        if self.tty:
            self.stream.write("\r" + text.ljust(79) + ("\n" if last else ""))
        elif last or self._last_print is None or now - self._last_print >= self.interval_s:
            self.stream.write(text + "\n")
            self._last_print = now
        else:
            return
        self.stream.flush()
