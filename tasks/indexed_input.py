"""`IndexedInput`: a training input addressed by example index, whose position is one number.

`build_inputs` may return one instead of a `tf.data.Dataset`. Example `g` of the global stream
(counting from the start of training, across epochs) is source example
`index_shuffle(g % size, seed=[_SEED_PAD, seed, g // size])` (`shuffle=False`: `g % size`): a
global shuffle, new every epoch, with no shuffle buffer. Step s takes the global batch of
examples `[s*B, (s+1)*B)`; replica r (counted over every worker) takes the r-th per-replica
slice of it. Which examples a replica sees is therefore a pure function of the step, the global
batch and the replica's index:

- the saved input position is the count of examples taken (a few bytes), whatever the record size;
- a resumed run continues from the same global example on any number of workers or replicas;
- each worker reads only its own replicas' examples;
- 1 device, N mirrored replicas and N workers with the same global batch see the same batches.

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        return orbitask.IndexedInput.from_tensors(
            (images, labels), per_replica_batch_size, map_fn=augment, seed=7)

`read(index)` turns a source index (an int64 scalar tensor) into an example with TensorFlow ops:
`tf.gather` over in-memory tensors (`from_tensors`), `tf.io.read_file` over a list of files
(`from_files`), or any random-access lookup. A `map_fn` that takes a `seed` keyword gets a
per-example seed (`[seed, g]`, int64) for `tf.random.stateless_*` augmentation, so augmentation
resumes exactly too.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from orbitask.common.errors import ConfigError
from orbitask.common.setting_rules import POSITIVE_INT, require

_SEED_PAD = 498247692  # the first of the shuffle's three seed words, as in index_shuffle


@dataclasses.dataclass
class IndexedInput:
    """A random-access example source, read in a globally shuffled order by example index.

    Args:
      size: examples in one epoch (the source's indices are `0 .. size-1`).
      read: `index -> example`, TensorFlow ops on an int64 scalar.
      batch_size: examples per replica per step (`build_inputs`' `per_replica_batch_size`).
      map_fn: optional `example -> example` (decode, augment), run in parallel, order kept; with
        a `seed` keyword it receives a per-example int64 seed of shape [2].
      seed: the shuffle's seed. Same seed, same order.
      shuffle: False reads the examples in index order (every epoch alike).
      parallel_reads: parallel calls of `read` and `map_fn` (default: tf.data's AUTOTUNE).
      prefetch: batches prefetched at the end of the pipeline.
      read_batch: optional `indices -> batch`, `read` for a vector of indices at once (faster
        for in-memory sources; used when there is no `map_fn`).
    """

    size: int
    read: Callable[[tf.Tensor], Any]
    batch_size: int
    map_fn: Callable | None = None
    seed: int = 0
    shuffle: bool = True
    parallel_reads: int | None = None
    prefetch: int = 2
    read_batch: Callable[[tf.Tensor], Any] | None = None

    def __post_init__(self):
        for name in ("size", "batch_size", "prefetch"):
            require(POSITIVE_INT, getattr(self, name), f"`IndexedInput.{name}`")

    @classmethod
    def from_tensors(cls, tensors: Any, batch_size: int, **kwargs) -> IndexedInput:
        """Returns an input over in-memory arrays (a nest of arrays, one leading example axis).
        Eager."""
        tensors = tf.nest.map_structure(tf.convert_to_tensor, tensors)
        sizes = {int(t.shape[0]) for t in tf.nest.flatten(tensors)}
        if len(sizes) != 1:
            raise ConfigError(
                f"IndexedInput.from_tensors: the arrays have different lengths {sorted(sizes)}."
            )

        def read(index):
            return tf.nest.map_structure(lambda t: tf.gather(t, index), tensors)

        kwargs.setdefault("read_batch", read)
        return cls(size=sizes.pop(), read=read, batch_size=batch_size, **kwargs)

    @classmethod
    def from_files(cls, paths: list[str], labels: Any, batch_size: int, **kwargs) -> IndexedInput:
        """Returns an input of examples `(file bytes, label)`, one file per example (e.g. a
        folder of JPEGs). Eager."""
        paths = tf.constant(list(paths))
        labels = tf.convert_to_tensor(labels)
        if int(paths.shape[0]) != int(labels.shape[0]):
            raise ConfigError(
                f"IndexedInput.from_files: {int(paths.shape[0])} paths but "
                f"{int(labels.shape[0])} labels."
            )

        def read(index):
            return tf.io.read_file(tf.gather(paths, index)), tf.gather(labels, index)

        return cls(size=int(paths.shape[0]), read=read, batch_size=batch_size, **kwargs)

    # ------------------------------------------------------------------------------ indices

    def source_index(self, examples: tf.Tensor) -> tf.Tensor:
        """Returns the source indices of global examples `examples` (an int64 vector). Traced."""
        position, epoch = examples % self.size, examples // self.size
        if not self.shuffle or self.size == 1:
            return position
        words = [tf.constant(_SEED_PAD, tf.int64), tf.constant(self.seed, tf.int64)]
        seeds = tf.stack([tf.fill(tf.shape(position), w) for w in words] + [epoch], axis=1)
        last = tf.fill(tf.shape(position), tf.constant(self.size - 1, tf.int64))
        return tf.raw_ops.RandomIndexShuffle(index=position, seed=seeds, max_index=last, rounds=4)

    def _batches(self, examples: tf.data.Dataset) -> tf.data.Dataset:
        """Vectors of global example numbers -> per-replica batches (read, then `map_fn`)."""
        if self.read_batch is not None and self.map_fn is None:
            return examples.map(lambda e: self.read_batch(self.source_index(e)))
        parallel = self.parallel_reads or tf.data.AUTOTUNE
        seeded = self.map_fn is not None and "seed" in _parameters(self.map_fn)

        def read(example, index):
            item = self.read(index)
            if self.map_fn is None:
                return item
            if seeded:
                return self.map_fn(item, seed=tf.stack([tf.constant(self.seed, tf.int64), example]))
            return self.map_fn(item)

        pairs = examples.map(lambda e: (e, self.source_index(e))).unbatch()
        items = pairs.map(read, num_parallel_calls=parallel, deterministic=True)
        return items.batch(self.batch_size)

    def training_dataset(
        self, start: int, pipeline: Any, pipelines: int, local_replicas: int
    ) -> tf.data.Dataset:
        """Returns the per-replica batches one input pipeline (worker) feeds, from global example
        `start`. Eager (builds the pipeline).

        Each micro-step takes `pipelines * local_replicas * batch_size` examples; this pipeline's
        replicas take their slices in order, `local_replicas` batches per micro-step.
        """
        chunk = local_replicas * self.batch_size
        span = pipelines * chunk
        offset = tf.cast(pipeline, tf.int64) * chunk + start
        within = tf.range(self.batch_size, dtype=tf.int64)

        def examples(t):  # the t-th batch this pipeline feeds
            step, replica = t // local_replicas, t % local_replicas
            return offset + step * span + replica * self.batch_size + within

        batches = self._batches(tf.data.Dataset.range(tf.int64.max).map(examples))
        return batches.prefetch(self.prefetch)

    def evaluation_dataset(self, context: tf.distribute.InputContext | None) -> tf.data.Dataset:
        """Returns every example once, in index order, sharded over input pipelines; the last
        batch may be partial. Eager (builds the pipeline)."""
        indices = tf.data.Dataset.range(self.size)
        if context is not None and context.num_input_pipelines > 1:
            indices = indices.shard(context.num_input_pipelines, context.input_pipeline_id)
        plain = dataclasses.replace(self, shuffle=False, map_fn=_unseeded(self.map_fn))
        return plain._batches(indices.batch(self.batch_size)).prefetch(self.prefetch)

    def as_dataset(self, context: tf.distribute.InputContext | None = None) -> tf.data.Dataset:
        """Returns the training stream as a plain `tf.data.Dataset` from example 0, for composing
        with other datasets (e.g. `tf.data.Dataset.zip`); input pipeline p of P takes batches p,
        p + P, ... Its iterator's saved state holds no shuffle buffer. Eager."""
        if context is None:
            return self.training_dataset(0, 0, 1, 1)
        return self.training_dataset(0, context.input_pipeline_id, context.num_input_pipelines, 1)


def _parameters(fn: Callable) -> dict:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}


def _unseeded(map_fn: Callable | None) -> Callable | None:
    """`map_fn` for evaluation: a seeded one gets a fixed seed (its augmentation is the same at
    every evaluation)."""
    if map_fn is None or "seed" not in _parameters(map_fn):
        return map_fn
    return lambda item: map_fn(item, seed=tf.constant([0, 0], tf.int64))
