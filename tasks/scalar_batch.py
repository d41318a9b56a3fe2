"""TensorBoard scalar points kept on the host for one summary writer and written in batches.

A traced write costs far more per call than per point, so the train summaries
(`trainers.actions.summaries.LoopSummaryManager`, which owns the train writer's `ScalarBatch`)
and `print_loss` (through `CallbackContext.scalars`) keep their points and write them every few
loops, all tags in one traced call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf
from tensorboard.plugins.scalar import metadata as scalar_metadata


class ScalarBatch:
    """The scalar points `(step, value)` kept per tag for `writer`, and the traced function that
    writes them. Eager, on the host.

    `keep` adds points; `take` removes them for `write` (possibly on another thread);
    `write_kept` does both. A point equal to its tag's last one, kept or already taken, is not
    kept twice (the loop's `loss`, kept by both the summaries and `print_loss`).
    """

    def __init__(self, writer: Any):
        self.writer = writer
        self._kept: dict[str, list[tuple[int, float]]] = {}
        self._taken: dict[str, tuple[int, float]] = {}  # tag -> its last point taken
        self._metadata: dict[str, bytes] = {}
        self._write_fn = None

    def keep(self, tag: str, points: Sequence[tuple[int, float]]) -> None:
        """Keeps scalar points `(step, value)` of `tag` until they are taken. Returns None."""
        kept = self._kept.setdefault(tag, [])
        last = kept[-1] if kept else self._taken.get(tag)
        for point in points:
            if point != last:
                kept.append(point)
                last = point

    def take(self) -> tuple[list, list, list] | None:
        """Removes and returns the kept points as `(tags, steps, values)`, or None if none.

        Host only; `write` writes them (possibly on another thread).
        """
        kept, self._kept = self._kept, {}
        if not kept:
            return None
        self._taken.update({tag: points[-1] for tag, points in kept.items() if points})
        tags, steps, values = [], [], []
        for tag, points in sorted(kept.items()):
            for step, value in points:
                tags.append(tag)
                steps.append(step)
                values.append(value)
        return tags, steps, values

    def write_kept(self, write: bool = True) -> bool:
        """Writes every kept point, all tags in one traced call (or, with `write=False`, drops
        them: a worker that keeps no summaries). Returns whether anything was written."""
        kept = self.take()
        if not write or kept is None:
            return False
        self.write(*kept)
        return True

    def write(self, tags: Sequence[str], steps: Sequence[int], values: Sequence[float]) -> None:
        """Writes scalar `values[i]` of `tags[i]` at `steps[i]` into the writer: one traced call.

        Tags, their metadata and the number of points are inputs, so it is traced once and much
        cheaper than one eager `tf.summary.scalar` a point; zero points write nothing, which
        makes a call with none a warm-up. Safe on a thread other than the training loop's (the
        writer resource serializes its writes); the first call traces, so make it on one
        thread. Returns None.
        """
        if self._write_fn is None:
            self._write_fn = _traced_write(self.writer)
        n = len(tags)
        self._write_fn(
            tf.constant(list(tags), tf.string, shape=[n]),
            tf.constant(steps, tf.int64, shape=[n]),
            tf.constant(values, tf.float32, shape=[n]),
            tf.constant([self._scalar_metadata(tag) for tag in tags], tf.string, shape=[n]),
        )

    def _scalar_metadata(self, tag: str) -> bytes:
        """The serialized TensorBoard scalar-plugin metadata of `tag` (made once per tag)."""
        metadata = self._metadata.get(tag)
        if metadata is None:
            metadata = scalar_metadata.create_summary_metadata(display_name=tag, description="")
            metadata = self._metadata[tag] = metadata.SerializeToString()
        return metadata


def _traced_write(writer: Any) -> Any:
    """The tf.function writing a batch of scalar points `(tags, steps, values, metadata)`."""

    @tf.function(
        input_signature=[
            tf.TensorSpec([None], tf.string),
            tf.TensorSpec([None], tf.int64),
            tf.TensorSpec([None], tf.float32),
            tf.TensorSpec([None], tf.string),
        ]
    )
    def write(tags, steps, values, metadata):
        # `tf.summary.write`, not `scalar`: the loop's name scope would prefix the tag.
        with writer.as_default(), tf.summary.record_if(True):
            for i in tf.range(tf.size(steps)):
                tf.summary.write(tags[i], values[i], step=steps[i], metadata=metadata[i])

    return write
