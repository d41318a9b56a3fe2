"""Keras flavour helpers: tell tf_keras (Keras 2) from Keras 3 and build matching objects.

TF 2.20 ships Keras 3 as `tf.keras`; Model Garden and Orbit still use tf_keras. A model and its
optimizer must come from the same flavour (a tf_keras optimizer on a Keras 3 model fails deep inside
with `'Variable' object has no attribute '_unique_id'`), and the two flavours aggregate gradients
across replicas differently. Everything flavour-specific lives here.
"""

from __future__ import annotations

import random
from typing import Any

import keras
import tensorflow as tf
import tf_keras

from orbitask.common.errors import ConfigError

KERAS3 = "keras"
TF_KERAS = "tf_keras"
FLAVOURS = (KERAS3, TF_KERAS)
NADAM_COUNTER_FLOOR = -(2**62)  # below any step: see `reset_trace_state`
LEGACY_DRAWS = "legacy_stateful"  # tf_keras RandomGenerator's type of unsaved stateful draws
_TF_KERAS_SCHEDULE = tf_keras.optimizers.schedules.LearningRateSchedule


@tf.autograph.experimental.do_not_convert
def model_flavour(model: Any) -> str | None:
    """Returns "keras" or "tf_keras" for a model (or the first model of a dict), else None.

    Runs eagerly, once, when the runner builds the task's objects.
    """
    if isinstance(model, dict):
        for value in model.values():
            flavour = model_flavour(value)
            if flavour:
                return flavour
        return None
    if isinstance(model, tf_keras.Model):
        return TF_KERAS
    if isinstance(model, keras.Model):
        return KERAS3
    return None


@tf.autograph.experimental.do_not_convert
def optimizer_flavour(optimizer: Any) -> str | None:
    """Returns "keras" or "tf_keras" for a Keras optimizer, else None (e.g. a plain tf.Module)."""
    inner = getattr(optimizer, "inner_optimizer", None)  # LossScaleOptimizer wrappers.
    tf_keras_kinds = (tf_keras.optimizers.Optimizer, tf_keras.optimizers.legacy.Optimizer)
    if isinstance(optimizer, tf_keras_kinds) or isinstance(inner, tf_keras_kinds):
        return TF_KERAS
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return KERAS3
    return None


def nadam(
    learning_rate: float, epsilon: float, flavour: str, global_clipnorm: float | None = None
) -> Any:
    """The seed's default optimizer, `Nadam(learning_rate, epsilon)`, from the given flavour;
    with `global_clipnorm`, clipping in `apply_gradients` too. Eager; returns it."""
    if flavour not in FLAVOURS:
        raise ConfigError(
            f"`keras_flavour` must be one of {FLAVOURS}; received {flavour!r}. "
            "Set it on your Task or leave it None to follow the model."
        )
    module = tf_keras if flavour == TF_KERAS else keras
    clipping = {} if global_clipnorm is None else {"global_clipnorm": global_clipnorm}
    return module.optimizers.Nadam(learning_rate=learning_rate, epsilon=epsilon, **clipping)


def check_matching(model: Any, optimizer: Any) -> None:
    """Raises a one-line TypeError if model and optimizer come from different Keras flavours.

    Eager; returns None. A dict of optimizers (one per model) has each value checked.
    """
    if isinstance(optimizer, dict):
        for value in optimizer.values():
            check_matching(model, value)
        return
    m, o = model_flavour(model), optimizer_flavour(optimizer)
    if m and o and m != o:
        raise ConfigError(
            f"The model is a {m} model but the optimizer is a {o} optimizer "
            f"({type(optimizer).__name__}); build the optimizer from `{m}.optimizers` "
            "in your Task's build_optimizer (or create_opt)."
        )


