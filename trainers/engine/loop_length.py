"""`LoopLength`: how many steps a device loop runs; loops of quick steps grow towards a second.

Each call of the train loop function costs a few milliseconds besides its steps (the call, and steps
that run slower right after it; `benchmarks/loop_length.py` measures it), plus orbitask's host work
between loops. A loop of quick steps therefore doubles, from `steps_per_loop`, while one lasts less
than half `loop_seconds`. Loops never shrink below `steps_per_loop`, so slow steps keep their loops
and metric windows; callbacks, evaluation and checkpoints still end loops where they are due (the
Controller cuts a loop at the nearest due point of its schedule's loop-ending entries).
"""

from __future__ import annotations

from collections.abc import Callable

from absl import logging

GROWTH_LIMIT = 100  # loops grow to at most this many times `steps_per_loop`


class LoopLength:
    """The current device-loop length; `observe` each loop's wall time to let it grow.

    Args:
      steps_per_loop: the first loops' length, and the shortest.
      loop_seconds: loops double while one lasts less than half of this; None: never.
      agree: `agree(grow) -> grow` makes every worker take the same decision (a collective
        under `multi_worker_mirrored`); None: this process decides alone.
    """

    def __init__(
        self,
        steps_per_loop: int,
        loop_seconds: float | None,
        agree: Callable[[bool], bool] | None = None,
    ):
        self.steps = steps_per_loop
        self.most = GROWTH_LIMIT * steps_per_loop
        self.seconds = loop_seconds
        self.growing = loop_seconds is not None
        self.agree = agree
        self._seen = 0

    def observe(self, steps: int, seconds: float) -> None:
        """After a loop of `steps` steps that took `seconds`: doubles the length, or stops
        growing for good. The first loop (it traces the step) only counts. Eager; None."""
        if not self.growing:
            return
        self._seen += 1
        if self._seen == 1:
            return
        full = seconds * self.steps / max(steps, 1)  # a loop cut short by a callback scales up
        grow = full < self.seconds / 2 and 2 * self.steps <= self.most
        if self.agree is not None:
            grow = self.agree(grow)
        if not grow:
            self.growing = False
            logging.info("orbitask: device loops of %d steps (loop_seconds).", self.steps)
            return
        self.steps *= 2

    def steps_from(self, step: int) -> int:
        """The length of a device loop that starts at `step`: the current length (the Controller
        cuts it where an entry of its schedule is due). Eager host Python; returns it."""
        del step
        return self.steps
