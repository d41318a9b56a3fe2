"""Gradient handling of the default step: the all-reduce, the non-finite fix, clipping, the norm.

All traced by tf.function, per replica. `zero_nans_and_clip` is the default `Task.update_pre`:
non-finite entries (NaN, +Inf, -Inf) become 0, then the gradient is clipped to a global norm (the
seed's behaviour, extended from NaN to every non-finite entry). A non-finite entry makes the global
norm non-finite, so the per-element fix runs under a `tf.cond` only then, instead of a `tf.where`
on every gradient at every step. Finite entries whose squares overflow float32 make the norm
infinite too; that same rare branch then computes the norm and the clip on the gradients divided
by their largest magnitude, so the clipped gradients are finite and point the same way.

While a run counts them (`counting_zeroed`), that rare branch also adds 1 to a counter for each
step whose gradient had a non-finite entry set to 0: no work at a step that has none.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

_zeroed: tf.Variable | None = None  # the steps with entries set to 0, while a run counts them


@contextlib.contextmanager
def counting_zeroed(counter: tf.Variable) -> Iterator[None]:
    """While open, each step traced with the default update adds 1 to `counter` (an int64
    variable of no strategy) when its gradient had a non-finite entry that it set to 0. The
    first replica counts (every replica holds the same all-reduced gradient). Eager, around the
    steps' tracing; yields None."""
    global _zeroed
    _zeroed = counter
    try:
        yield
    finally:
        _zeroed = None


@tf.autograph.experimental.do_not_convert
def _counter() -> tf.Variable | None:
    """The open counter, where this replica is the first; else None. Traced."""
    if _zeroed is None:
        return None
    context = tf.distribute.get_replica_context()
    replica = tf.get_static_value(context.replica_id_in_sync_group) if context else 0
    return _zeroed if replica == 0 else None


class Gradients(list):
    """A list of gradients that may know its global norm (`global_norm`, a tensor, or None).

    `zero_nans_and_clip` returns its display gradients as one, so the `grad_norm` log reuses
    the norm it clipped with.
    """

    global_norm = None


@tf.autograph.experimental.do_not_convert
def zero_nans_and_clip(gradients: list, clip_norm: float | None) -> tuple[list, list]:
    """Non-finite entries -> 0, then a clip to global norm `clip_norm` (None: no clip). Traced.

    Returns `(update_gradients, display_gradients)`, None entries kept in place (IndexedSlices
    too: their values are fixed). The update gradients are finite. The display list (the
    gradients after the non-finite fix, before the clip) is a `Gradients` carrying its global
    norm, the `grad_norm` log: the true norm, computed without overflow, and +Inf only when that
    norm itself exceeds the float32 range (e.g. two entries of 3e38); never clamped.
    """
    present = [g for g in gradients if g is not None]
    if not present:
        return list(gradients), list(gradients)
    norm = _norm(present)
    # The rare branch runs as one function call: inlined, its ops would each be visited (as
    # dead) at every step that does not take it, a cost of a few percent on a small model.
    fixing = functools.partial(_finite_and_clipped, counter=_counter())
    rare = tf.function(fixing, autograph=False,
                       experimental_attributes={"_noinline": True})  # fmt: skip
    present, clipped, norm = tf.cond(
        tf.math.is_finite(norm),
        lambda: (present, _clip(present, clip_norm, norm), norm),
        lambda: rare(present, clip_norm),
    )
    it = iter(present)
    display = Gradients(None if g is None else next(it) for g in gradients)
    display.global_norm = norm
    if clip_norm is None:
        return display, display
    it = iter(clipped)
    return [None if g is None else next(it) for g in display], display


@tf.autograph.experimental.do_not_convert
def global_norm(gradients: list) -> tf.Tensor:
    """Returns the global norm of `gradients` (None entries skipped; 0 for none). Traced.

    A `Gradients` list that knows its norm returns it without computing it again.
    """
    norm = getattr(gradients, "global_norm", None)
    if norm is not None:
        return norm
    present = [g for g in gradients if g is not None]
    return _norm(present) if present else tf.constant(0.0)


@tf.autograph.experimental.do_not_convert
def all_reduce_sum(gradients: list) -> list:
    """Returns the gradients summed over replicas (replica context, traced); None stays None.

    An `IndexedSlices` gradient (an embedding's) stays one: the replicas' rows are gathered,
    each row kept, as one device's gradient of the whole batch has a row per lookup. The
    optimizer then applies it sparsely, as Keras `fit` does.
    """
    context = tf.distribute.get_replica_context()
    present = [(i, g) for i, g in enumerate(gradients) if g is not None]
    if not present or context.num_replicas_in_sync == 1:
        return list(gradients)
    reduced = context.all_reduce(tf.distribute.ReduceOp.SUM, [g for _, g in present])
    out = list(gradients)
    for (i, _), g in zip(present, reduced, strict=True):
        out[i] = g
    return out