def build_optimizer_slots(optimizer: Any, variables: list, model: Any = None) -> None:
    """Creates a Keras 3 optimizer's slots eagerly (it fails when built inside tf.function).

    tf_keras optimizers are left to build lazily on the first step: built eagerly inside a
    MirroredStrategy scope, tf_keras Nadam makes replicas diverge.
    A dict of optimizers is built per key with the variables of `model[key]` (a dict of models
    with the same keys). Eager; returns None.
    """
    if isinstance(optimizer, dict):
        for key, value in optimizer.items():
            if optimizer_flavour(value) != KERAS3:
                continue
            if not isinstance(model, dict) or key not in model:
                raise ConfigError(
                    f"build_optimizer returned a dict of optimizers with key {key!r}, but "
                    "build_model returned no model of that name; return dicts with the same keys."
                )
            build_optimizer_slots(value, model[key].trainable_variables)
        return
    if optimizer_flavour(optimizer) == KERAS3 and not optimizer.built:
        optimizer.build(variables)


def refresh_tracking(optimizer: Any) -> None:
    """Makes a lazily built tf_keras optimizer checkpoint the variables its build created.

    tf_keras caches an optimizer's checkpoint children the first time they are listed; a restore
    before the first step lists them before `build` adds plain attributes such as Nadam's
    `_u_product`, which later saves would then silently drop. Call after the first step.
    Eager; returns None. Accepts a dict of optimizers.
    """
    if isinstance(optimizer, dict):
        for value in optimizer.values():
            refresh_tracking(value)
        return
    for opt in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        if opt is not None and "_coalesced_children" in vars(opt):
            del opt._coalesced_children  # noqa: SLF001


@tf.autograph.experimental.do_not_convert
def learning_rate_variable(optimizer: Any) -> Any:
    """The optimizer's own learning-rate variable, or None when it follows a schedule/callable.

    Eager or traced. For a dict of optimizers, returns a dict of their variables (or None).
    """
    if isinstance(optimizer, dict):
        return {key: learning_rate_variable(value) for key, value in optimizer.items()}
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if isinstance(inner, tf_keras.optimizers.legacy.Optimizer):  # Model Garden's default kind
        lr = inner.learning_rate  # creates its hyperparameter variables, once, where first read
        return lr if isinstance(lr, tf.Variable) else None
    lr = getattr(inner, "_learning_rate", None)
    if isinstance(lr, tf.Variable) or isinstance(lr, keras.Variable):
        return lr
    return None


def scheduled_rate(optimizer: Any) -> Any:
    """A function returning the optimizer's current rate (traced or eager) when a schedule of
    its own sets it (a `LearningRateSchedule` given to the optimizer, as Model Garden's
    `create_optimizer` does); None for a rate variable, a dict of optimizers or a non-Keras one.
    Eager."""
    if isinstance(optimizer, dict) or optimizer_flavour(optimizer) is None:
        return None
    if learning_rate_variable(optimizer) is not None:
        return None
    inner = getattr(optimizer, "inner_optimizer", optimizer)

    def rate() -> tf.Tensor:  # the next update's (tf_keras' `learning_rate` is the last one's)
        return tf.cast(_rate_at(_own_schedule(inner), inner.iterations), tf.float32)

    return rate


def _own_schedule(inner: Any) -> Any:
    """The schedule a Keras optimizer (not a wrapper) holds. tf_keras' legacy optimizers keep it
    as their `learning_rate` hyperparameter, its new ones and Keras 3 in `_learning_rate`."""
    if isinstance(inner, tf_keras.optimizers.legacy.Optimizer):
        return inner.learning_rate
    return inner._learning_rate  # noqa: SLF001


def _rate_at(schedule: Any, step: Any) -> Any:
    """A schedule's rate at `step`; a callable rate (Keras 3 allows one) takes no step."""
    kinds = (keras.optimizers.schedules.LearningRateSchedule, _TF_KERAS_SCHEDULE)
    if isinstance(schedule, kinds):
        return schedule(step)
    return schedule() if callable(schedule) else schedule


