"""When `train_and_evaluate` evaluates: the `evaluation` entry of the Controller's schedule.

Its `Trigger` is given whole: a run's is built from its settings (`run.entries.evaluation_trigger`:
the multiples of `eval_interval` counted from step 0, and `train_steps`, whatever step a run
starts from, as Orbit counts the interval from the starting step, so a run resumed at 350 would
evaluate at 550, 750; with `eval_seconds`, also after the first device loop that ends that many
seconds of training after the last evaluation).
"""

from __future__ import annotations

from collections.abc import Callable

from orbitask.trainers.actions.schedule import Periodic
from orbitask.trainers.actions.triggers import Trigger


def evaluation_entry(
    evaluate: Callable[[dict], None],
    when: Trigger,
    train_steps: int,
    at_start: Callable[[int, int], None] | None = None,
) -> Periodic:
    """The `evaluation` entry: `evaluate(output)` where `when` is due up to `train_steps`, and
    `at_start(step, point)` before the first device loop, with the step training starts from
    and the last of `when`'s step-based due points at or before it (0: none) (the first
    evaluation: a baseline, or a point the checkpoint did not record); device loops end at the
    points."""

    def start(step: int) -> None:
        at_start(step, when.last_due_step(min(step, train_steps)))

    return Periodic(
        "evaluation", evaluate, when=when, ends_loop=True, at_start=start if at_start else None
    )
