"""`Trigger`: when periodic work is due -- every N steps, every T seconds, at given steps.

One rule for everything that runs between device loops (callbacks, summaries, progress lines,
checkpoints), modelled on CommonLoopUtils' `PeriodicAction(every_steps, every_secs, on_steps)`.
Steps are a device loop's end steps, so a trigger also says how many steps remain until its next
step-based due point (`steps_until_due`): the runner ends device loops there, and a rule that
must not end loops (a deferred callback) lists the due steps a loop ran past (`due_steps`).

Everything here is eager host Python on plain ints and floats -- no TensorFlow ops -- because
it runs after every device loop.
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable
from typing import Protocol

from orbitask.common.setting_rules import POSITIVE_INT, require
from orbitask.trainers.errors import ConfigError


class DuePoints(Protocol):
    """Anything that says how many steps remain until it is next due (a `Trigger`, say)."""

    def steps_until_due(self, step: int) -> int | None:
        """Eager host Python; returns the steps from `step` to the next due step, or None."""


class Trigger:
    """Due at multiples of `every_steps`, at each of `at_steps`, `every_secs` after it fired,
    before it first fired (`first`), or while `condition()` holds.

    `due(step)` asks; `fired(step)` records that the work ran (it restarts the seconds clock).
    The step rules are pure functions of the step, so every worker of a multi-worker run agrees
    on them; the seconds rule reads this process's clock (agree on it across workers before
    acting: `Schedule` does, with `cluster.agreement`).

    Args:
      every_steps: due at every step that is a multiple of this positive int; None: never.
      every_secs: due once this many seconds (>= 0) passed since the last `fired`, or since
        construction before that; None: never.
      at_steps: positive int steps where it is due once each.
      clock: a `time.monotonic`-like function returning seconds (injectable for tests).
      first: also due whenever it has not fired at a step yet (the first device loop).
      condition: `condition() -> bool`, also due while it returns True (a state the device
        loop left, e.g. the NaN guard's streak); None: no such rule.

    Raises:
      ConfigError: (a ValueError and TypeError) naming the argument and the value received.
    """

    def __init__(
        self,
        every_steps: int | None = None,
        every_secs: float | None = None,
        at_steps: Iterable[int] = (),
        clock: Callable[[], float] = time.monotonic,
        first: bool = False,
        condition: Callable[[], bool] | None = None,
    ):
        require(POSITIVE_INT.or_none(), every_steps, "`Trigger(every_steps=...)`")
        if every_secs is not None and (
            isinstance(every_secs, bool)
            or not isinstance(every_secs, (int, float))
            or not every_secs >= 0
        ):
            raise ConfigError(
                "`Trigger(every_secs=...)` must be a number of seconds >= 0 or None; "
                f"received {every_secs!r}."
            )
        at_steps = tuple(at_steps)
        for step in at_steps:
            require(
                POSITIVE_INT, step, "`Trigger(at_steps=...)`", must="must hold positive integers"
            )
        self.every_steps = every_steps
        self.every_secs = every_secs
        self.at_steps = tuple(sorted(set(at_steps)))
        self._at = frozenset(self.at_steps)
        self.clock = clock
        self.first = first
        self.condition = condition
        self.last_step: int | None = None  # the step of the last `fired`, None before
        self.last_time = clock()  # the time of the last `fired`, or of construction

    def __repr__(self) -> str:
        return (
            f"Trigger(every_steps={self.every_steps!r}, every_secs={self.every_secs!r}, "
            f"at_steps={list(self.at_steps)!r}, first={self.first!r})"
        )

    def step_due(self, step: int, since: int | None = None) -> bool:
        """Whether a step rule makes the trigger due at `step`. Eager host Python.

        Args:
          step: the step just reached (a device loop's last step).
          since: an earlier step (e.g. `last_step`, where it last fired). With it, the trigger
            is also due when a step-based due point lies between the two -- one passed it, the
            other had not: some due point d with min(since, step) < d <= max(since, step) --
            so a device loop that ran past a due point counts. None: only `step` itself.

        Returns:
          True if `step` is a multiple of `every_steps` or one of `at_steps` (or, with `since`,
          a due point was passed), else False.
        """
        n = self.every_steps
        if since is None:
            return (n is not None and step % n == 0) or step in self._at
        if n is not None and step // n != since // n:
            return True
        if self.at_steps:
            return bisect_right(self.at_steps, step) != bisect_right(self.at_steps, since)
        return False

    def state_due(self) -> bool:
        """Whether `first` (it has not fired at a step yet) or `condition()` makes it due.
        Eager host Python; returns a bool."""
        if self.first and self.last_step is None:
            return True
        return self.condition is not None and bool(self.condition())

    def time_due(self, now: float | None = None) -> bool:
        """Whether `every_secs` passed since the last `fired` (or construction). Eager host Python.

        Args:
          now: the time to compare, from the same clock; None reads `clock()`.

        Returns:
          True if `every_secs` is set and at least that many seconds passed, else False.
        """
        if self.every_secs is None:
            return False
        if now is None:
            now = self.clock()
        return now - self.last_time >= self.every_secs

    def due(self, step: int, since: int | None = None, now: float | None = None) -> bool:
        """Whether the trigger is due at `step`: by a step rule or by the seconds rule.

        Eager host Python. Asking changes nothing: call `fired` once the work ran.

        Args:
          step: the step just reached.
          since: see `step_due`.
          now: see `time_due`.

        Returns:
          `step_due(step, since) or state_due() or time_due(now)`.
        """
        if self.step_due(step, since) or self.state_due():
            return True
        return self.every_secs is not None and self.time_due(now)

    def fired(self, step: int | None = None, now: float | None = None) -> None:
        """Records that the work ran at `step`: restarts the seconds clock. Eager host Python.

        Args:
          step: the step it ran at, kept as `last_step`; None keeps `last_step` (a run of the
            work at no particular step, e.g. a final flush).
          now: the time it ran, from the same clock; None reads `clock()`.

        Returns:
          None.
        """
        if step is not None:
            self.last_step = step
        self.last_time = self.clock() if now is None else now

    def steps_until_due(self, step: int) -> int | None:
        """Steps from `step` to the next step-based due point after it. Eager host Python.

        The seconds rule has no step: a device loop ends here only for the step rules.

        Returns:
          A positive int (the next due step is `step + result`), or None when no step-based
          due point follows `step` (no `every_steps` and no `at_steps` after it).
        """
        n = self.every_steps
        until = None if n is None else n - step % n
        if self.at_steps:
            i = bisect_right(self.at_steps, step)
            if i < len(self.at_steps):
                at = self.at_steps[i] - step
                until = at if until is None or at < until else until
        return until

    def last_due_step(self, step: int) -> int:
        """The last step-based due point at or before `step`; 0 when none. Eager host Python."""
        n = self.every_steps
        last = 0 if n is None else step // n * n
        i = bisect_right(self.at_steps, step)
        return max(last, self.at_steps[i - 1]) if i else last

    def due_steps(self, first: int, last: int) -> list[int]:
        """The step-based due points from `first` to `last`, both included. Eager host Python.

        For work that runs once per due step after a device loop (deferred callbacks) instead
        of ending the loop there.

        Returns:
          The due steps in ascending order, without repeats; empty when `last < first`.
        """
        if last < first:
            return []
        n = self.every_steps
        steps = [] if n is None else list(range(first + (-first) % n, last + 1, n))
        if self.at_steps:
            at_steps = self.at_steps
            at = at_steps[bisect_left(at_steps, first) : bisect_right(at_steps, last)]
            if at:
                steps = sorted(set(steps).union(at)) if steps else list(at)
        return steps


def steps_until_any(schedules: Iterable[DuePoints], step: int) -> int | None:
    """Steps from `step` to the nearest step-based due point of any of `schedules`.

    Eager host Python. `schedules` are `Trigger`s or anything with the same `steps_until_due`
    (e.g. a `CallbackAction`).

    Returns:
      The smallest positive `steps_until_due(step)` among them, or None when none has one.
    """
    until = None
    for schedule in schedules:
        n = schedule.steps_until_due(step)
        if n is not None and (until is None or n < until):
            until = n
    return until
