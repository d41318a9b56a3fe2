"""A loss already divided by the replica count, measured before the first step and multiplied
back for the default steps.

Under tf.distribute a Keras 3 loss object's mean is its replica's mean divided by the replica
count (Keras' `scale_loss_for_distribution`), and `tf.nn.compute_average_loss` divides by the
global batch: such a loss is a share of the global mean, where the default steps expect the
replica's own value (per-example losses, their sum, or under `loss_reduction = "mean"` their
mean). `for_steps` computes the loss once on a replica and once outside the strategy, on the
same batch; when the replica's value is the other over the replica count, the default steps get
`ReplicaMean(loss_fn)`, which multiplies it back. TensorFlow and Keras run as they are, and a
task's own `train_step` gets its loss as it built it.
"""

from __future__ import annotations

import threading
from typing import Any

import tensorflow as tf

from orbitask.tasks.base import Task
from orbitask.trainers.distribution import cluster
from orbitask.trainers.run.dry_step import taken_back
from orbitask.trainers.run.saved_model import zeros


class ReplicaMean:
    """`loss_fn` times the replica count: a loss that tf.distribute divides by the replicas, as
    its replica computes it. Called traced, per replica; returns the loss."""

    def __init__(self, loss_fn: Any, replicas: int):
        self.loss_fn = loss_fn
        self.replicas = replicas

    def __call__(self, loss_input: Any) -> Any:
        value = self.loss_fn(loss_input)
        return value * tf.cast(self.replicas, value.dtype)


def _outside(fn: Any) -> Any:
    """`fn()` in a thread of its own, where no strategy is in effect: one device's value.
    Eager; returns it, or raises what it raised."""
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = fn()
        except Exception as e:  # noqa: BLE001 -- raised again below, in the caller's thread
            result["error"] = e

    thread = threading.Thread(target=run, name="orbitask-loss-share")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def divided_by_replicas(task: Any, strategy: Any, objects: Any, batch: Any) -> bool:
    """Whether `task`'s scalar loss on replica 0's share of `batch` (a distributed batch, or one
    every replica takes) is its value outside the strategy over the replica count. Eager; a loss
    that is not a scalar, is 0 or cannot be computed is not judged (False)."""
    replicas = strategy.num_replicas_in_sync
    model, loss_fn, lr = objects.model, objects.loss_fn, objects.lr
    local = tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0], batch)

    def loss_of(one_batch: Any) -> Any:
        outputs = model(task.input_pre(one_batch, lr), training=False)
        return loss_fn(task.loss_pre(outputs, one_batch, model, lr))

    try:
        with taken_back(task, model, loss_fn):
            inside = strategy.experimental_local_results(strategy.run(loss_of, args=(batch,)))[0]
            outside = _outside(lambda: loss_of(local))
    except Exception:  # noqa: BLE001 -- the checks before step 1 judge a loss that fails
        return False
    if getattr(inside, "shape", None) is None or inside.shape.rank != 0:
        return False
    inside, outside = float(inside), float(outside)
    if outside == 0.0 or abs(inside - outside) <= 1e-6 * abs(outside):
        return False
    return abs(inside * replicas - outside) <= 1e-5 * abs(outside)


def for_steps(
    task: Any, strategy: Any, objects: Any, train_input: Any, eval_dataset: Any, per_replica: int
) -> Any:
    """The loss the run's steps get: `ReplicaMean(loss_fn)` when the run has several replicas,
    a default step (`train_step` when training, else `validation_step`) and a loss divided by
    the replica count (`divided_by_replicas`, on zeros shaped like the training batch, or on
    the first validation batch); else `objects.loss_fn`. Eager."""
    loss_fn, replicas = objects.loss_fn, strategy.num_replicas_in_sync
    if loss_fn is None or replicas == 1 or cluster.is_parameter_server(strategy):
        return loss_fn
    if train_input is not None:
        if task.own_train_step:
            return loss_fn
        batch = zeros(train_input.element_spec, per_replica)
    else:
        if type(task).validation_step is not Task.validation_step or eval_dataset is None:
            return loss_fn
        sets = eval_dataset.values() if isinstance(eval_dataset, dict) else [eval_dataset]
        batch = next(iter(next(iter(sets))), None)
        if batch is None:
            return loss_fn
    if divided_by_replicas(task, strategy, objects, batch):
        return ReplicaMean(loss_fn, replicas)
    return loss_fn
