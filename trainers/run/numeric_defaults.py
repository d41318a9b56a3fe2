"""The defaults in effect that change a run's numbers, named in one line when training starts.

A user porting a loop from elsewhere compares numbers; a default that changes them silently (the
seed's global-norm clip and non-finite fix in the default update, the seed's Nadam when the task
builds no optimizer) is named with the binding or override that turns it off:

    orbitask: defaults that change the numbers: gradients clipped to global norm 10.0
    (orbitask.Task.clip_norm = None turns it off); ...
"""

from __future__ import annotations

from typing import Any

from orbitask.tasks.base import Task
from orbitask.tasks.model_garden import ModelGardenTask


def in_effect(task: Task, nan_guard: Any) -> list[str]:
    """Returns the defaults of `task` (and the run's `nan_guard`) that change its numbers, each
    with how to turn it off. Eager; reads only Python attributes."""
    nadam = f"the seed's optimizer Nadam(epsilon={task.optimizer_epsilon})"
    if isinstance(task, ModelGardenTask):
        if task.experiment is not None:
            return []
        clip = f" with global-norm clipping at {task.clip_norm}" if task.clip_norm else ""
        return [
            f"{nadam}{clip}: the Model Garden task came without its ExperimentConfig (pass "
            "run_experiment(..., params=config) for the config's optimizer)"
        ]
    cls, out = type(task), []
    default_update = cls.update_pre is Task.update_pre and not task.own_train_step
    if default_update and task.clip_norm is not None:
        out.append(
            f"gradients clipped to global norm {task.clip_norm} "
            "(orbitask.Task.clip_norm = None turns it off)"
        )
    if default_update and nan_guard is None:
        out.append(
            "non-finite gradient entries set to 0 and the step taken "
            "(orbitask.run_experiment.nan_guard = @orbitask.NanGuard() skips such steps)"
        )
    if cls.build_optimizer is Task.build_optimizer:
        out.append(f"{nadam}, as the task builds none (override Task.build_optimizer)")
    return out


def line(task: Task, nan_guard: Any) -> str | None:
    """The one line naming `in_effect(task, nan_guard)`, or None when there is none."""
    found = in_effect(task, nan_guard)
    return f"orbitask: defaults that change the numbers: {'; '.join(found)}." if found else None
