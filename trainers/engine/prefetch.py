"""The training pipeline's prefetch bound: its final autotuned prefetch made a fixed one.

An autotuned prefetch buffer doubles whenever the loop finds it empty, and every checkpoint
would save it (the train iterator is saved explicitly, buffers included; tf.data's symbolic
checkpointing, which leaves the prefetch buffer out, makes iterating the pipeline slower). A
`prefetch(tf.data.AUTOTUNE)` that ends the training pipeline is replaced by a fixed prefetch
(same elements, same order) of `run_experiment.train_prefetch` steps' elements, more while
they hold under 1 MiB (`Prefetch.min_bytes`, up to 32 steps'), fewer where they would exceed
`run_experiment.train_prefetch_bytes`, never fewer than one step's; one deeper in the pipeline
cannot be, and is named in a warning.

The floor is for fast steps on small elements: on the benchmark MLP (32 KiB batches, about
0.5 ms a step, 2 CPU cores) a 4-deep buffer trains 2-3% slower than an autotuned one and a
16- or 32-deep one as fast (benchmarks/RESULTS.md, "Prefetch depth"), for at most 1 MiB more
in memory and in each saved input position.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import tensorflow as tf
from absl import logging

from orbitask.trainers import data_compat


@dataclasses.dataclass(frozen=True)
class Prefetch:
    """The bound: `steps` steps' elements (None: the autotuned buffer is kept), more while
    they hold under `min_bytes` (at most `MOST_STEPS` steps'), at most `max_bytes` of them
    (None: no byte bound) but at least one step's. `steps` and `max_bytes` are the defaults of
    `run_experiment.train_prefetch` and `train_prefetch_bytes`."""

    steps: int | None = 4
    max_bytes: int | None = 64 * 2**20
    min_bytes: int = 2**20
    MOST_STEPS = 32


DEFAULT_PREFETCH = Prefetch()


def bound_train_prefetch(
    task: Any, dataset: tf.data.Dataset, per_replica: int, per_step: int, prefetch: Prefetch
) -> tf.data.Dataset:
    """`dataset`, the training pipeline whose steps take `per_step` elements of `per_replica`
    examples, with its final autotuned prefetch bounded (module docstring); `dataset` itself
    when `prefetch.steps` is None. Eager, once."""
    if prefetch.steps is None:
        return dataset
    size = element_bytes(dataset.element_spec, per_replica)
    wanted = wanted_elements(size, per_step, prefetch)
    depth = prefetch_depth(size, wanted, per_step, prefetch.max_bytes)
    bounded = bound_prefetch(dataset, depth, type(task).__name__)
    if bounded is not dataset and depth < wanted:
        logging.info(
            "orbitask: prefetching %d training elements of %.1f MiB, not %d "
            "(run_experiment.train_prefetch_bytes).",
            depth,
            size / 2**20,
            wanted,
        )
    return bounded


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


def wanted_elements(size: int | None, per_step: int, prefetch: Prefetch) -> int:
    """`prefetch.steps` steps' elements of `size` bytes (None: unknown), or more: as many as fit
    in `prefetch.min_bytes` (or `max_bytes`, the smaller), at most `Prefetch.MOST_STEPS`
    steps'."""
    wanted = prefetch.steps * per_step
    floor = min(prefetch.min_bytes, prefetch.max_bytes or prefetch.min_bytes)
    if size is None or wanted * size >= floor:
        return wanted
    return max(wanted, min(Prefetch.MOST_STEPS * per_step, floor // max(size, 1)))


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
    top, options = data_compat.strip_options(dataset)
    below = data_compat.autotuned_prefetch_input(top)
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
        if data_compat.autotuned_prefetch_input(node) is not None:
            count += 1
        todo.extend(data_compat.dataset_inputs(node))
    return count
