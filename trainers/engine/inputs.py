"""The training input: this worker's pipeline from `build_inputs`, with its saved position.

`build_inputs(per_replica_batch_size, input_context)` is called once per worker, with an
`input_context` naming the worker (`num_input_pipelines` = workers, `input_pipeline_id` = its
index), and `make_batches` applied; each step takes one element per local replica from that plain
`tf.data` iterator (local replica r gets the r-th). Each worker reads only its own replicas'
batches. `trainers.state.input_position` saves each worker's iterator in its own file, newest few
kept.

`build_inputs` may instead return an `IndexedInput` (`tasks.indexed_input`): the pipeline is then
built here from a global example number, and the saved position is that number.

Parameter server: each worker builds its own pipeline (`input_pipeline_id` = the worker index,
a tensor) through `ClusterCoordinator.create_per_worker_dataset`; a `tf.data` iterator there
cannot be saved, so a resumed PS job restarts such an input from its beginning. An
`IndexedInput` resumes near its position (workers run at their own pace).

The pipeline's final autotuned prefetch is bounded (`trainers.engine.prefetch`); with counted
epochs (`trainers.engine.epochs`) a finite `tf.data` dataset is then repeated here, so the saved
iterator is the repeated one. The validation input is `trainers.engine.eval_inputs`.
"""

from __future__ import annotations

import uuid
from typing import Any

import tensorflow as tf
from absl import logging

from orbitask.tasks import model_garden
from orbitask.tasks.indexed_input import IndexedInput
from orbitask.trainers import compat
from orbitask.trainers.distribution.cluster import is_parameter_server, num_ps_workers
from orbitask.trainers.engine.epochs import epoch_length, say_if_batch_exceeds_data
from orbitask.trainers.engine.prefetch import DEFAULT_PREFETCH, Prefetch, bound_train_prefetch
from orbitask.trainers.errors import ConfigError
from orbitask.trainers.state import random_state
from orbitask.trainers.state.input_position import (
    IndexedTrainInput,
    IteratorInput,
    TrainInput,
)
from orbitask.trainers.state.shuffle_seeds import ShuffleSeeds


def _source(task: Any, per_replica: int, context, training: bool):
    """What `build_inputs` returns: a `tf.data.Dataset` (with `make_batches` applied) or an
    `IndexedInput`."""
    return checked_source(
        task, task.build_inputs(per_replica, context, training=training), per_replica
    )


def checked_source(task: Any, dataset: Any, per_replica: int):
    """`dataset`, one input `build_inputs` returned, checked: a `tf.data.Dataset` (with
    `make_batches` applied) or an `IndexedInput`."""
    if isinstance(dataset, IndexedInput):
        if dataset.batch_size != per_replica:
            raise ConfigError(
                f"{type(task).__name__}.build_inputs returned an IndexedInput of batch_size "
                f"{dataset.batch_size}; pass it per_replica_batch_size ({per_replica})."
            )
        return dataset
    if not isinstance(dataset, tf.data.Dataset):
        raise ConfigError(
            f"{type(task).__name__}.build_inputs must return a tf.data.Dataset or an "
            f"orbitask.IndexedInput; received {type(dataset).__name__}."
        )
    return task.make_batches(dataset, per_replica)


def _build(task: Any, per_replica: int, context, training: bool) -> tf.data.Dataset:
    return evaluation_dataset(_source(task, per_replica, context, training), context)


def local_replicas(strategy: tf.distribute.Strategy) -> int:
    """This worker's replicas (parameter server: one per scheduled step)."""
    try:
        devices = len(strategy.extended.worker_devices)
    except RuntimeError:  # the default strategy
        devices = 1
    return min(devices, strategy.num_replicas_in_sync)


def input_pipeline(strategy: tf.distribute.Strategy) -> tuple[int, int, int]:
    """`(index, pipelines, local replicas)`: this worker's input pipeline, how many workers feed
    replicas, and its replicas (`multi_worker_mirrored`: one pipeline per worker, the chief
    first; otherwise one)."""
    local = local_replicas(strategy)
    resolver = strategy.cluster_resolver
    if resolver is None or is_parameter_server(strategy):
        return 0, 1, local
    spec = resolver.cluster_spec().as_dict()
    order = [("chief", i) for i in range(len(spec.get("chief", [])))]
    order += [("worker", i) for i in range(len(spec.get("worker", [])))]
    if not order:
        return 0, 1, local
    return order.index((resolver.task_type, resolver.task_id)), len(order), local


