"""Input pipelines: a checkpointable train iterator and a distributed eval dataset.

Training: `build_inputs(per_replica_batch_size, input_context)` is called once per worker and
`make_batches` applied; each step takes one element per local replica from that plain `tf.data`
iterator (replica r gets the r-th). A `DistributedIterator` cannot be saved; this plain iterator
can, so a checkpoint holds the exact input position, shuffle buffer included.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf


def input_context(strategy: tf.distribute.Strategy, global_batch_size: int):
    """The `tf.distribute.InputContext` of this worker's single input pipeline."""
    resolver = getattr(strategy, "cluster_resolver", None)
    workers, worker_id = 1, 0
    if resolver is not None and resolver.cluster_spec().as_dict():
        spec = resolver.cluster_spec().as_dict()
        workers = len(spec.get("worker", [])) + len(spec.get("chief", []))
        worker_id = _worker_index(resolver)
    return tf.distribute.InputContext(
        num_input_pipelines=workers,
        input_pipeline_id=worker_id,
        num_replicas_in_sync=strategy.num_replicas_in_sync,
    )


def _worker_index(resolver) -> int:
    spec = resolver.cluster_spec().as_dict()
    has_chief = bool(spec.get("chief"))
    if resolver.task_type == "chief":
        return 0
    return (resolver.task_id or 0) + (1 if has_chief else 0)


def _build(task: Any, per_replica: int, context, training: bool) -> tf.data.Dataset:
    dataset = task.build_inputs(per_replica, context, training=training)
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(
            f"{type(task).__name__}.build_inputs must return a tf.data.Dataset; received "
            f"{type(dataset).__name__}."
        )
    return task.make_batches(dataset, per_replica)


def train_iterator(task: Any, strategy: tf.distribute.Strategy, global_batch_size: int):
    """A plain, checkpointable iterator over this worker's training batches. Eager, in scope."""
    per_replica = global_batch_size // strategy.num_replicas_in_sync
    context = input_context(strategy, global_batch_size)
    with tf.device("/cpu:0"):
        dataset = _build(task, per_replica, context, training=True)
        return iter(dataset)


def eval_dataset(task: Any, strategy: tf.distribute.Strategy, global_batch_size: int):
    """The validation dataset, one pipeline per worker, distributed over replicas."""
    per_replica = global_batch_size // strategy.num_replicas_in_sync

    def dataset_fn(context):
        return _build(task, per_replica, context, training=False)

    options = tf.distribute.InputOptions(experimental_fetch_to_device=True)
    return strategy.distribute_datasets_from_function(dataset_fn, options)
