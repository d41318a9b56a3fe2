"""A run's entries of the Controller's schedule (the Task's callbacks, the optional progress
display and profiler, the NaN guard and SIGTERM's watcher), the `evaluation` entry's `Trigger` and
its Orbit eval actions."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from orbitask.trainers.actions import preemption, summaries, time_budget
from orbitask.trainers.actions.callback_action import CallbackAction
from orbitask.trainers.actions.preemption import PreemptionWatcher
from orbitask.trainers.actions.profiling import Profiler
from orbitask.trainers.actions.progress import ProgressAction
from orbitask.trainers.actions.schedule import Periodic
from orbitask.trainers.actions.triggers import Trigger
from orbitask.trainers.distribution import cluster, slurm
from orbitask.trainers.features.learning_rate import LearningRate
from orbitask.trainers.run.settings import CheckpointSettings, EvalSettings, LoopSettings


def build_preemption(
    checkpoints: CheckpointSettings, current_step: Callable[[], int], save: Any
) -> PreemptionWatcher:
    """The watcher of the run's `stop_signals` and of a training run's `max_time` (its clock
    starts here), saving with `save` (None: the run does not train); with `requeue`, the SLURM
    job's requeue after the stop's save (`slurm.requeue`). Eager."""
    seconds = time_budget.seconds_of(checkpoints.max_time)
    return PreemptionWatcher(
        current_step,
        save=save,
        signals=preemption.stop_signals(checkpoints.stop_signals),
        budget=None if seconds is None or save is None else time_budget.TimeBudget(seconds),
        requeue=slurm.requeue if checkpoints.requeue else None,
    )


def build_progress(
    loop: LoopSettings,
    global_step: tf.Variable,
    train_steps: int | None,
    current_step: Callable[[], int],
    chief: bool,
) -> ProgressAction | None:
    """The progress display to `train_steps` on the `chief`, or None (elsewhere, or with
    `loop.progress` off). Eager."""
    if not (loop.progress and chief):
        return None
    return ProgressAction(
        global_step, train_steps, current_step=current_step, epochs=loop.train_epochs
    )


def build_profiler(
    steps: Any, model_dir: str, current_step: Callable[[], int], trainer: Any, trace: bool
) -> Profiler | None:
    """The profiler of `steps` (`profile_steps`; None: no profiler) writing under
    `model_dir/train`, tracing if `trace` (the chief). Eager.

    Every worker has one, so that every worker's device loops end at the same steps.
    """
    if steps is None:
        return None
    return Profiler(steps, os.path.join(model_dir, "train"), current_step, trainer, trace)


def train_entries(
    *,
    callbacks: CallbackAction,
    keep_logs: Callable[[dict], None],
    learning_rate: LearningRate,
    progress: ProgressAction | None,
    profiler: Profiler | None,
    nan_guard: Periodic | None,
    preemption: PreemptionWatcher,
    model_dir_check: Callable[[], None] | None = None,
    metrics_window: Periodic | None = None,
) -> list[Periodic]:
    """The run's entries of the Controller's schedule, in order (`actions.schedule`):
    `callbacks` (their triggers end loops), a schedule's rate they assigned, `keep_logs`,
    progress, the profiler (its window ends loops), the NaN guard's entry, SIGTERM's
    `preemption`, `model_dir_check` (None: none); `metrics_window` (`metrics_window_entry`)
    after the callbacks. The Controller's summaries, checkpoint and evaluation follow them."""
    entries = [Periodic("callbacks", callbacks, when=callbacks, ends_loop=True)]
    if metrics_window is not None:
        entries.append(metrics_window)
    if learning_rate.schedule is not None:  # a callback's `ctx.lr.assign` lasts
        entries.append(Periodic("learning_rate", learning_rate.keep_assigned))
    entries.append(Periodic("results", keep_logs))
    if progress is not None:
        entries.append(progress.entry())
    if profiler is not None:
        entries.append(profiler.entry())
    if nan_guard is not None:
        entries.append(nan_guard)  # before the Controller's checkpoint: a rollback precedes it
    # after every entry that changes state; every worker stops at the same step (its vote)
    entries.append(
        Periodic(
            "preemption", preemption, vote=preemption.vote, at_start=preemption.training_starts
        )
    )
    if model_dir_check is not None:  # before anything writes into the model directory
        entries.append(Periodic("model_dir", lambda _: model_dir_check()))
    return entries


def metrics_window_entry(metrics: list, window: int | None) -> Periodic:
    """The `metrics_window` entry: the train `metrics` restart after each device loop that ends
    at a multiple of `window`, and before the first when it starts at one; device loops end
    there. None: they restart around every device loop. Eager."""

    def reset(_: Any = None) -> None:
        for metric in metrics:
            metric.reset_state()

    if window is None:
        return Periodic("metrics_window", reset, at_start=reset)
    when = Trigger(every_steps=window)

    def at_start(step: int) -> None:
        if when.step_due(step):
            reset()

    return Periodic("metrics_window", reset, when=when, ends_loop=True, at_start=at_start)


def eval_actions(
    *,
    keep_logs: Callable[[dict], None],
    validation: Callable[[dict], None] | None,
    preemption: PreemptionWatcher,
) -> list:
    """The Orbit eval actions, in order: `keep_logs`, the validation control's action (None:
    none), SIGTERM's `preemption`."""
    actions = [keep_logs]
    if validation is not None:
        actions.append(validation)
    actions.append(preemption)  # last: after the evaluation's record and best export
    return actions


def build_callbacks(
    task: Any,
    strategy: Any,
    global_step: tf.Variable,
    summary_writer: Any,
    histogram_interval: int | None,
    *,
    context: Callable[[int, dict], Any],
    history: Callable[[], tuple[int, dict]],
    current_step: Callable[[], int],
) -> CallbackAction:
    """The Task's callbacks, and weight histograms every `histogram_interval` steps (None:
    none), as one Orbit action writing to `summary_writer`; `context` makes a callback's
    context, `history` gives the last loop's per-step logs. Eager."""
    interval = histogram_interval
    triggered = [(Trigger(every_steps=interval), [summaries.histograms])] if interval else []
    # Under parameter_server, deferred callbacks end loops like the others (no history).
    ps = cluster.is_parameter_server(strategy)
    return CallbackAction(
        task,
        global_step,
        context,
        summary_writer,
        history=None if ps else history,
        current_step=current_step,
        triggered=triggered,
    )


def evaluation_trigger(train_steps: int, evaluation: EvalSettings) -> Trigger:
    """When train_and_eval evaluates: at the multiples of `eval_interval` counted from step 0,
    at each of `eval_at_steps`, at `train_steps`, and `eval_seconds` of training after the last
    evaluation."""
    return Trigger(
        every_steps=evaluation.eval_interval,
        every_secs=evaluation.eval_seconds,
        at_steps=(train_steps, *evaluation.eval_at_steps),
    )
