"""Checks run before the first step: the model directory and the shape of the input data.

Each failure is a one-line `ConfigError` saying what was expected, what was received and where
to fix it, raised before any training work (or any checkpoint write) happens.
"""

from __future__ import annotations

import re
from typing import Any

import tensorflow as tf
from absl import logging

from orbitask.common import keras_compat
from orbitask.common.errors import one_line
from orbitask.tasks.base import Task
from orbitask.trainers.engine import evaluation, inputs, user_code
from orbitask.trainers.engine.steps import RunObjects
from orbitask.trainers.errors import ConfigError
from orbitask.trainers.run import batch_checks, dry_step
from orbitask.trainers.run.batch_checks import describe
from orbitask.trainers.run.saved_model import zeros
from orbitask.trainers.state.input_position import IteratorInput


def check_inputs(
    task: Any,
    element_spec: Any,
    objects: RunObjects,
    replicas: int,
    training: bool = True,
) -> None:
    """Checks one batch's structure against what the task's default stages consume.

    A task whose step is its own (`train_step` overridden, or `validation_step` for
    `training=False`) owns its batch: nothing is checked. Otherwise, with the default
    `input_pre` / `loss_pre` the batch must be an `(inputs, labels)` pair; with
    the default `make_batches` its batch dimension must be the per-replica batch size
    (`objects.global_batch_size` / `replicas`); and with the default `train_step` a batch of
    zeros of that spec must go through `input_pre`, the model, `loss_pre` and the loss eagerly,
    the loss being per-example losses or their sum.
    """
    global_batch_size = objects.global_batch_size
    per_replica_batch_size = global_batch_size // replicas
    where = "build_inputs" + ("" if training else " (training=False)")
    kind = type(task)
    if task.own_train_step if training else kind.validation_step is not Task.validation_step:
        return
    received = describe(element_spec)
    default_split = kind.input_pre is Task.input_pre or kind.loss_pre is Task.loss_pre
    if default_split and not (
        isinstance(element_spec, (tuple, list)) and len(element_spec) in (2, 3)
    ):
        raise ConfigError(
            f"{kind.__name__}.{where} must yield (inputs, labels) pairs or (inputs, labels, "
            f"weights) triples for the default input_pre/loss_pre; received elements "
            f"{received}. Return those, or override input_pre and loss_pre."
        )
    leaves = [s for s in tf.nest.flatten(element_spec) if hasattr(s, "shape")]
    if kind.make_batches is Task.make_batches and leaves:
        if leaves[0].shape.rank == 0:
            raise ConfigError(
                f"{kind.__name__}.{where} yields unbatched elements {received}; batch them "
                f"with per_replica_batch_size ({per_replica_batch_size}) or in make_batches."
            )
        size = leaves[0].shape[0]
        if training and size is not None and size != per_replica_batch_size:
            raise ConfigError(
                f"{kind.__name__}.{where} yields batches of {size} but per_replica_batch_size "
                f"is {per_replica_batch_size} (global_batch_size {global_batch_size} / "
                f"{replicas} replicas); batch with the per_replica_batch_size argument."
            )
    if training and not task.own_train_step:
        _check_forward(task, element_spec, objects, per_replica_batch_size, where)


def _check_forward(
    task: Any, element_spec: Any, objects: RunObjects, batch_size: int, where: str
) -> None:
    """A batch of zeros of `element_spec` through `input_pre`, the model, `loss_pre` and the loss,
    eagerly; the loss must be per-example losses or their sum."""
    model, loss_fn, lr = objects.model, objects.loss_fn, objects.lr
    name = type(task).__name__
    batch = zeros(element_spec, batch_size)

    def replica_loss(outputs):  # where the step computes it: in replica context
        return loss_fn(task.loss_pre(outputs, batch, model, lr))

    outputs = None
    try:
        # The model in cross-replica context: a model without an Input layer builds its weights.
        outputs = model(task.input_pre(batch, lr), training=False)
        strategy = tf.distribute.get_strategy()
        loss = strategy.experimental_local_results(strategy.run(replica_loss, args=(outputs,)))[0]
    except Exception as e:  # noqa: BLE001 -- one raised inside TF/Keras is a data/model mismatch
        if user_code.raised_by_users_code(e):  # the user's bug, e.g. a NameError in loss_pre
            e.add_note(
                f"orbitask: raised by the check before the first step, which runs a batch of "
                f"zeros shaped like {name}.{where}'s through input_pre, the model, loss_pre and "
                "the loss, eagerly."
            )
            raise
        if outputs is not None:
            batch_checks.outputs_for_the_loss(task, outputs, e, where)
        raise ConfigError(
            f"a batch from {name}.{where} ({describe(element_spec)}) does not fit the model and "
            f"loss: {type(e).__name__}: {batch_checks.without_values(one_line(e, 400))}"
        ) from e
    shape = getattr(loss, "shape", None)
    per_example = shape is not None and shape.rank == 1 and shape[0] in (None, batch_size)
    if shape is not None and shape.rank not in (0, None) and not per_example:
        raise ConfigError(
            f"{name}'s loss must return per-example losses (shape [batch], here [{batch_size}]) "
            f"or their sum (a scalar); it returned shape {list(shape)}. Fix build_losses."
        )
    if shape is not None and shape.rank == 0:
        if task.example_weights(batch) is not None:
            raise ConfigError(
                f"{name}'s batches are weighted ({where} yields (inputs, labels, weights), or "
                "Task.class_weight is set), which needs per-example losses: build_losses must "
                "return shape [batch] (e.g. a Keras loss with reduction='none')."
            )
        batch_checks.check_not_a_mean(task, objects, outputs, batch, where)


