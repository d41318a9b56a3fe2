"""Input pipelines: the training input with its saved position, and the distributed eval datasets.

Training: `build_inputs(per_replica_batch_size, input_context)` is called once per worker, with
an `input_context` naming the worker (`num_input_pipelines` = workers, `input_pipeline_id` = its
index), and `make_batches` applied; each step takes one element per local replica from that plain
`tf.data` iterator (local replica r gets the r-th). Each worker reads only its own replicas'
batches. `trainers.input_position` saves each worker's iterator in its own file, newest few kept.

`build_inputs` may instead return an `IndexedInput` (`tasks.indexed_input`): the pipeline is then
built here from a global example number, and the saved position is that number.

Parameter server: each worker builds its own pipeline (`input_pipeline_id` = the worker index,
a tensor) through `ClusterCoordinator.create_per_worker_dataset`; a `tf.data` iterator there
cannot be saved, so a resumed PS job restarts such an input from its beginning. An
`IndexedInput` resumes near its position (workers run at their own pace).

The train iterator is saved explicitly, buffers included; tf.data's symbolic checkpointing (which
leaves the prefetch buffer out) makes iterating the pipeline slower, so it is not used. An autotuned
prefetch buffer doubles whenever the loop finds it empty, and every checkpoint would save it: a
`prefetch(tf.data.AUTOTUNE)` that ends the training pipeline is replaced by a fixed prefetch (same
elements, same order) of `task.train_prefetch` steps' elements, fewer where they would exceed
`task.train_prefetch_bytes`, never fewer than one step's; one deeper in the pipeline cannot be, and
is named in a warning.

Epochs (`run_experiment.train_epochs`, or `train_steps` None: one epoch): the training input's
size gives the steps (`epoch_length`). A finite `tf.data` dataset (the user does not `.repeat()`
it) is repeated here, after its prefetch is bounded, so the saved iterator is the repeated one.
An epoch of E elements on S slots (local replicas x accumulation) is `ceil(E / S)` steps when the
elements' batch dimension is unknown (batched without `drop_remainder`): a partial last element
ends a step (`steps.ReplicaBatches`), so each epoch starts a step; exact when the epoch's last
element is partial or S divides E (else the steps run on into the next epoch). With a static
batch dimension (`drop_remainder`) the elements stream on across epochs, and N epochs are
`floor(N * E / S)` steps. An `IndexedInput` epoch is its size in global examples
(`input_position.IndexedTrainInput`).

Evaluation: `build_inputs(..., training=False)` returns one finite dataset, or a dict
`{name: dataset}` of validation sets, each distributed over the replicas like the one
(`eval_datasets`).
"""

from __future__ import annotations

import fractions
import functools
import math
import uuid
from typing import Any

import tensorflow as tf
from absl import logging

from orbitask.tasks import model_garden
from orbitask.tasks.indexed_input import IndexedInput
from orbitask.trainers import compat
from orbitask.trainers.distribution.cluster import is_parameter_server, num_ps_workers
from orbitask.trainers.errors import ConfigError
from orbitask.trainers.state import random_state
from orbitask.trainers.state.input_position import (
    EpochLength,
    IndexedTrainInput,
    IteratorInput,
    ShuffleSeeds,
    TrainInput,
)


def _source(task: Any, per_replica: int, context, training: bool):
    """What `build_inputs` returns: a `tf.data.Dataset` (with `make_batches` applied) or an
    `IndexedInput`."""
    return _checked_source(
        task, task.build_inputs(per_replica, context, training=training), per_replica
    )


