"""`max_time`: a training run's wall-clock budget, as a job's time limit is.

The budget counts from the run's start (the call to `run_experiment`, before the model is
built). After each device loop the run goes on only while one more loop and a save fit in what is
left, each taken to last as long as the longest span seen so far between two device loops' ends
(the first one from the start of training, its tracing included; a span holds the loop and the
work after it: a checkpoint save, an evaluation). Otherwise it stops there: it saves that step
and exits 75, as on SIGTERM (`actions.preemption`), and the same command goes on for another
`max_time`. At least one device loop runs, however small the budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def seconds_of(max_time: float | str | None) -> float | None:
    """`max_time` in seconds: a number of seconds, or `"HH:MM:SS"`; None: no budget. The value
    is checked before the run (`common.setting_rules.DURATION`)."""
    if max_time is None or not isinstance(max_time, str):
        return None if max_time is None else float(max_time)
    hours, minutes, seconds = max_time.split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def describe(seconds: float) -> str:
    """`seconds` as `H:MM:SS` (whole seconds)."""
    whole = int(round(seconds))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


class TimeBudget:
    """A run's `max_time`, checked after each device loop. Eager host Python.

    Args:
      seconds: the budget.
      clock: seconds, monotonic (an injected clock in tests).
    """

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.seconds = seconds
        self.clock = clock
        self.start = clock()
        self._last = self.start
        self.longest = 0.0

    def training_starts(self, step: int = 0) -> None:
        """Before the first device loop: the first span counts from here (`Periodic.at_start`)."""
        del step
        self._last = self.clock()

    def spent(self) -> bool:
        """After a device loop: True when one more loop and a save would not fit in what is
        left of the budget (each as long as the longest span seen between loops' ends)."""
        now = self.clock()
        self.longest = max(self.longest, now - self._last)
        self._last = now
        return now - self.start + 2 * self.longest > self.seconds
