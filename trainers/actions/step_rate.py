"""`StepRate`: a training run's steps/s, the one figure the progress line, the `steps_per_second`
summary (TensorBoard, metrics.jsonl, the loggers) and `orbitask report` show.

At the end of the first device loop it is that loop's steps over the time since the start
(tracing the step included); after it, the steps since the first loop's end over the wall-clock
time since then: the device loops and all the host work between them (callbacks, summaries,
checkpoints, evaluations), as a user timing the run sees it, and what the ETA needs. The first
read after a loop fixes that loop's figure, so every reader of a loop gets the same number.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class StepRate:
    """A training run's steps/s after each device loop (module docstring). Eager, host only.

    Args:
      clock: a `time.monotonic`-like function (injectable for tests).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._mark: tuple[float, int] | None = None  # the time and step the rate counts from
        self._first = True  # the next loop is the first: the mark moves to its end
        self._last: tuple[int, float] | None = None  # the step of the last figure and it

    def start(self, step: int) -> None:
        """Marks the start of training at `step` (its first device loop next), unless a start
        is marked already. Eager; returns None."""
        if self._mark is None:
            self._mark = (self.clock(), step)

    def at(self, step: int) -> float:
        """The steps/s after the device loop that ended at `step`: fixed by the first read at
        that step (0.0 when no time or step passed). Eager."""
        if self._last is not None and self._last[0] == step:
            return self._last[1]
        now = self.clock()
        self.start(step)
        then, before = self._mark
        rate = (step - before) / (now - then) if now > then and step > before else 0.0
        if self._first:  # later figures leave out the first loop, which traced the step
            self._mark, self._first = (now, step), False
        self._last = (step, rate)
        return rate
