"""The validation input: what `build_inputs(..., training=False)` returns, one finite dataset or
a dict `{name: dataset}` of validation sets, each distributed over the replicas like the one
(`eval_datasets`).
"""

from __future__ import annotations

import functools
from typing import Any

import tensorflow as tf

from orbitask.tasks.indexed_input import IndexedInput
from orbitask.trainers.distribution.cluster import is_parameter_server
from orbitask.trainers.engine.inputs import checked_source, evaluation_dataset
from orbitask.trainers.errors import ConfigError


def eval_dataset(task: Any, strategy: tf.distribute.Strategy, global_batch_size: int):
    """The validation dataset (`eval_datasets`); of validation sets, the first. Eager."""
    datasets = eval_datasets(task, strategy, global_batch_size)
    return next(iter(datasets.values())) if isinstance(datasets, dict) else datasets


def eval_datasets(task: Any, strategy: tf.distribute.Strategy, global_batch_size: int):
    """The validation input, one pipeline per worker, distributed over replicas: a dataset, or
    a dict `{name: dataset}` in `build_inputs(training=False)`'s order when it returns
    validation sets. Eager, once; `build_inputs` is called once per pipeline either way.

    Under `parameter_server` a plain dataset: the coordinator evaluates it itself; with one
    replica a plain dataset too (a distributed one adds a copy per batch). A dict's sets are
    distributed one by one from the dict that one call of `build_inputs` returned.

    Raises:
      ConfigError: for an empty dict, a set name that is not a string without "/", a set that
        is neither a `tf.data.Dataset` nor an `IndexedInput`, or validation sets under
        `parameter_server`.
    """
    per_replica = global_batch_size // strategy.num_replicas_in_sync
    if is_parameter_server(strategy):
        built = _eval_input(task, per_replica, None)
        if isinstance(built, dict):
            raise ConfigError(
                f"{type(task).__name__}.build_inputs(training=False) returned validation sets "
                f"{sorted(built)}, which strategy='parameter_server' does not evaluate; return "
                "one tf.data.Dataset there, or use another run_experiment.strategy."
            )
        return built
    if strategy.num_replicas_in_sync == 1:  # one replica: a plain dataset, as for training
        with tf.device("/cpu:0"):
            return _eval_input(task, per_replica, tf.distribute.InputContext(1, 0, 1))
    built: dict = {}  # input_pipeline_id -> what build_inputs returned there, checked

    def dataset_fn(name, context):
        pipeline = context.input_pipeline_id
        if pipeline not in built:
            built[pipeline] = _eval_input(task, per_replica, context)
        value = built[pipeline]
        if not isinstance(value, dict):
            return value
        return value[next(iter(value)) if name is None else name]

    options = tf.distribute.InputOptions(experimental_fetch_to_device=True)
    first = strategy.distribute_datasets_from_function(functools.partial(dataset_fn, None), options)
    sets = next(iter(built.values()))
    if not isinstance(sets, dict):
        return first
    names = list(sets)
    rest = {
        name: strategy.distribute_datasets_from_function(
            functools.partial(dataset_fn, name), options
        )
        for name in names[1:]
    }
    return {names[0]: first, **rest}


def _eval_input(task: Any, per_replica: int, context) -> Any:
    """What `build_inputs(training=False)` returns for `context`, checked, each `IndexedInput`
    made its evaluation dataset: a dataset, or a dict of them (validation sets). Eager."""
    value = task.build_inputs(per_replica, context, training=False)
    if not isinstance(value, dict):
        return evaluation_dataset(checked_source(task, value, per_replica), context)
    where = f"{type(task).__name__}.build_inputs(training=False)"
    if not value:
        raise ConfigError(
            f"{where} returned an empty dict; return a tf.data.Dataset, or a dict of one or more "
            "validation sets {name: tf.data.Dataset} (e.g. {'valid': ..., 'test': ...}), or use "
            "--mode=train."
        )
    for name, dataset in value.items():
        if not isinstance(name, str) or not name or "/" in name:
            raise ConfigError(
                f"{where} returned a validation set named {name!r}; name each set with a "
                "non-empty string without '/' (its logs are '<name>/<key>')."
            )
        if not isinstance(dataset, (tf.data.Dataset, IndexedInput)):
            raise ConfigError(
                f"{where} returned validation set {name!r} as a {type(dataset).__name__}; each "
                "value of its dict must be a tf.data.Dataset or an orbitask.IndexedInput."
            )
    return {
        name: evaluation_dataset(checked_source(task, dataset, per_replica), context)
        for name, dataset in value.items()
    }
