"""Errors raised while a run trains or evaluates, turned into what a user can act on.

A training dataset that ends before `train_steps` stops the run with one line naming the step and
the fix, after a checkpoint of the steps taken is saved. Any other TensorFlow error raised while a
device loop runs (a label out of range, a shape the model cannot take) keeps its traceback and
gains a note naming the global step it was raised at; an input file that does not exist stops
the run with one line naming it.

An error raised outside the train step (any entry of the schedule between device loops: the
evaluation and its actions, a callback, the train summaries, the progress display, a checkpoint
save, ...) leaves the trained state whole: a training run first saves it (unless the newest
checkpoint holds it), then the error keeps its traceback and gains a note naming where it was
raised and the checkpoint that holds the steps.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

from orbitask.common.errors import one_line
from orbitask.trainers.errors import ConfigError, EarlyStop, NonFiniteLossError, Preempted

# Where an error leaves the trained state whole: every entry of the Controller's schedule (and
# the trainer's evaluation phase), by name, as a note names them. `where()` naming anything but
# the step is outside it; a name missing here is named as it is.
OUTSIDE_THE_STEP = {
    "callbacks": "a callback (every_steps / at_step)",
    "metrics_window": "restarting the train metrics",
    "learning_rate": "keeping the assigned learning rate",
    "results": "keeping the loop's logs",
    "progress": "the progress display",
    "profiler": "the profiler",
    "nan_guard": "the NaN guard",
    "preemption": "the signal watcher",
    "model_dir": "checking the model directory",
    "train_actions": "a train action",
    "summaries": "keeping the train summaries",
    "summary_writes": "writing the train summaries",
    "checkpoint": "saving a checkpoint or its on_checkpoint_saved",
    "evaluation": "the evaluation",
}
THE_STEP = (None, "", "step")  # `where()` while the train step runs (the trainer's phase)
_MISSING = re.compile(r"(\S+); No such file or directory")
OWN_STOPS = (EarlyStop, Preempted, NonFiniteLossError, ConfigError)  # handled where raised


@contextlib.contextmanager
def named_by_step(
    global_step: tf.Variable,
    manager: Any,
    train_steps: int,
    where: Callable[[], str | None] = lambda: None,
    save: Callable[[], str] | None = None,
) -> Iterator[None]:
    """While open, errors name where they were raised: the train step (`where()` None or
    "step"), or the place `where()` names (a schedule entry's name, a key of `OUTSIDE_THE_STEP`).
    Eager; yields nothing.

    Args:
      global_step, train_steps: the run's.
      manager: the checkpoint manager; None where the run does not train.
      where: what the run is doing (read once an error came).
      save: saves the trained state unless the newest checkpoint holds it and returns its
        path; None where the run does not train.

    Raises:
      ConfigError: when the training dataset ended before `train_steps`; a checkpoint of the
        steps taken is saved first.
    """
    try:
        yield
    except OWN_STOPS:
        raise
    except Exception as e:
        name = where()
        place = None if name in THE_STEP else OUTSIDE_THE_STEP.get(name, f"schedule entry {name}")
        step = int(global_step.numpy())
        if place is not None:
            e.add_note(_outside_note(place, step, save))
            raise
        if isinstance(e, tf.errors.OutOfRangeError):
            if manager is not None:
                manager.save(checkpoint_number=step, check_interval=False)
            raise ConfigError(
                f"the training dataset ended after step {step} of train_steps {train_steps}: "
                "build_inputs(training=True) must repeat forever (end it with .repeat()), or "
                f"lower train_steps. A checkpoint at step {step} was saved."
            ) from e
        missing = _MISSING.search(str(e)) if isinstance(e, tf.errors.NotFoundError) else None
        if missing:
            raise ConfigError(
                f"an input file does not exist: {missing.group(1)} (read after global step "
                f"{step}); fix the path in build_inputs, or the list of files it reads."
            ) from e
        if isinstance(e, tf.errors.OpError):
            e.add_note(
                f"orbitask: raised while running the step after global step {step} "
                f"({type(e).__name__} from TensorFlow; the lines above name the op and its "
                "inputs)."
            )
        raise


def _outside_note(place: str, step: int, save: Callable[[], str] | None) -> str:
    """The note of an error raised at `place`, outside the train step; saves first (`save`)."""
    note = f"orbitask: raised during {place} at global step {step}"
    if save is None:
        return note + "."
    try:
        path = save()
    except Exception as failed:  # noqa: BLE001 -- the first error is the one to report
        return f"{note}; saving the trained steps failed too: {one_line(failed, 300)}"
    return f"{note}; the trained steps are saved in checkpoint {path}: the same command resumes."


def refuse_hidden_logs(task: Any, log_names: list, metrics: list) -> None:
    """Refuses, once the loop is traced and before it runs, a step log named as a train metric:
    the metric's value would replace the step's under that name. A task whose step logs its own
    metrics' results (`logs_its_metrics`, Model Garden's) is let through. Eager."""
    hidden = sorted(set(log_names) & {m.name for m in metrics})
    if hidden and not getattr(task, "logs_its_metrics", False):
        raise ConfigError(
            f"{type(task).__name__}'s train step logs {hidden[0]!r}, the name of one of its "
            "build_metrics() metrics, whose value would replace the step's in every log: "
            "rename the log or the metric."
        )
