"""Learning-rate control: gin schedules (reusing official's / Keras's) times a checkpointed factor.

The effective rate is `schedule(step) * factor`; it is written into the checkpointed `lr` variable
and the optimizer at every step (in the device loop, so no host work). Halving on a worse
validation multiplies `factor` by 0.5 (nabu's `learning_rate_fact`). Without a schedule, `lr`
itself is the rate (callbacks may assign it) and halving scales it.
"""

from __future__ import annotations

from typing import Any

import gin
import tensorflow as tf
import tf_keras

from orbitask.tasks import keras_compat
from orbitask.trainers.errors import ConfigError

KINDS = ("constant", "exponential", "cosine")


@gin.configurable("learning_rate_schedule", module="orbitask")
def learning_rate_schedule(
    kind: str = "constant",
    initial: float = 1e-3,
    decay_steps: int | None = None,
    decay_rate: float = 0.1,
    alpha: float = 0.0,
    warmup_steps: int = 0,
    warmup_start: float = 0.0,
) -> Any:
    """Returns a `step -> learning rate` schedule. Eager; the result is traced into the step.

    Args:
      kind: "constant"; "exponential" (nabu: `initial * decay_rate ** (step / decay_steps)`);
        "cosine" (to `alpha * initial` at `decay_steps`).
      initial: the rate at step 0 (after warm-up).
      decay_steps: steps of the decay (required for exponential and cosine).
      decay_rate: exponential decay factor over `decay_steps`.
      alpha: cosine's final fraction of `initial`.
      warmup_steps: linear warm-up from `warmup_start` over these steps (official's LinearWarmup).
      warmup_start: the rate at step 0 when warming up.

    Raises:
      ValueError: for an unknown kind or a missing `decay_steps`.
    """
    if kind not in KINDS:
        raise ConfigError(
            f"`learning_rate_schedule.kind` must be one of {', '.join(KINDS)}; received {kind!r}."
        )
    if kind != "constant" and not decay_steps:
        raise ConfigError(
            f"`learning_rate_schedule.decay_steps` must be set for kind={kind!r} "
            "(e.g. TRAIN_STEPS); bind it in your .gin file."
        )
    schedules = tf_keras.optimizers.schedules
    if kind == "constant":
        schedule = _Constant(initial)
    elif kind == "exponential":
        schedule = schedules.ExponentialDecay(initial, decay_steps, decay_rate)
    else:
        schedule = schedules.CosineDecay(initial, decay_steps, alpha=alpha)
    if warmup_steps:
        # Imported here: `official` pulls in tfds, pandas, ... (+25 MB, seconds of start-up).
        from official.modeling.optimization import lr_schedule

        schedule = lr_schedule.LinearWarmup(schedule, warmup_steps, warmup_start)
    return schedule


class _Constant(tf_keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, value: float):
        self.value = value

    def __call__(self, step):
        del step
        return tf.constant(self.value, tf.float32)

    def get_config(self):
        return {"value": self.value}


class LearningRate:
    """The checkpointed rate `lr`, an optional schedule and the factor that halving scales.

    Args:
      lr: the learning-rate variable (checkpointed, shown to callbacks).
      schedule: a `step -> rate` callable, or None.
    """

    def __init__(self, lr: tf.Variable, schedule: Any = None):
        self.lr = lr
        self.schedule = schedule
        self.factor = tf.Variable(
            1.0,
            trainable=False,
            name="learning_rate_factor",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )

    @classmethod
    def create(cls, learning_rate: Any) -> LearningRate:
        """Returns a `LearningRate` with a new `lr` variable. Eager, in the strategy's scope.

        `learning_rate` is a float, or a `step -> rate` schedule (then `lr` starts at
        `schedule(0)`).
        """
        schedule = learning_rate if callable(learning_rate) else None
        lr = tf.Variable(
            float(schedule(0)) if schedule else float(learning_rate),
            trainable=False,
            dtype=tf.float32,
            name="learning_rate",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
        return cls(lr, schedule)

    def step_update(self, global_step: tf.Variable, optimizer: Any) -> None:
        """Traced, cross-replica, before each step: lr = schedule(step) * factor -> optimizer."""
        if self.schedule is None:
            return
        value = tf.cast(self.schedule(global_step), tf.float32) * self.factor
        self.lr.assign(value)
        keras_compat.sync_learning_rate(optimizer, self.lr)

    def scale(self, multiplier: float) -> None:
        """Eager: multiplies the rate (through `factor` when a schedule drives it)."""
        if self.schedule is None:
            self.lr.assign(self.lr * multiplier)
        else:
            self.factor.assign(self.factor * multiplier)
            self.lr.assign(self.lr * multiplier)
