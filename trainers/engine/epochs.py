"""Epochs of the training input: one epoch's length in steps, and the partial batches that end
an epoch.

Epochs (`run_experiment.train_epochs`, or `train_steps` None: one epoch): the training input's
size gives the steps (`epoch_length`). A finite `tf.data` dataset (the user does not `.repeat()`
it) is repeated by `trainers.engine.inputs`, after its prefetch is bounded, so the saved iterator
is the repeated one. An epoch of E elements on S slots (local replicas x accumulation) is
`ceil(E / S)` steps when the elements' batch dimension is unknown (batched without
`drop_remainder`): a partial last element ends a step (`replica_batches.ReplicaBatches`), so each
epoch starts a step; exact when the epoch's last element is partial or S divides E (else the
steps run on into the next epoch). With a static batch dimension (`drop_remainder`) the elements
stream on across epochs, and N epochs are `floor(N * E / S)` steps. An `IndexedInput` epoch is
its size in global examples (`input_position.IndexedTrainInput`).
"""

from __future__ import annotations

import fractions
from typing import Any

import tensorflow as tf

from orbitask.trainers import data_compat
from orbitask.trainers.errors import ConfigError
from orbitask.trainers.state.input_position import EpochLength


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


def examples_per_pass(dataset: tf.data.Dataset) -> int | None:
    """The examples in one pass over the data that `dataset` batches after repeating it (as
    `from_tensor_slices(...).repeat().batch(b)`): the size TensorFlow knows of the first finite
    dataset down its chain of inputs, where those elements are single examples (one dimension
    fewer than a batch). None where the chain branches, no such size is known, or the elements
    are batches. Eager; reads only cardinalities and element specs."""
    top = tf.nest.flatten(dataset.element_spec)
    current = dataset
    while int(current.cardinality()) == tf.data.INFINITE_CARDINALITY:
        inputs = data_compat.dataset_inputs(current)
        if len(inputs) != 1:
            return None
        current = inputs[0]
    size, leaves = int(current.cardinality()), tf.nest.flatten(current.element_spec)
    if current is dataset or size < 0 or len(leaves) != len(top):
        return None
    pairs = zip(leaves, top, strict=True)
    unknown = tf.TensorShape(None)
    ranks = [
        (getattr(a, "shape", unknown).rank, getattr(b, "shape", unknown).rank) for a, b in pairs
    ]
    if any(a is None or b is None for a, b in ranks):
        return None
    return size if all(a == b - 1 for a, b in ranks) else None


def say_if_batch_exceeds_data(task: Any, dataset: tf.data.Dataset, batch: int) -> None:
    """Says in one line when a step's `batch` (this input pipeline's examples a step) holds more
    examples than one pass over the repeated data of `dataset` (`examples_per_pass`): each
    example then comes several times in every step. Eager; returns None."""
    examples = examples_per_pass(dataset)
    if examples is None or batch <= examples:
        return
    print(
        f"orbitask: warning: a step's batch of {batch:,} examples is larger than the "
        f"{examples:,} examples of {type(task).__name__}.build_inputs(training=True), so each "
        f"step repeats each example {batch / examples:.1f} times; lower "
        "orbitask.run_experiment.global_batch_size, or check the data.",
        flush=True,
    )


def partial_elements(spec: Any) -> bool:
    """Whether elements of `spec` may be partial batches: dense tensors whose leading dimension
    is unknown (a dataset batched without `drop_remainder`). Eager or traced."""
    leaves = tf.nest.flatten(spec)
    if not leaves or not all(type(s) is tf.TensorSpec and s.shape.rank for s in leaves):
        return False
    return leaves[0].shape[0] is None
