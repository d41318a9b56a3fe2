"""Learning-rate control: gin schedules (reusing official's / Keras's) times a checkpointed factor.

The effective rate is `schedule(step) * factor`; it is written into the checkpointed `lr` variable
and the optimizer at every step (in the device loop, so no host work). Halving on a worse
validation multiplies `factor` by 0.5 (nabu's `learning_rate_fact`). Without a schedule, `lr`
itself is the rate (callbacks may assign it) and halving scales it.

One object owns the rate: `LearningRate`, built from `run_experiment.learning_rate` and held
under that name from the settings to the trainer (`RunObjects.learning_rate`, the run's one
record of its objects); the variable it sets is `lr`, the name the stages and callbacks
get it by. Whose rate a run uses is its `owner`, decided once by `decide_owner`: with
`run_experiment.learning_rate` unset, the optimizer's own (`build_optimizer`'s default Nadam gets
1e-3); with it set, that setting, and one line says so when the optimizer was built with another
rate. A dict of optimizers with different own rates keeps each one's rate: `lr` is then not
copied into them, and halving scales each. An optimizer whose own schedule sets its rate (Model
Garden's `create_optimizer`) keeps it, times `factor`: `lr` reads that rate at every step, and
halving scales it. Under either schedule a callback's assignment to `lr` scales the schedule from
then on (`keep_assigned`).
"""

from __future__ import annotations

import math
from typing import Any

import gin
import tensorflow as tf
import tf_keras

from orbitask.common import keras_compat, setting_rules
from orbitask.trainers.errors import ConfigError

DEFAULT_RATE = 1e-3  # what build_optimizer gets when run_experiment.learning_rate is unset


def _piecewise(boundaries: tuple, values: tuple) -> Any:
    bounds, rates = list(boundaries), [float(v) for v in values]
    if not bounds or len(rates) != len(bounds) + 1 or bounds != sorted(set(bounds)):
        raise ConfigError(
            "`learning_rate_schedule.boundaries` must be rising steps and `values` one rate more "
            f"than boundaries for kind='piecewise'; received boundaries={tuple(boundaries)!r}, "
            f"values={tuple(values)!r}."
        )
    return tf_keras.optimizers.schedules.PiecewiseConstantDecay(bounds, rates)


def _inverse_sqrt(initial: float) -> Any:
    # Imported here: `official` pulls in tfds, pandas, ... (+25 MB, seconds of start-up).
    from official.modeling.optimization import lr_schedule

    return lr_schedule.DirectPowerDecay(initial, power=-0.5)


class _Constant(tf_keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, value: float):
        self.value = value

    def __call__(self, step):
        del step
        return tf.constant(self.value, tf.float32)

    def get_config(self):
        return {"value": self.value}


_KERAS = tf_keras.optimizers.schedules
# The kinds of `learning_rate_schedule`: `kind: (schedule, its positional arguments)`, each
# Keras's (tf_keras) or Model Garden's schedule of that name; a kind whose arguments hold
# `decay_steps` needs it set. What each computes:
# - constant: `initial`;
# - exponential (nabu's): `initial * decay_rate ** (step / decay_steps)`;
# - cosine: to `alpha * initial` at `decay_steps`;
# - piecewise (stepwise): `values[i]` up to `boundaries[i]`, the last value after the last
#   boundary (one more value than boundaries);
# - polynomial: from `initial` to `end` at `decay_steps` along `(1 - step / decay_steps) ** power`;
# - inverse_sqrt (the Transformer's): `initial * step ** -0.5` (Model Garden's `DirectPowerDecay`);
#   with `warmup_steps`, the linear warm-up reaches it there, as the Transformer tutorial's
#   schedule with `initial = d_model ** -0.5`;
# - cosine_restarts: cosine periods, the first `decay_steps` long, each `t_mul` times longer and
#   `m_mul` times higher than the last, to `alpha * initial`.
SCHEDULES = {
    "constant": (_Constant, ("initial",)),
    "exponential": (_KERAS.ExponentialDecay, ("initial", "decay_steps", "decay_rate")),
    "cosine": (_KERAS.CosineDecay, ("initial", "decay_steps", "alpha")),
    "piecewise": (_piecewise, ("boundaries", "values")),
    "polynomial": (_KERAS.PolynomialDecay, ("initial", "decay_steps", "end", "power")),
    "inverse_sqrt": (_inverse_sqrt, ("initial",)),
    "cosine_restarts": (
        _KERAS.CosineDecayRestarts, ("initial", "decay_steps", "t_mul", "m_mul", "alpha"),
    ),
}  # fmt: skip
KINDS = tuple(SCHEDULES)


