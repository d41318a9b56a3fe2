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
    at_start: Callable[[int, int], None] | None = None,
) -> Periodic:
    """The `evaluation` entry: `evaluate(output)` at each evaluation point up to `train_steps`
    and `seconds` of training after the last evaluation (None: no time rule), and
    `at_start(step, point)` before the first device loop, with the step training starts from
    and the last evaluation point at or before it (0: none), as the entry's trigger counts
    them (the first evaluation: a baseline, or a point the checkpoint did not record); device
    loops end at the points."""
    when = Trigger(every_steps=interval or None, every_secs=seconds, at_steps=(train_steps,))

    def start(step: int) -> None:
        at_start(step, when.last_due_step(min(step, train_steps)))

    return Periodic(
        "evaluation", evaluate, when=when, ends_loop=True, at_start=start if at_start else None
    )
