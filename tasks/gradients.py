"""Gradient handling of the default step: the all-reduce, the NaN fix, clipping, the global norm.

All traced by tf.function, per replica. `zero_nans_and_clip` is the default `Task.update_pre`:
NaN entries become 0, then the gradient is clipped to a global norm (the seed's behaviour). A
NaN anywhere makes the global norm NaN, so the per-element fix runs under a `tf.cond` only then,
instead of a `tf.where` on every gradient at every step. The result is the same.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf


class Gradients(list):
    """A list of gradients that may know its global norm (`global_norm`, a tensor, or None).

    `zero_nans_and_clip` returns its display gradients as one, so the `grad_norm` log reuses
    the norm it clipped with.
    """

    global_norm = None


def zero_nans_and_clip(gradients: list, clip_norm: float | None) -> tuple[list, list]:
    """NaN -> 0, then a clip to global norm `clip_norm` (None: no clip). Traced.

    Returns `(update_gradients, display_gradients)`, None entries kept in place; the display
    list (the gradients after the NaN fix) is a `Gradients` carrying its global norm.
    """
    present = [g for g in gradients if g is not None]
    if not present:
        return list(gradients), list(gradients)
    norm = tf.linalg.global_norm(present)
    present, norm = tf.cond(
        tf.math.is_nan(norm), lambda: _zero_nans(present), lambda: (present, norm)
    )
    it = iter(present)
    display = Gradients(None if g is None else next(it) for g in gradients)
    display.global_norm = norm
    if clip_norm is None:
        return display, display
    clipped, _ = tf.clip_by_global_norm(present, clip_norm, use_norm=norm)
    it = iter(clipped)
    return [None if g is None else next(it) for g in display], display


def global_norm(gradients: list) -> tf.Tensor:
    """Returns the global norm of `gradients` (None entries skipped; 0 for none). Traced.

    A `Gradients` list that knows its norm returns it without computing it again.
    """
    norm = getattr(gradients, "global_norm", None)
    if norm is not None:
        return norm
    present = [g for g in gradients if g is not None]
    return tf.linalg.global_norm(present) if present else tf.constant(0.0)


def all_reduce_sum(gradients: list) -> list:
    """Returns the gradients summed over replicas (replica context, traced); None stays None."""
    context = tf.distribute.get_replica_context()
    present = [(i, g) for i, g in enumerate(gradients) if g is not None]
    if not present or context.num_replicas_in_sync == 1:
        return [tf.convert_to_tensor(g) if g is not None else None for g in gradients]
    dense = [tf.convert_to_tensor(g) for _, g in present]
    reduced = context.all_reduce(tf.distribute.ReduceOp.SUM, dense)
    out = list(gradients)
    for (i, _), g in zip(present, reduced, strict=True):
        out[i] = g
    return out


def add(total: list | None, gradients: list) -> list:
    """`total + gradients` by variable (None: no gradient); `total` None starts the sum. Traced."""
    if total is None:
        return list(gradients)
    return [
        a if b is None else (b if a is None else a + b)
        for a, b in zip(total, gradients, strict=True)
    ]


def all_finite(gradients: list) -> tf.Tensor:
    """A boolean scalar: every gradient (None ones skipped) is finite. Traced."""
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in gradients if g is not None])


def unscale(gradients: list, loss_scale: Any) -> list:
    """float32 gradients divided by the float16 loss scale (None ones kept). Traced."""
    return [None if g is None else tf.cast(g, tf.float32) / loss_scale for g in gradients]


def batch_sum(loss: Any) -> Any:
    """A loss as the sum over the batch: per-example losses (shape `[batch]`, TensorFlow's
    `compute_average_loss` convention, e.g. a Keras loss with `reduction="none"`) are summed, a
    scalar is kept. Traced; returns it."""
    if getattr(loss, "shape", None) is not None and loss.shape.rank == 1:
        return tf.reduce_sum(loss)
    return loss


def is_python_zero(value: Any) -> bool:
    """Whether `value` is a Python number equal to 0 (a loss term that needs no op). Eager."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


def _zero_nans(gradients: list) -> tuple[list, tf.Tensor]:
    """The gradients with NaN entries set to 0, and their global norm (traced)."""
    fixed = []
    for g in gradients:
        if isinstance(g, tf.IndexedSlices):
            values = tf.where(tf.math.is_nan(g.values), tf.zeros_like(g.values), g.values)
            fixed.append(tf.IndexedSlices(values, g.indices, g.dense_shape))
        else:
            fixed.append(tf.where(tf.math.is_nan(g), tf.zeros_like(g), g))
    return fixed, tf.linalg.global_norm(fixed)