@gin.configurable("learning_rate_schedule", module="orbitask")
def learning_rate_schedule(
    kind: str = "constant",
    initial: float = 1e-3,
    decay_steps: int | None = None,
    decay_rate: float = 0.1,
    alpha: float = 0.0,
    warmup_steps: int = 0,
    warmup_start: float = 0.0,
    boundaries: tuple = (),
    values: tuple = (),
    end: float = 0.0,
    power: float = 1.0,
    t_mul: float = 2.0,
    m_mul: float = 1.0,
) -> Any:
    """Returns a `step -> learning rate` schedule. Eager; the result is traced into the step.

    Each kind is Keras's (tf_keras) or Model Garden's schedule of that name (`SCHEDULES` says
    what each computes): "constant", "exponential", "cosine", "piecewise", "polynomial",
    "inverse_sqrt", "cosine_restarts". A Keras `LearningRateSchedule` object (or any
    `step -> rate` callable) bound to `run_experiment.learning_rate` works as well.

    Args:
      kind: one of `KINDS`, above.
      initial: the rate at step 0 (after warm-up).
      decay_steps: steps of the decay (required for the decaying kinds).
      decay_rate: exponential decay factor over `decay_steps`.
      alpha: cosine's final fraction of `initial`.
      warmup_steps: linear warm-up from `warmup_start` over these steps (official's LinearWarmup).
      warmup_start: the rate at step 0 when warming up.
      boundaries, values: the steps and rates of "piecewise".
      end, power: "polynomial"'s final rate and power.
      t_mul, m_mul: "cosine_restarts"' period and height factors.

    Raises:
      ConfigError: for an unknown kind, a missing `decay_steps`, or piecewise boundaries and
        values that do not fit.
    """
    numbers = dict(initial=initial, decay_steps=decay_steps, decay_rate=decay_rate, alpha=alpha)
    numbers.update(warmup_steps=warmup_steps, warmup_start=warmup_start, end=end, power=power)
    numbers.update(t_mul=t_mul, m_mul=m_mul)
    setting_rules.check("learning_rate_schedule", numbers)
    if kind not in SCHEDULES:
        raise ConfigError(
            f"`learning_rate_schedule.kind` must be one of {', '.join(KINDS)}; received {kind!r}."
        )
    build, names = SCHEDULES[kind]
    if "decay_steps" in names and not decay_steps:
        raise ConfigError(
            f"`learning_rate_schedule.decay_steps` must be set for kind={kind!r} "
            "(e.g. TRAIN_STEPS); bind it in your .gin file."
        )
    given = {**numbers, "boundaries": boundaries, "values": values}
    schedule = build(*(given[name] for name in names))
    if warmup_steps:
        from official.modeling.optimization import lr_schedule  # (as in `_inverse_sqrt`)

        schedule = lr_schedule.LinearWarmup(schedule, warmup_steps, warmup_start)
    return schedule