def needs_losses(task: Any, training: bool, evaluating: bool) -> bool:
    """Whether the run needs `task.build_losses()`: not when every step it runs is the task's own
    and the task does not define it. Eager; returns the answer."""
    kind = type(task)
    own_steps = (not training or task.own_train_step) and (
        not evaluating or kind.validation_step is not Task.validation_step
    )
    return not (own_steps and kind.build_losses is Task.build_losses)


def check_built_in_scope(task: Any, model: Any, strategy: Any) -> None:
    """Refuses model weights made outside the strategy's scope (a model built when the task's
    module was imported, not in `build_model`): replicas could not share them. Eager; returns
    None.

    Raises:
      ConfigError: naming the first such weight.
    """
    if strategy.num_replicas_in_sync < 2:
        return
    models = model.values() if isinstance(model, dict) else [model]
    for variable in (v for m in models for v in m.trainable_variables):
        inner = variable if isinstance(variable, tf.Variable) else getattr(variable, "value", None)
        if isinstance(inner, tf.Variable) and not strategy.extended.variable_created_in_scope(
            inner
        ):
            name = getattr(variable, "path", None) or variable.name
            raise ConfigError(
                f"{type(task).__name__}.build_model() returned weights made outside the "
                f"strategy's scope ({name}): build the model inside build_model, not when your "
                "module is imported or in __init__."
            )


def checked_train_input(task: Any, strategy: Any, train_input: Any, objects: RunObjects) -> Any:
    """`train_input` (`inputs.train_input`) checked before the first step: its position
    checkpointable, and one batch of its spec through the model and loss. Builds the optimizer's
    slots. Eager; returns `train_input`.

    Raises:
      ConfigError: naming what does not fit.
    """
    model, replicas = objects.model, strategy.num_replicas_in_sync
    check_built_in_scope(task, model, strategy)
    if isinstance(train_input, IteratorInput):
        check_checkpointable_input(task, train_input)
    spec, per_replica = train_input.element_spec, objects.global_batch_size // replicas
    with dry_step.taken_back(task, model, objects.loss_fn):
        check_inputs(task, spec, objects, replicas)
        if _weightless(model) and task.own_train_step:
            dry_step.build_weights(task, strategy, spec, per_replica, objects)
    # After check_inputs, which calls the model once: a Keras model without an Input layer only
    # has weights from then on, and the optimizer must be built with them.
    keras_compat.build_optimizer_slots(objects.optimizer, trainable_variables(task, model), model)
    return train_input


def check_model(task: Any, model: Any) -> None:
    """Refuses what `build_model` returned unless it is a model (Keras, or a `tf.Module`) or a
    dict of them. Eager.

    Raises:
      ConfigError: naming `build_model` and what it returned.
    """
    models = model.values() if isinstance(model, dict) else [model]
    for one in models:
        if not hasattr(one, "trainable_variables"):
            raise ConfigError(
                f"{type(task).__name__}.build_model() returned {one!r} of type "
                f"{type(one).__name__}, which is not a model: return a Keras model (a "
                "keras.Model, or a layer wrapping your function), a tf.Module, or a dict of them."
            )


def _weightless(model: Any) -> bool:
    models = model.values() if isinstance(model, dict) else [model]
    return not any(m.trainable_variables for m in models)


