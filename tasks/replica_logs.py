"""Losses that are already a share of the global batch's mean, and how logs made from them add up.

Under tf.distribute a Keras 3 loss object's mean result is its replica's mean divided by the
replica count (`scale_loss_for_distribution`), and `tf.nn.compute_average_loss` divides by the
global batch size: summed over replicas, such a value is what one device computes. While
`recording_global_losses` is open it records these values as steps are traced; the trainer sums
the logs computed from them over replicas (averaging the others), and the default steps turn
such a loss back into its replica's own (`replica_loss`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from orbitask.common import keras_compat


class _Marking:
    """A loss function that records its traced results' `ref()`s in `marked` (a set)."""

    def __init__(self, fn: Any, marked: set):
        self.fn = fn
        self.marked = marked

    def __call__(self, *args, **kwargs):
        value = self.fn(*args, **kwargs)
        if tf.is_tensor(value) and not tf.executing_eagerly():
            self.marked.add(value.ref())
        return value


def _recorded() -> set | None:
    """The set of the recording in effect (found at its patch point), or None."""
    marking = tf.nn.compute_average_loss
    return marking.marked if isinstance(marking, _Marking) else None


@contextlib.contextmanager
def recording_global_losses() -> Iterator[set]:
    """While steps are traced, records the values that are already a share of the global batch's
    mean: Keras 3 loss objects' mean results (which divide by the replica count under
    tf.distribute) and `tf.nn.compute_average_loss`'s. Yields the set of their `ref()`s. Eager,
    around a run or a trace (nested: the outer recording's set). A log computed from such a
    value is summed over replicas to give one device's number (`trainers.engine.steps.Finish`),
    and the default steps turn such a loss back into its replica's share (`is_global_share`).
    """
    recorded = _recorded()
    if recorded is not None:
        yield recorded
        return
    keras_loss = keras_compat.keras_loss_module()
    marked: set = set()
    scale, average = keras_loss.scale_loss_for_distribution, tf.nn.compute_average_loss
    keras_loss.scale_loss_for_distribution = _Marking(scale, marked)
    tf.nn.compute_average_loss = _Marking(average, marked)
    try:
        yield marked
    finally:
        keras_loss.scale_loss_for_distribution = scale
        tf.nn.compute_average_loss = average


def is_global_share(value: Any) -> bool:
    """Whether a traced loss comes from a Keras 3 loss object's mean or `compute_average_loss`
    (recorded by `recording_global_losses`), i.e. is its replica's mean divided by the replica
    count. Traced."""
    recorded = _recorded()
    return recorded is not None and derives_from(value, recorded)


def replica_loss(loss: Any, examples: Any) -> Any:
    """`loss` as its replica computed it: a Keras 3 mean (`is_global_share`) times the replica
    count and the replica's `examples` (a sum over its batch, as a per-example loss summed);
    any other loss unchanged. Traced, per replica."""
    if not is_global_share(loss):
        return loss
    replicas = tf.distribute.get_replica_context().num_replicas_in_sync
    return loss * tf.cast(replicas * examples, loss.dtype)


def derives_from(value: Any, marked: set) -> bool:
    """Whether a traced tensor is, or is computed from, one of the `marked` tensors. Traced."""
    if not marked or not tf.is_tensor(value) or not hasattr(value, "op"):
        return False
    seen, stack = set(), [value]
    while stack:
        tensor = stack.pop()
        if tensor.ref() in marked:
            return True
        op = tensor.op
        if op.name in seen:
            continue
        seen.add(op.name)
        stack.extend(op.inputs)
    return False