class LearningRate:
    """The run's learning rate, its one owner: the checkpointed variable `lr`, an optional
    schedule, the factor that halving scales, and whose rate applies (`owner`).

    Args:
      lr: the learning-rate variable (checkpointed; the stages and callbacks get it as `lr`).
      schedule: a `step -> rate` callable, or None.
      setting: `run_experiment.learning_rate` as given (None: unset).

    `owner` says whose rate the run uses, decided once by `decide_owner`:
      "lr": the variable `lr` (the setting, or the optimizer's one rate taken over): the loop
        copies it into the optimizer(s), a callback may assign it and halving scales it.
      "optimizers": a dict of optimizers with different own rates: each keeps its own, and
        halving scales each.
      "optimizer_schedule": the optimizer's own schedule, times `factor`; `lr` reads that rate
        at every step.
    """

    def __init__(self, lr: tf.Variable, schedule: Any = None, setting: Any = None):
        self.lr = lr
        self.schedule = schedule
        self.setting = setting
        self.owner = "lr"
        self._own_rates: list = []  # the optimizers' own rate variables, owner "optimizers"
        self.factor = tf.Variable(
            1.0,
            trainable=False,
            name="learning_rate_factor",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )

    @classmethod
    def create(cls, learning_rate: Any) -> LearningRate:
        """Returns a `LearningRate` with a new `lr` variable. Eager, in the strategy's scope.

        `learning_rate` is `run_experiment.learning_rate`: a float, a `step -> rate` schedule
        (then `lr` starts at `schedule(0)`), or None (then `lr` starts at `DEFAULT_RATE` until
        `decide_owner`).
        """
        value = DEFAULT_RATE if learning_rate is None else learning_rate
        schedule = value if callable(value) else None
        lr = tf.Variable(
            float(schedule(0)) if schedule else float(value),
            trainable=False,
            dtype=tf.float32,
            name="learning_rate",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
        return cls(lr, schedule, learning_rate)

    def sync(self, optimizer: Any) -> None:
        """Copies `lr` into the optimizer(s) when `lr` owns the rate: the one place the rate
        enters an optimizer. Traced (first in each device loop, and after `step_update`) or
        eager (before each loop where the loop does not copy it); returns None. An optimizer
        following its own schedule has no rate variable to copy into."""
        if self.owner == "lr":
            keras_compat.sync_learning_rate(optimizer, self.lr)

    def step_update(self, global_step: tf.Variable, optimizer: Any) -> None:
        """Traced, cross-replica, before each step: lr = schedule(step) * factor -> optimizer."""
        if self.schedule is None:
            return
        value = tf.cast(self.schedule(global_step), tf.float32)
        if self.owner != "optimizer_schedule":  # that one is scaled already (`scale_schedule`)
            value *= self.factor
        self.lr.assign(value)
        self.sync(optimizer)

    def decide_owner(self, optimizer: Any) -> None:
        """Decides whose rate the run uses (`owner`; module docstring). Eager, once, after the
        optimizer is built with `lr`'s value; returns None, printing one line when the setting
        replaces another rate of the optimizer's.

        Raises:
          ConfigError: when the setting is given and the optimizer follows its own schedule.
        """
        if (rate := keras_compat.scheduled_rate(optimizer)) is not None:
            self._follow_optimizer(optimizer, rate)
            return
        variables = keras_compat.learning_rate_variable(optimizer)
        named = variables if isinstance(variables, dict) else {"": variables}
        own = {k: float(v.numpy()) for k, v in named.items() if v is not None}
        given = float(self.lr.numpy())
        differing = {k: r for k, r in own.items() if not math.isclose(r, given, rel_tol=1e-6)}
        if not differing:
            return
        rates = ", ".join(f"{k}: {r:.4g}" if k else f"{r:.4g}" for k, r in sorted(own.items()))
        if self.setting is not None:
            print(
                f"orbitask: run_experiment.learning_rate ({given:.4g}) replaces the rate "
                f"build_optimizer gave the optimizer ({rates}); unset run_experiment."
                "learning_rate to keep the optimizer's.",
                flush=True,
            )
            return
        if len(set(own.values())) == 1:  # the optimizer's own rate becomes the run's
            self.lr.assign(next(iter(own.values())))
            return
        self.owner = "optimizers"  # different rates in a dict: each keeps its own
        self._own_rates = [v for v in named.values() if v is not None]

    def _follow_optimizer(self, optimizer: Any, rate: Any) -> None:
        """The optimizer's own schedule, times `factor`, sets the rate: `lr` reads it at every
        step. Eager."""
        if self.setting is not None:
            raise ConfigError(
                "run_experiment.learning_rate is set, and the optimizer (build_optimizer's, or "
                "a Model Garden ExperimentConfig's) follows a learning-rate schedule of its own, "
                "which it cannot replace; unset run_experiment.learning_rate, or build the "
                "optimizer with a constant rate."
            )
        keras_compat.scale_schedule(optimizer, self.factor)  # halving scales its rates
        self.schedule = lambda step: rate()
        self.owner = "optimizer_schedule"
        self.lr.assign(rate())

    def keep_assigned(self, train_output: dict) -> None:
        """Eager, after the callbacks of a device loop, when a schedule sets the rate: a
        callback that assigned `lr` (rate r to r') scales the schedule by r' / r from the next
        step on, so the assignment lasts. Returns None."""
        logged, now = train_output["learning_rate"], float(self.lr.numpy())
        if now != logged and logged:
            self.factor.assign(self.factor * (now / logged))

    def scale(self, multiplier: float) -> None:
        """Eager: multiplies the rate (through `factor` when a schedule drives it)."""
        for rate in self._own_rates:
            rate.assign(rate * multiplier)
        if self.schedule is None:
            self.lr.assign(self.lr * multiplier)
        else:
            self.factor.assign(self.factor * multiplier)
            self.lr.assign(self.lr * multiplier)