@tf.autograph.experimental.do_not_convert
def add(total: list | None, gradients: list) -> list:
    """`total + gradients` by variable (None: no gradient); `total` None starts the sum. Traced.

    Two `IndexedSlices` are joined row by row (a gradient of both batches at once)."""
    if total is None:
        return list(gradients)
    return [
        a if b is None else (b if a is None else _sum(a, b))
        for a, b in zip(total, gradients, strict=True)
    ]


@tf.autograph.experimental.do_not_convert
def _sum(a: Any, b: Any) -> Any:
    """`a + b`; two `IndexedSlices` concatenated, a mix of kinds made dense. Traced."""
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        values = tf.concat([a.values, b.values], 0)
        return tf.IndexedSlices(values, tf.concat([a.indices, b.indices], 0), a.dense_shape)
    return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)


@tf.autograph.experimental.do_not_convert
def _norm(gradients: list) -> tf.Tensor:
    """The global norm of the gradients as dense tensors: an `IndexedSlices`' rows of one
    index are summed first, without making it dense. Traced."""
    return tf.linalg.global_norm([_rows_summed(g) for g in gradients])


@tf.autograph.experimental.do_not_convert
def _rows_summed(g: Any) -> Any:
    """An `IndexedSlices`' values with the rows of each index summed (one row an index)."""
    if not isinstance(g, tf.IndexedSlices):
        return g
    unique, position = tf.unique(g.indices)
    return tf.math.unsorted_segment_sum(g.values, position, tf.shape(unique)[0])


@tf.autograph.experimental.do_not_convert
def all_finite(gradients: list) -> tf.Tensor:
    """A boolean scalar: every gradient entry (None gradients skipped) is finite. Traced."""
    checks = [tf.reduce_all(tf.math.is_finite(_values(g))) for g in gradients if g is not None]
    return tf.reduce_all(checks) if checks else tf.constant(True)


@tf.autograph.experimental.do_not_convert
def unscale(gradients: list, loss_scale: Any) -> list:
    """float32 gradients divided by the float16 loss scale (None ones kept). Traced."""
    return [None if g is None else tf.cast(g, tf.float32) / loss_scale for g in gradients]


@tf.autograph.experimental.do_not_convert
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


@tf.autograph.experimental.do_not_convert
def _values(g: Any) -> tf.Tensor:
    """A gradient's entries: the values of an IndexedSlices, else the tensor itself."""
    return g.values if isinstance(g, tf.IndexedSlices) else g


@tf.autograph.experimental.do_not_convert
def _map(fn: Callable, g: Any) -> Any:
    """`fn` applied to a gradient's entries, an IndexedSlices kept as one."""
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(fn(g.values), g.indices, g.dense_shape)
    return fn(g)


@tf.autograph.experimental.do_not_convert
def _clip(gradients: list, clip_norm: float | None, norm: tf.Tensor) -> list:
    """`tf.clip_by_global_norm` with the known, finite `norm` (None: no clip). Traced."""
    if clip_norm is None:
        return gradients
    clipped, _ = tf.clip_by_global_norm(gradients, clip_norm, use_norm=norm)
    return clipped


@tf.autograph.experimental.do_not_convert
def _finite_and_clipped(
    gradients: list, clip_norm: float | None, counter: tf.Variable | None = None
) -> tuple[list, list, tf.Tensor]:
    """The rare branch: `(fixed, clipped, norm)`, NaN and +-Inf entries set to 0, and 1 added
    to `counter` (None: none) when there was such an entry. Traced.

    When the fixed gradients' squares still overflow, the norm and the clip come from the
    gradients divided by their largest magnitude (`_rescaled_clip`).
    """
    if counter is not None:
        counter.assign_add(tf.cast(tf.logical_not(all_finite(gradients)), tf.int64))
    fixed = [
        _map(lambda v: tf.where(tf.math.is_finite(v), v, tf.zeros_like(v)), g) for g in gradients
    ]
    norm = _norm(fixed)
    clipped, norm = tf.cond(
        tf.math.is_finite(norm),
        lambda: (_clip(fixed, clip_norm, norm), norm),
        lambda: _rescaled_clip(fixed, clip_norm),
    )
    return fixed, clipped, norm


@tf.autograph.experimental.do_not_convert
def _rescaled_clip(gradients: list, clip_norm: float | None) -> tuple[list, tf.Tensor]:
    """`(clipped, norm)` of finite gradients whose sum of squares overflows. Traced.

    Divided by their largest magnitude, the entries lie in [-1, 1] and the norm of that is at
    least 1 and finite; `norm` is it times the largest magnitude (+Inf past the float32 range).
    The clip multiplies the divided entries by `clip_norm / unit_norm`: no overflow, and no
    factor so small that it is flushed to 0.
    """
    largest = tf.reduce_max(
        tf.stack([tf.maximum(tf.reduce_max(tf.abs(_values(g))), 0) for g in gradients])
    )
    unit = [_map(lambda v: v / largest, g) for g in gradients]
    unit_norm = _norm(unit)
    norm = largest * unit_norm
    if clip_norm is None:
        return gradients, norm
    factor = clip_norm / unit_norm
    scaled = [_map(lambda v: v * factor, u) for u in unit]
    return tf.cond(norm > clip_norm, lambda: scaled, lambda: gradients), norm
