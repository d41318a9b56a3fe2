"""One step's batches: this worker's iterator's elements handed to its local replicas
(`ReplicaBatches`), partial batches included."""

from __future__ import annotations

import tensorflow as tf

from orbitask.trainers.engine.epochs import partial_elements
from orbitask.trainers.engine.inputs import local_replicas


class ReplicaBatches:
    """Takes one step's elements from this worker's iterator and hands them to its replicas.

    One element per local replica (local replica r gets the r-th); with gradient accumulation K,
    K rounds of that, and a replica gets the tuple of its K micro-batches. Multi-worker: each
    worker's iterator holds only its own replicas' batches (`trainers.engine.inputs`). Traced.

    Partial batches (a dataset batched without `drop_remainder`, whose batch dimension is
    unknown): an element smaller than `per_replica_batch_size` ends the step's examples, as the
    last, partial batch of an epoch ends one device's batch, and the elements after it are not
    taken; the examples taken are then split evenly over the step's slots in their order. So
    each step holds the examples one device's batch of the global size holds, the following
    steps stay aligned with one device's, and the default step normalises by that real count.
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        accumulation: int,
        per_replica_batch_size: int | None = None,
    ):
        self.strategy = strategy
        self.accumulation = accumulation
        self.local = local_replicas(strategy)
        self.per_replica = per_replica_batch_size

    def __call__(self, iterator):
        count, k = self.local, self.accumulation
        slots = count * k
        if slots > 1 and self._may_be_partial(iterator):
            flat = self._take_until_partial(iterator, slots)
        else:
            flat = [next(iterator) for _ in range(slots)]
        rounds = [flat[i * count : (i + 1) * count] for i in range(k)]
        if count == 1:
            return rounds[0][0] if k == 1 else tuple(r[0] for r in rounds)

        def for_replica(ctx):
            replica = ctx.replica_id_in_sync_group % count
            return rounds[0][replica] if k == 1 else tuple(r[replica] for r in rounds)

        return self.strategy.experimental_distribute_values_from_function(for_replica)

    def _may_be_partial(self, iterator) -> bool:
        """Whether the elements' leading dimension is unknown (dense tensors only). Traced."""
        spec = getattr(iterator, "element_spec", None)
        if self.per_replica is None or spec is None:
            return False
        return partial_elements(spec)

    def _take_until_partial(self, iterator, slots: int) -> list:
        """`slots` elements: taken while the ones before were full, then empty. Traced."""

        def size(element):
            return tf.shape(tf.nest.flatten(element)[0])[0]

        first = next(iterator)
        taken = [first]
        full = size(first) >= self.per_replica
        for _ in range(slots - 1):
            element = tf.cond(
                full,
                lambda: next(iterator),
                lambda: tf.nest.map_structure(lambda t: t[:0], first),
            )
            taken.append(element)
            full = tf.logical_and(full, size(element) >= self.per_replica)

        def split_evenly():
            joined = tf.nest.map_structure(lambda *parts: tf.concat(parts, 0), *taken)
            examples = size(joined)
            bounds = [(i * examples) // slots for i in range(slots + 1)]
            return [
                tf.nest.map_structure(lambda t, i=i: t[bounds[i] : bounds[i + 1]], joined)
                for i in range(slots)
            ]

        return tf.cond(full, lambda: list(taken), split_evenly)