def scale_schedule(optimizer: Any, factor: tf.Variable) -> None:
    """Makes the optimizer's own schedule give `schedule(step) * factor`, so that assigning
    `factor` scales every later rate. Eager; call once, where `scheduled_rate` is not None.
    Returns None. Each flavour's setter takes a schedule of its own `LearningRateSchedule` class.
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    schedule = _own_schedule(inner)
    flavour = optimizer_flavour(optimizer)
    schedules = keras.optimizers.schedules if flavour == KERAS3 else tf_keras.optimizers.schedules

    class Scaled(schedules.LearningRateSchedule):
        def __call__(self, step):
            return tf.cast(_rate_at(schedule, step), tf.float32) * tf.cast(factor, tf.float32)

        def get_config(self):
            return {}

    inner.learning_rate = Scaled()


@tf.autograph.experimental.do_not_convert
def sync_learning_rate(optimizer: Any, lr: Any) -> None:
    """Copies the learning-rate variable into the optimizer's own (eager or traced); or each's.

    Returns None. A dict of optimizers all follow the one learning-rate variable.
    """
    if isinstance(optimizer, dict):
        for value in optimizer.values():
            sync_learning_rate(value, lr)
        return
    target = learning_rate_variable(optimizer)
    if target is not None:
        target.assign(tf.cast(lr, target.dtype))


@tf.autograph.experimental.do_not_convert
def apply_gradients(optimizer: Any, gradients: list, variables: list) -> None:
    """Applies gradients that are already summed over replicas, exactly once.

    Runs inside `strategy.run` (replica context, under tf.function). tf_keras (legacy optimizers
    included) is told to skip its own all-reduce; Keras 3 always sums over replicas, so it
    receives `g / num_replicas`, and of an `IndexedSlices` (whose sum over replicas gathers
    their rows) this replica's share of the rows: the optimizer gets every row once.
    """
    pairs = [(g, v) for g, v in zip(gradients, variables, strict=True) if g is not None]
    if optimizer_flavour(optimizer) == TF_KERAS:
        optimizer.apply_gradients(pairs, experimental_aggregate_gradients=False)
        return
    context = tf.distribute.get_replica_context()
    if context.num_replicas_in_sync > 1:
        pairs = [(_replica_share(g, context), v) for g, v in pairs]
    optimizer.apply_gradients(pairs)


@tf.autograph.experimental.do_not_convert
def _replica_share(g: Any, context: Any) -> Any:
    """The part of the all-reduced `g` this replica hands a Keras 3 optimizer, which sums over
    replicas: `g / replicas`, or of an `IndexedSlices` the replica's contiguous share of rows."""
    replicas = context.num_replicas_in_sync
    if not isinstance(g, tf.IndexedSlices):
        return g / tf.cast(replicas, g.dtype)
    rows = tf.shape(g.indices)[0]
    replica = context.replica_id_in_sync_group
    start, end = rows * replica // replicas, rows * (replica + 1) // replicas
    return tf.IndexedSlices(g.values[start:end], g.indices[start:end], g.dense_shape)


@tf.autograph.experimental.do_not_convert
def reset_trace_state(optimizer: Any) -> None:
    """Sets the Python counter tf_keras' Nadam keeps across traces so that no traced update
    takes its "already computed this step" branch (one optimizer or a dict of them).

    Call at trace time, before the step's `apply_gradients`. tf_keras' Nadam compares a Python
    int (`_u_product_counter`, one more per traced variable update) with the step inside its
    graph, so which variable of which trace skips its `_u_product` update would depend on the
    trace's history, the replica count and the step a device loop starts at. With the counter
    far below any step, every traced update multiplies `_u_product` (what tf_keras' traced
    Nadam does once the step has passed the counter), and N replicas and a restarted run
    update exactly as one device and an uninterrupted run do. Keras 3's Nadam keeps no counter.
    """
    for each in optimizer.values() if isinstance(optimizer, dict) else [optimizer]:
        inner = getattr(each, "inner_optimizer", each)  # LossScaleOptimizer wrappers
        if hasattr(inner, "_u_product_counter"):
            inner._u_product_counter = NADAM_COUNTER_FLOOR  # noqa: SLF001


