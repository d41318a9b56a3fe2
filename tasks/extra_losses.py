"""A model's extra losses (`model.losses`) sorted by how they depend on the batch.

The default `grad_pre` returns them as an `ExtraLoss`, and the default step gives each kind its
own share per replica, so that N replicas count them as one device does: terms independent of
the batch once per step, batch means by the replica's share of the examples, batch sums as they
are. Which layer list each term comes from is read by
`orbitask.common.keras_compat.model_loss_terms`.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from orbitask.common import keras_compat

# How a call-time `add_loss` term that is not an activity regulariser depends on the batch
# (`Task.added_losses`).
ADDED_LOSS_KINDS = ("batch_sum", "batch_mean", "once")


class ExtraLoss:
    """A model's extra losses (`model.losses`) by how they depend on the batch. Traced.

    `once`: terms that do not depend on the batch (weight regularisers), counted once per step.
    `batch_mean`: means over the replica's batch (Keras' activity regularisers, which both
    flavours divide by the batch size), weighted by the replica's share of the examples.
    `batch_sum`: sums over the replica's batch (`add_loss(rate * sum(inputs))`, as in the Keras
    guides), added up over replicas. Each is a float32 scalar or the Python number 0.

    Adding a tensor or a number adds to `once`; as a tensor it is the sum of all three, the one
    device's value of a step on one batch (the seed's `extra_loss`).
    """

    def __init__(self, once: Any = 0.0, batch_mean: Any = 0.0, batch_sum: Any = 0.0):
        self.once = once
        self.batch_mean = batch_mean
        self.batch_sum = batch_sum

    def total(self) -> Any:
        """The sum of the three terms (a tensor, or 0.0 when all are the Python number 0)."""
        return _add_terms([self.once, self.batch_mean, self.batch_sum])

    def __add__(self, other: Any) -> ExtraLoss:
        if isinstance(other, ExtraLoss):
            return ExtraLoss(
                _add_terms([self.once, other.once]),
                _add_terms([self.batch_mean, other.batch_mean]),
                _add_terms([self.batch_sum, other.batch_sum]),
            )
        return ExtraLoss(_add_terms([self.once, other]), self.batch_mean, self.batch_sum)

    __radd__ = __add__

    def __float__(self) -> float:
        return float(self.total())


def _extra_loss_to_tensor(value: ExtraLoss, dtype=None, name=None, as_ref=False) -> tf.Tensor:
    del as_ref
    return tf.convert_to_tensor(value.total(), dtype=dtype, name=name)


tf.register_tensor_conversion_function(ExtraLoss, _extra_loss_to_tensor)


@tf.autograph.experimental.do_not_convert
def extra_losses(model: Any, added_losses: str = "batch_sum") -> ExtraLoss:
    """Returns `model.losses` sorted by kind (`ExtraLoss`), after the model's call. Traced.

    Weight regularisers are `once`, activity regularisers `batch_mean`, and other terms added in
    `call` the kind `added_losses` names. A model of neither Keras flavour, or a dict of models:
    every term of `model.losses` is `once`.
    """
    terms = keras_compat.model_loss_terms(model)
    if terms is None:
        losses = getattr(model, "losses", None) or []
        return ExtraLoss(once=_add_terms(list(losses)))
    weight, activity, added = terms
    kinds = {"once": list(weight), "batch_mean": list(activity), "batch_sum": []}
    kinds[added_losses].extend(added)
    return ExtraLoss(*(_add_terms(kinds[k]) for k in ("once", "batch_mean", "batch_sum")))


@tf.autograph.experimental.do_not_convert
def step_share(extra_loss: Any, once_share: float, share: Any) -> list[tuple[Any, Any]]:
    """`[(term, weight)]`: what this replica's step adds of `extra_loss`, term by term. Traced.

    An `ExtraLoss`'s `once` weighs `1 / once_share` (replicas times micro-batches), its
    `batch_mean` the replica's `share` of the step's examples, its `batch_sum` 1; any other
    value (a tensor or number) counts once per step.
    """
    if isinstance(extra_loss, ExtraLoss):
        return [
            (extra_loss.once, 1.0 / once_share),
            (extra_loss.batch_mean, share),
            (extra_loss.batch_sum, 1.0),
        ]
    return [(extra_loss, 1.0 / once_share)]


@tf.autograph.experimental.do_not_convert
def _add_terms(terms: list) -> Any:
    """The float32 sum of loss terms; the Python number 0.0 when there are none (no op)."""
    tensors = []
    for term in terms:
        if isinstance(term, (int, float)) and not isinstance(term, bool):
            if term == 0:
                continue
        term = tf.cast(term, tf.float32)
        tensors.append(term if term.shape.rank == 0 else tf.reduce_sum(term))
    return tf.add_n(tensors) if tensors else 0.0