def train_input(
    task: Any,
    strategy: tf.distribute.Strategy,
    global_batch_size: int,
    accumulation: int,
    global_step: tf.Variable,
    model_dir: str,
    keep: int = 3,
    by_epochs: bool = False,
    prefetch: Prefetch = DEFAULT_PREFETCH,
) -> TrainInput:
    """This worker's training input and its position (`trainers.state.input_position`), its final
    autotuned prefetch bounded by `prefetch`. Eager, in scope.

    With `by_epochs` (`train_steps` None) its `epoch_length` is set, and a finite `tf.data`
    dataset is repeated (`trainers.engine.epochs`).

    Raises:
      ConfigError: with `by_epochs`, for a dataset of infinite or unknown size, or under
        `parameter_server`.
    """
    per_replica = global_batch_size // strategy.num_replicas_in_sync
    per_step = global_batch_size * accumulation
    if is_parameter_server(strategy):
        if by_epochs:
            raise ConfigError(
                "train_epochs (or train_steps None) is not available under strategy="
                "'parameter_server'; set TRAIN_STEPS (orbitask.run_experiment.train_steps)."
            )
        return _per_worker_input(task, strategy, per_replica, global_step, per_step)
    index, pipelines, local = input_pipeline(strategy)
    context = tf.distribute.InputContext(pipelines, index, strategy.num_replicas_in_sync)
    with tf.device("/cpu:0"):
        source = _source(task, per_replica, context, training=True)
    if isinstance(source, IndexedInput):

        def build(start: int):
            with tf.device("/cpu:0"):
                return iter(source.training_dataset(start, index, pipelines, local))

        return IndexedTrainInput(global_step, per_step, build, source)

    if pipelines > 1:
        warn_if_unsharded(task, per_replica, context)
    unsaved = unsaved_draws_options(task, source)
    say_if_batch_exceeds_data(task, source, per_replica * local * accumulation)
    length = epoch_length(task, source, local * accumulation) if by_epochs else None

    def rebuild(dataset=None):
        if dataset is None:
            with tf.device("/cpu:0"):
                dataset = _source(task, per_replica, context, training=True)
        if unsaved is not None:
            dataset = dataset.with_options(unsaved)
        slots = local * accumulation
        return _train_iterator(task, dataset, per_replica, slots, prefetch, length is not None)

    return IteratorInput(
        rebuild(source), global_step, per_step, rebuild, model_dir, index, pipelines, keep, length
    )


def unsaved_draws_options(task: Any, dataset: tf.data.Dataset) -> tf.data.Options | None:
    """Options that let a checkpoint save the position of a pipeline with stateful random ops
    (their state left out), after one line naming them (`random_state.say_unsaved`); None for
    a pipeline without them. Eager, once: serializes the pipeline's graph."""
    draws = random_state.unsaved_input_draws(dataset)
    if not draws:
        return None
    owner = task.task if isinstance(task, model_garden.ModelGardenTask) else task
    where = f"{type(owner).__name__}.build_inputs(training=True)"
    random_state.say_unsaved(where, draws, random_state.INPUT_FIX)
    options = tf.data.Options()
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return options


def warn_if_unsharded(task: Any, per_replica: int, context) -> bool:
    """Warns, and returns True, when the next worker's pipeline starts with the same batch as
    this one's: `build_inputs` ignores `input_context`, so every worker would train on the same
    examples. Eager.

    Reads the first batch of two pipelines built here for the check alone, never of the one
    that trains (a `shuffle(seed=...)` reshuffling each iteration would start training on its
    second order), and keeps the host's random state (Python, NumPy, TensorFlow's op seeds)
    across those `build_inputs` calls: training starts where the same pipeline starts without
    the check.
    """
    other = tf.distribute.InputContext(
        context.num_input_pipelines,
        (context.input_pipeline_id + 1) % context.num_input_pipelines,
        context.num_replicas_in_sync,
    )
    with tf.device("/cpu:0"), compat.host_random_state_kept():
        mine = next(iter(_source(task, per_replica, context, training=True)))
        first = next(iter(_source(task, per_replica, other, training=True)))
    try:
        same = all(
            a.shape == b.shape and bool(tf.reduce_all(a == b))
            for a, b in zip(tf.nest.flatten(mine), tf.nest.flatten(first), strict=True)
        )
    except (TypeError, ValueError, tf.errors.OpError):  # e.g. ragged or sparse parts
        return False
    if same:
        logging.warning(
            "%s.build_inputs gives worker %d and worker %d the same first batch: it ignores "
            "input_context, so every worker trains on the same examples. Shard it with "
            "dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id) "
            "(or return an orbitask.IndexedInput).",
            type(task).__name__,
            context.input_pipeline_id,
            other.input_pipeline_id,
        )
        print(
            f"orbitask: warning: {type(task).__name__}.build_inputs ignores input_context "
            "(every worker reads the same examples); see the log for the fix.",
            flush=True,
        )
    return same


