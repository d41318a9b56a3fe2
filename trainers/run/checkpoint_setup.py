"""Builds a run's checkpoint: the state it holds besides the task's objects, this worker's
manager of it, and the saved checkpoints a run evaluates one by one."""

from __future__ import annotations

import dataclasses
from typing import Any

import keras
import tensorflow as tf

from orbitask.trainers import compat
from orbitask.trainers.engine import evaluation
from orbitask.trainers.errors import ConfigError
from orbitask.trainers.run import messages
from orbitask.trainers.run.builders import RunObjects
from orbitask.trainers.run.settings import Settings
from orbitask.trainers.state import checkpoint_manager, random_state, settings_record


@dataclasses.dataclass(frozen=True)
class Checkpointing:
    """The checkpoint of everything a resumed run needs and this worker's manager of it."""

    checkpoint: tf.train.Checkpoint
    manager: tf.train.CheckpointManager


def checkpointed_state(
    task: Any, objects: RunObjects, settings: Settings, mode: str, validation_control: Any
) -> dict:
    """The state a checkpoint holds besides the task's objects: the learning-rate factor, EMA,
    loss scale, NaN guard, `validation_control` (None: none), the last evaluated step, the
    random state and the train metrics. Eager, in the strategy's scope; returns
    `{name: trackable}`."""
    state = {"learning_rate_factor": objects.learning_rate.factor}
    ema = objects.ema
    if ema is not None:
        state["ema"] = ema.build(objects.model)
    if objects.loss_scale is not None:
        state["loss_scale"] = objects.loss_scale.checkpoint()
    if objects.nan_guard is not None:  # its counters and loss average resume too
        state["nan_guard"] = objects.nan_guard.checkpoint()
    if validation_control is not None:
        state["validation_control"] = validation_control.build(task)
    if mode == "train_and_eval":  # the Controller's record of the last evaluation
        state["evaluated_step"] = tf.Variable(
            -1,  # no record: a fresh run, or a checkpoint written without evaluations
            dtype=tf.int64,
            trainable=False,
            name="evaluated_step",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
    roots = {"task": task, "model": objects.model, "loss": objects.loss_fn}
    if (randomness := random_state.checkpointable(roots)) is not None:
        state["random_state"] = randomness
    if objects.train_metrics:  # a window's accumulation resumes where it was
        state["train_metrics"] = _metric_state(objects.train_metrics)
    return state


def _metric_state(metrics: list) -> tf.train.Checkpoint:
    """The variables of the train metrics (either Keras flavour), by position. Eager."""
    return tf.train.Checkpoint(
        **{
            f"metric_{i}": tf.train.Checkpoint(
                **{
                    f"v{j}": v.value if isinstance(v, keras.Variable) else v
                    for j, v in enumerate(metric.variables)
                }
            )
            for i, metric in enumerate(metrics)
        }
    )


def build_checkpointing(
    task: Any,
    model_dir: str,
    objects: RunObjects,
    *,
    train_input: Any,
    stateful_callbacks: dict,
    extra_state: dict,
    asynchronous: bool,
    max_to_keep: int | None,
    strategy: Any,
) -> Checkpointing:
    """The checkpoint of the task's objects, `train_input`'s position, the callbacks' state and
    `extra_state`, and this worker's manager of it. Eager, in the strategy's scope."""
    checkpoint, manager = checkpoint_manager.build(
        task=task,
        model_dir=model_dir,
        global_step=objects.global_step,
        lr=objects.lr,
        optimizer=objects.optimizer,
        model=objects.model,
        loss_fn=objects.loss_fn,
        train_input=train_input,
        stateful_callbacks=stateful_callbacks,
        extra_state=extra_state,
        asynchronous=asynchronous,
        max_to_keep=max_to_keep,
    )
    return Checkpointing(checkpoint, checkpoint_manager.for_this_worker(manager, strategy))


def check_eval_checkpoint(eval_checkpoint: str | None, mode: str) -> None:
    """Refuses an `eval_checkpoint` outside mode "eval", or one that does not read. Eager.

    Raises:
      ConfigError: naming the checkpoint and the mode.
    """
    if eval_checkpoint is None:
        return
    if mode != "eval":
        raise ConfigError(
            f"`eval_checkpoint` ({eval_checkpoint!r}) is for --mode=eval; received mode "
            f"{mode!r}. Drop --checkpoint (orbitask.run_experiment.eval_checkpoint) or "
            "use --mode=eval."
        )
    evaluation.check_checkpoint(eval_checkpoint)


def checkpoints_to_evaluate(
    mode: str, eval_checkpoint: str | None, manager: Any, model_dir: str
) -> list[str]:
    """The saved checkpoints a run evaluates one by one: `eval_checkpoint`, or with mode
    "eval_all" every one in `manager`'s directory; else none. Eager.

    Raises:
      ConfigError: for mode "eval" without any checkpoint to evaluate.
    """
    saved = [eval_checkpoint] if eval_checkpoint else []
    if mode == "eval_all":
        saved = evaluation.saved_checkpoints(manager)
    if mode == "eval" and not saved and manager.latest_checkpoint is None:
        raise ConfigError(
            f"--mode=eval evaluates the latest checkpoint, and {model_dir!r} has none; "
            "pass the --model_dir you trained into (continuous_eval waits for checkpoints)."
        )
    return saved


def record_start(model_dir: str, objects: RunObjects, state: Checkpointing, summaries: Any) -> None:
    """A training start's records, once the run is accepted (its checkpoint restored): its
    operative config (`settings_record`; a resume that changed settings names them in one line,
    with a note where the checkpoint's state overrides one), and the run's loggers rewound to the
    checkpoint and started (`loggers.Records.start`); a start marked in the train and eval summaries
    (`compat.write_session_start`), so that TensorBoard drops the points a resume orphans.
    Eager, the chief."""
    step = int(objects.global_step.numpy())
    resumed = state.manager.latest_checkpoint is not None
    lr_now = float(objects.lr.numpy()) if objects.learning_rate.schedule is None else None
    for line in settings_record.record(model_dir, step, resumed, lr_now):
        messages.say(line)
    evaluated = getattr(state.checkpoint, "evaluated_step", None)
    last_eval = step if evaluated is None else int(evaluated.numpy())
    if summaries.train.metrics is not None:  # the run's loggers, rewound to the checkpoint
        summaries.train.metrics.start(step, resumed, step, max(last_eval, -1))
    # TensorBoard's reader takes a run's first START as its beginning, and each later one as a
    # restart that drops the points at and past its step: those past the checkpoint here.
    after = 1 if resumed else 0
    compat.write_session_start(summaries.train.summary_writer(), step + after)
    compat.write_session_start(summaries.eval.summary_writer(), max(last_eval, 0) + after)


def evaluated_before(record: str) -> list[str]:
    """The checkpoint names (`ckpt-N`) an earlier eval_all recorded in `record` as evaluated,
    in order; none when there is no record. Eager."""
    if not tf.io.gfile.exists(record):
        return []
    with tf.io.gfile.GFile(record) as f:
        return [line.strip() for line in f if line.strip()]