def rename_metric(metric: Any, name: str) -> None:
    """Renames a Keras metric of either flavour. Eager; returns None.

    tf_keras has `name` as a read-only property over the private `_name`.
    """
    try:
        metric.name = name  # Keras 3
    except AttributeError:
        metric._name = name  # noqa: SLF001


def save_layer_draws(model: Any, seed: int | None) -> list[str]:
    """Makes the tf_keras layers of `model` (or of a dict of models) that draw with stateful ops
    (dropout, noise) draw from a `tf.random.Generator` instead, whose state is a variable a
    checkpoint can hold. Eager, in the strategy's scope, after the model is built.

    tf_keras' default draws dropout masks with stateful ops whose state lives in the op's kernel:
    it cannot be saved, and a second trace of a step starts its sequence again. Each generator is
    seeded with the layer's own seed, else from a stream of `seed` (random without one) apart
    from tf_keras' own, so the initial weights are those the model gets anywhere else. Keras 3
    layers draw from `SeedGenerator` variables already. Returns the layers' names.

    Reads and sets the private `_random_generator`, `_rng_type`, `_seed` and `_built` of
    tf_keras' `backend.RandomGenerator`; tests/test_compat.py checks them.
    """
    models = model.values() if isinstance(model, dict) else [model]
    stream = random.Random(f"orbitask layer draws {seed}") if seed is not None else random.Random()
    names = []
    for each in models:
        if model_flavour(each) != TF_KERAS:
            continue
        for layer in each._flatten_layers(include_self=True):  # noqa: SLF001
            generator = getattr(layer, "_random_generator", None)
            if getattr(generator, "_rng_type", None) != LEGACY_DRAWS:
                continue
            if generator._seed is None:  # noqa: SLF001
                generator._seed = stream.randint(1, 10**9)  # noqa: SLF001
            generator._rng_type = generator.RNG_STATEFUL  # noqa: SLF001
            generator._built = False  # noqa: SLF001
            generator._maybe_init()  # noqa: SLF001
            names.append(layer.name)
    return names


def layer_generator(obj: Any) -> tf.random.Generator | None:
    """The `tf.random.Generator` behind a tf_keras layer's random generator (`obj`, the
    `_random_generator` of a dropout or noise layer), or None: a legacy or stateless one, or
    another object. Reads tf_keras' private `_generator`; tests/test_compat.py checks it."""
    if type(obj).__name__ != "RandomGenerator" or not type(obj).__module__.startswith("tf_keras"):
        return None
    generator = getattr(obj, "_generator", None)
    return generator if isinstance(generator, tf.random.Generator) else None


@tf.autograph.experimental.do_not_convert
def model_loss_terms(model: Any) -> tuple[list, list, list] | None:
    """`(weight, activity, added)`: the terms of a Keras model's `model.losses` after its call,
    by source: weight regularisers, activity regularisers (means over the batch) and the other
    terms its layers add with `add_loss` in `call`. None for a model of neither flavour or a dict
    of models. Reads each flavour's private per-layer loss lists. Traced."""
    flavour = model_flavour(model) if not isinstance(model, dict) else None
    if flavour is None:
        return None
    activity, added = [], []
    for layer in model._flatten_layers(include_self=True):  # noqa: SLF001
        if flavour == KERAS3:
            own = layer._get_own_losses()  # noqa: SLF001
            is_activity = layer.activity_regularizer is not None
        else:
            own = list(layer._losses)  # noqa: SLF001
            is_activity = getattr(layer, "_activity_regularizer", None) is not None
        (activity if is_activity else added).extend(own)
    if flavour == KERAS3:
        weight = model._get_regularization_losses()  # noqa: SLF001
    else:
        layers = model._flatten_layers()  # noqa: SLF001
        weight = [fn() for layer in layers for fn in layer._callable_losses]  # noqa: SLF001
        weight = [t for t in weight if t is not None]
    return weight, activity, added