def trainable_variables(task: Any, model: Any) -> list:
    """Returns the trainable variables of the model (or dict of models). Eager.

    Raises:
      ConfigError: when there are none (a Keras model without an input shape has no weights
        until it is first called).
    """
    models = model.values() if isinstance(model, dict) else [model]
    variables = [v for m in models for v in m.trainable_variables]
    if not variables and any(m.variables for m in models):  # e.g. `model.trainable = False`
        raise ConfigError(
            f"the model has no trainable variables: {type(task).__name__}.build_model() returned "
            "one whose weights are all frozen (trainable = False); leave the layers to train "
            "trainable, or run --mode=eval or predict."
        )
    if not variables:
        raise ConfigError(
            f"{type(task).__name__}.build_model() returned a model without trainable "
            "weights; give it an input shape (e.g. keras.Input((64,)) as its first layer)."
        )
    return variables


def check_finite_eval(task: Any, dataset: Any, eval_steps: int | None) -> None:
    """Refuses an evaluation that would never end or has nothing to evaluate. Eager, before the
    first step; returns None.

    With `eval_steps` None the whole validation `dataset` (plain or distributed) is evaluated, so
    it must be finite.

    Raises:
      ConfigError: when `build_inputs(training=False)` repeats forever and `eval_steps` is None,
        or yields no batches (a validation input that is empty only when read is refused at the
        first evaluation, `evaluation.empty_validation_error`).
    """
    cardinality = getattr(dataset, "cardinality", None)
    if cardinality is None:
        return
    batches = int(cardinality() if callable(cardinality) else cardinality)
    if batches == 0:  # a count TensorFlow cannot tell (e.g. after `filter`) waits for evaluation
        raise evaluation.empty_validation_error(task)
    if eval_steps is None and batches == tf.data.INFINITE_CARDINALITY:
        raise ConfigError(
            f"{type(task).__name__}.build_inputs(training=False) repeats forever and eval_steps "
            "is None, so evaluation would never end; return a finite validation dataset (a "
            "CallbackTask: pass validation_dataset=...), set run_experiment.eval_steps, or use "
            "--mode=train."
        )


def check_checkpointable_input(task: Any, train_input: IteratorInput) -> None:
    """Refuses a training input whose position a checkpoint cannot hold, unless the run keeps
    none (`keep_input_positions` 0) or it reads a Python function. Eager; returns None.

    tf.data cannot save an iterator over a pipeline with a stateful op; without this check the
    first checkpoint would fail with a long traceback after `checkpoint_interval` steps. Saving
    the fresh iterator into memory (no buffer is filled yet) takes tens of milliseconds, once.
    A pipeline reading a Python function (`Dataset.from_generator`, `tf.py_function`,
    `tf.numpy_function`) trains with its position unsaved (`IteratorInput.leave_unsaved`): one
    line says that a resume restarts it.

    Raises:
      ConfigError: naming any other stateful op and the stateless replacement.
    """
    iterator = train_input.iterator
    if train_input.keep == 0 or not isinstance(iterator, tf.data.Iterator):
        return  # no position saved; parameter_server: per-worker iterators, not checkpointed
    try:
        inputs.probe_save(iterator)
    except tf.errors.FailedPreconditionError as e:
        found = re.search(r"(\w+) is stateful", str(e))
        op = found.group(1) if found else "a stateful op"
        where = f"{type(task).__name__}.build_inputs(training=True)"
        if op in PYTHON_FUNCTIONS:
            _leave_unsaved(train_input, where, op)
            return
        raise ConfigError(
            f"{where} uses {op}, a stateful op, so checkpoints cannot save the input position; "
            "use stateless random ops in its map (tf.random.stateless_uniform, "
            "tf.image.stateless_random_flip_left_right, ...) with seeds from "
            "tf.data.Dataset.random() zipped in, or return an orbitask.IndexedInput."
        ) from e


# The ops of `Dataset.from_generator` and `tf.numpy_function` (PyFunc) and of `tf.py_function`.
PYTHON_FUNCTIONS = ("PyFunc", "EagerPyFunc")


def _leave_unsaved(train_input: IteratorInput, where: str, op: str) -> None:
    """Trains `train_input` with no saved position, said in one line (and in the log)."""
    reason = (
        f"{where} reads a Python function ({op}: Dataset.from_generator, tf.py_function or "
        "tf.numpy_function), whose position no checkpoint can hold"
    )
    train_input.leave_unsaved(reason)
    message = (
        f"{reason}: a resume restarts the training input from its beginning (an "
        "orbitask.IndexedInput resumes exactly)."
    )
    logging.warning(message)
    print(f"orbitask: warning: {message}", flush=True)