def train_iterator(
    task: Any,
    strategy: tf.distribute.Strategy,
    global_batch_size: int,
    accumulation: int = 1,
    prefetch: Prefetch = DEFAULT_PREFETCH,
):
    """A plain, checkpointable iterator over this worker's training batches (`tf.data` input),
    its final autotuned prefetch bounded by `prefetch`.

    A step takes `accumulation` elements per local replica. Eager, in scope.
    """
    per_replica = global_batch_size // strategy.num_replicas_in_sync
    index, pipelines, local = input_pipeline(strategy)
    context = tf.distribute.InputContext(pipelines, index, strategy.num_replicas_in_sync)
    with tf.device("/cpu:0"):
        dataset = _build(task, per_replica, context, training=True)
    return _train_iterator(task, dataset, per_replica, local * accumulation, prefetch)


def _train_iterator(
    task: Any,
    dataset: tf.data.Dataset,
    per_replica: int,
    per_step: int,
    prefetch: Prefetch,
    repeat: bool = False,
):
    """An iterator over `dataset`, its final autotuned prefetch bounded
    (`trainers.engine.prefetch`), then repeated when `repeat` (counted epochs), its shuffle seeds
    kept (`shuffle_seeds.ShuffleSeeds`)."""
    with tf.device("/cpu:0"):
        dataset = bound_train_prefetch(task, dataset, per_replica, per_step, prefetch)
        if repeat:
            dataset = dataset.repeat()
        return ShuffleSeeds.keep(dataset, iter(dataset))


def probe_save(iterator: tf.data.Iterator) -> None:
    """Saves `iterator` into memory and deletes that copy; raises what saving it raises. Eager.

    On a fresh iterator (no buffer filled yet) this takes tens of milliseconds.
    """
    probe = f"ram://orbitask-input-probe-{uuid.uuid4().hex}"
    try:
        tf.train.Checkpoint(iterator=iterator).write(f"{probe}/ckpt")
    finally:
        if tf.io.gfile.exists(probe):
            tf.io.gfile.rmtree(probe)


def evaluation_dataset(source: Any, context) -> tf.data.Dataset:
    """A checked validation source as a dataset (an `IndexedInput`'s evaluation dataset)."""
    if isinstance(source, IndexedInput):
        return source.evaluation_dataset(context)
    return source


def _per_worker_input(task, strategy, per_replica, global_step, per_step) -> TrainInput:
    """One iterator per PS worker, sharded by worker index; carries `element_spec`."""
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    workers = num_ps_workers(strategy)
    probe = tf.distribute.InputContext(workers, 0, strategy.num_replicas_in_sync)
    source = _source(task, per_replica, probe, training=True)  # what kind of input it is

    def build(start: int = 0):
        def dataset_fn():
            index = tf.distribute.coordinator.experimental_get_current_worker_index()
            context = tf.distribute.InputContext(workers, index, strategy.num_replicas_in_sync)
            source = _source(task, per_replica, context, training=True)
            if isinstance(source, IndexedInput):
                return source.training_dataset(start, index, workers, 1)
            return source

        dataset = coordinator.create_per_worker_dataset(dataset_fn)
        iterator = iter(dataset)
        iterator.element_spec = dataset.element_spec  # for the pre-flight input check
        return iterator

    if isinstance(source, IndexedInput):
        return IndexedTrainInput(global_step, per_step, build, source)
    return TrainInput(build(), global_step, per_step)
