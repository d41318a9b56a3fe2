"""When `train_and_evaluate` evaluates: the `evaluation` entry of the Controller's schedule.

Evaluation points are the multiples of `eval_interval` counted from step 0, and `train_steps`,
whatever step a run starts from (Orbit counts the interval from the starting step, so a run
resumed at 350 would evaluate at 550, 750); with `eval_seconds`, also after the first device loop
that ends that many seconds of training after the last evaluation.
"""

from __future__ import annotations

from collections.abc import Callable

from orbitask.trainers.actions.schedule import Periodic
from orbitask.trainers.actions.triggers import Trigger


def evaluation_entry(
    evaluate: Callable[[dict], None],
    train_steps: int,
    interval: int | None,
    seconds: float | None,
    at_start: Callable[[int], None] | None = None,
) -> Periodic:
    """The `evaluation` entry: `evaluate(output)` at each evaluation point up to `train_steps`
    and `seconds` of training after the last evaluation (None: no time rule), and
    `at_start(step)` before the first device loop (the first evaluation: a baseline, or a point
    the checkpoint did not record); device loops end at the points."""
    when = _trigger(train_steps, interval, seconds)
    return Periodic("evaluation", evaluate, when=when, ends_loop=True, at_start=at_start)


def _trigger(train_steps: int, interval: int | None, seconds: float | None = None) -> Trigger:
    return Trigger(every_steps=interval or None, every_secs=seconds, at_steps=(train_steps,))


def eval_points(step: int, train_steps: int, interval: int | None) -> list[int]:
    """The steps after `step` and up to `train_steps` that the `evaluation` entry's step rules
    are due at: the multiples of `interval` counted from 0, and `train_steps` (only it when
    `interval` is None)."""
    return _trigger(train_steps, interval).due_steps(step + 1, train_steps)


def last_eval_point(step: int, train_steps: int, interval: int | None) -> int:
    """The last of `train_and_evaluate`'s evaluation points at or before `step` (0: none)."""
    if step >= train_steps:
        return train_steps
    return step // interval * interval if interval else 0