def _checked_source(task: Any, dataset: Any, per_replica: int):
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
    return _evaluation(_source(task, per_replica, context, training), context)


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
) -> TrainInput:
    """This worker's training input and its position (`trainers.input_position`). Eager, in
    scope.

    With `by_epochs` (`train_steps` None) its `epoch_length` is set, and a finite `tf.data`
    dataset is repeated (module docstring).

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
    length = epoch_length(task, source, local * accumulation) if by_epochs else None

    def rebuild(dataset=None):
        if dataset is None:
            with tf.device("/cpu:0"):
                dataset = _source(task, per_replica, context, training=True)
        if unsaved is not None:
            dataset = dataset.with_options(unsaved)
        slots = local * accumulation
        return _train_iterator(task, dataset, per_replica, slots, repeat=length is not None)

    return IteratorInput(
        rebuild(source), global_step, per_step, rebuild, model_dir, index, pipelines, keep, length
    )


def epoch_length(task: Any, dataset: tf.data.Dataset, slots: int) -> EpochLength:
    """The steps of one epoch of `dataset` (this worker's per-replica batches) when a step takes
    `slots` elements (module docstring). Eager; reads only the dataset's cardinality.

    Raises:
      ConfigError: for a dataset that repeats forever, is empty, or whose size TensorFlow
        cannot tell.
    """
    batches = int(dataset.cardinality())
    where = f"{type(task).__name__}.build_inputs(training=True)"
    if batches == tf.data.INFINITE_CARDINALITY:
        raise ConfigError(
            f"{where} repeats forever, so train_epochs (or train_steps None: one epoch) has no "
            "epoch to count; drop its .repeat() (orbitask repeats a finite dataset itself), or "
            "set TRAIN_STEPS (orbitask.run_experiment.train_steps)."
        )
    if batches == tf.data.UNKNOWN_CARDINALITY:
        raise ConfigError(
            f"TensorFlow cannot tell how many batches {where} has (e.g. after filter), so "
            "train_epochs (or train_steps None: one epoch) cannot be counted; end it with "
            "dataset.apply(tf.data.experimental.assert_cardinality(n)) for its n batches, or "
            "set TRAIN_STEPS (orbitask.run_experiment.train_steps)."
        )
    if batches == 0:
        raise ConfigError(f"{where} has no batches, so it has no epoch to train; check its data.")
    if slots > 1 and partial_elements(dataset.element_spec):
        return EpochLength(fractions.Fraction(-(-batches // slots)))
    return EpochLength(fractions.Fraction(batches, slots))


def partial_elements(spec: Any) -> bool:
    """Whether elements of `spec` may be partial batches: dense tensors whose leading dimension
    is unknown (a dataset batched without `drop_remainder`). Eager or traced."""
    leaves = tf.nest.flatten(spec)
    if not leaves or not all(type(s) is tf.TensorSpec and s.shape.rank for s in leaves):
        return False
    return leaves[0].shape[0] is None


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
    task: Any, strategy: tf.distribute.Strategy, global_batch_size: int, accumulation: int = 1
):
    """A plain, checkpointable iterator over this worker's training batches (`tf.data` input).

    A step takes `accumulation` elements per local replica. Eager, in scope.
    """
    per_replica = global_batch_size // strategy.num_replicas_in_sync
    index, pipelines, local = input_pipeline(strategy)
    context = tf.distribute.InputContext(pipelines, index, strategy.num_replicas_in_sync)
    with tf.device("/cpu:0"):
        dataset = _build(task, per_replica, context, training=True)
    return _train_iterator(task, dataset, per_replica, local * accumulation)


def _train_iterator(
    task: Any, dataset: tf.data.Dataset, per_replica: int, per_step: int, repeat: bool = False
):
    """An iterator over `dataset`, its final autotuned prefetch bounded (module docstring), then
    repeated when `repeat` (counted epochs), its shuffle seeds kept
    (`input_position.ShuffleSeeds`)."""
    with tf.device("/cpu:0"):
        if task.train_prefetch is not None:
            wanted = task.train_prefetch * per_step
            size = element_bytes(dataset.element_spec, per_replica)
            depth = prefetch_depth(size, wanted, per_step, task.train_prefetch_bytes)
            bounded = bound_prefetch(dataset, depth, type(task).__name__)
            if bounded is not dataset and depth < wanted:
                logging.info(
                    "orbitask: prefetching %d training elements of %.1f MiB, not %d "
                    "(Task.train_prefetch_bytes).",
                    depth,
                    size / 2**20,
                    wanted,
                )
            dataset = bounded
        if repeat:
            dataset = dataset.repeat()
        return ShuffleSeeds.keep(dataset, iter(dataset))


def element_bytes(spec: Any, batch_size: int) -> int | None:
    """Bytes of one element of a dataset with `element_spec` `spec`, or None when unknown.

    A leading dimension of None counts as `batch_size`; any other unknown dimension, a string
    or a composite (ragged, sparse) tensor makes it unknown.
    """
    total = 0
    for part in tf.nest.flatten(spec):
        if not isinstance(part, tf.TensorSpec) or part.dtype in (tf.string, tf.variant):
            return None
        if part.shape.rank is None:
            return None
        dims = part.shape.as_list()
        if dims and dims[0] is None:
            dims[0] = batch_size
        if None in dims:
            return None
        total += math.prod(dims) * part.dtype.size
    return total


def prefetch_depth(size: int | None, elements: int, per_step: int, max_bytes: int | None) -> int:
    """Elements of `size` bytes (None: unknown) to prefetch: `elements`, fewer if they would take
    more than `max_bytes`, never fewer than `per_step` (one step's)."""
    if max_bytes is None or size is None or elements * size <= max_bytes:
        return elements
    return max(per_step, max_bytes // max(size, 1))


def bound_prefetch(dataset: tf.data.Dataset, batches: int, owner: str) -> tf.data.Dataset:
    """`dataset` with its final `prefetch(tf.data.AUTOTUNE)` made `prefetch(batches)` (elements).

    Eager, once.

    Options set on top (`with_options`) are kept. Warns, naming `owner`'s `build_inputs`, about
    autotuned prefetches that are not last (they stay; their buffers are checkpointed too).
    """
    top, options = compat.strip_options(dataset)
    below = compat.autotuned_prefetch_input(top)
    if below is not None:
        dataset = below.prefetch(batches).with_options(options)
    left = autotuned_prefetches(dataset)
    if left:
        logging.warning(
            "%s.build_inputs(training=True) has %d prefetch(tf.data.AUTOTUNE) before its last "
            "transformation; checkpoints save its buffer, which grows: prefetch a fixed number of "
            "batches there.",
            owner,
            left,
        )
    return dataset


def autotuned_prefetches(dataset: tf.data.Dataset) -> int:
    """How many `prefetch(tf.data.AUTOTUNE)` the pipeline has (walks its Python datasets)."""
    count, seen, todo = 0, set(), [dataset]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if compat.autotuned_prefetch_input(node) is not None:
            count += 1
        todo.extend(compat.dataset_inputs(node))
    return count


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
        return _evaluation(_checked_source(task, value, per_replica), context)
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
        name: _evaluation(_checked_source(task, dataset, per_replica), context)
        for name, dataset in value.items()
    }


def _evaluation(source: Any, context) -> tf.data.Dataset:
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
