"""The position of a training pipeline's shuffle seed generators, saved beside its iterator.

A `tf.data` iterator saved by `trainers.state.input_position.IteratorInput` holds the position of
a reshuffling `shuffle`'s seed generator only inside a live shuffle iterator; `ShuffleSeeds`
saves it at every save, whatever the iterator holds, so a resumed run's epochs come in the same
order.
"""

from __future__ import annotations

import os
import uuid
import weakref
from typing import Any

import tensorflow as tf
from absl import logging

from orbitask.trainers import data_compat

SEEDS = ".shuffle_seeds"  # suffix of the seed generators' checkpoint beside an iterator's


def _say(message: str) -> None:
    logging.info(message)
    print(f"orbitask: {message}", flush=True)


class ShuffleSeeds:
    """The position of the seed generators of a training pipeline's reshuffling `shuffle`s.

    `shuffle(seed=..., reshuffle_each_iteration=True)` draws each epoch's seeds from a generator
    that belongs to the dataset, shared by every iterator over it; a saved iterator holds the
    generator's position only inside a live shuffle iterator. After the last batch of an epoch,
    a step between `shuffle` and `repeat` that has met the end of its input (a `batch` whose last
    batch is short) has dropped the shuffle iterator and `repeat` has not started the next one:
    the saved iterator holds no generator position, and restored, its next epoch takes the seeds
    left after the draws made while building and restoring it, another order. Under a prefetch
    that state is saved whenever the prefetch thread has just taken an epoch's last batch, so
    cut points near the end of an epoch restore another order or not, by timing.

    An idle second iterator over the same dataset saves the generators' position at every save
    and is restored after the training iterator. Eager.
    """

    _kept: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    ATTEMPTS = 3

    def __init__(self, dataset: tf.data.Dataset, iterator: Any):
        fresh = _scratch()
        tf.train.Checkpoint(iterator=iterator).write(fresh)
        try:
            # Building `idle` draws seeds; restoring the fresh iterator into it puts every
            # generator back where `iterator` left it.
            self.idle = iter(dataset)
            tf.train.Checkpoint(iterator=self.idle).read(fresh).assert_consumed()
        finally:
            _remove(fresh)

    @classmethod
    def keep(cls, dataset: tf.data.Dataset, iterator: Any) -> Any:
        """Returns `iterator`, whose saves and restores by `IteratorInput` now carry the seed
        generators' position, when `dataset` has a reshuffling `shuffle` and can be saved."""
        if _reshuffles(dataset):
            try:
                cls._kept[iterator] = cls(dataset, iterator)
            except (tf.errors.OpError, ValueError):  # not savable: `IteratorInput` says so
                pass
        return iterator

    @classmethod
    def of(cls, iterator: Any) -> ShuffleSeeds | None:
        try:
            return cls._kept.get(iterator)
        except TypeError:  # not weakly referable
            return None

    def write(self, prefix: str, iterator: Any, path: str, step: int) -> None:
        """Writes `iterator` to `path` and the generators' position to `prefix`, taken before and
        after it; a prefetch thread that starts an epoch meanwhile makes the two differ, and all
        is taken again."""
        for _ in range(self.ATTEMPTS):
            before, after = _scratch(), _scratch()
            try:
                tf.train.Checkpoint(iterator=self.idle).write(before)
                tf.train.Checkpoint(iterator=iterator).write(path)
                tf.train.Checkpoint(iterator=self.idle).write(after)
                files = _files(before)
                if files == _files(after):
                    for suffix, data in files.items():
                        with tf.io.gfile.GFile(prefix + suffix, "wb") as f:
                            f.write(data)
                    return
            finally:
                _remove(before)
                _remove(after)
        _say(
            f"the input position at step {step} has no shuffle seeds (an epoch started during "
            f"each of {self.ATTEMPTS} saves): resumed there, epochs after the current one may "
            "come in another order."
        )

    def read(self, prefix: str) -> None:
        """Restores the generators' position (after the iterator it was saved with)."""
        if tf.io.gfile.exists(prefix + ".index"):
            tf.train.Checkpoint(iterator=self.idle).read(prefix).assert_consumed()


def _reshuffles(dataset: tf.data.Dataset) -> bool:
    """Whether the pipeline has a `shuffle` that reshuffles each iteration (walks its Python
    datasets)."""
    seen, todo = set(), [dataset]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if getattr(node, "_reshuffle_each_iteration", False) is True:
            return True
        todo.extend(data_compat.dataset_inputs(node))
    return False


def _scratch() -> str:
    return f"ram://orbitask-seeds-{uuid.uuid4().hex}/ckpt"


def _files(prefix: str) -> dict[str, bytes]:
    return {
        name[len(prefix) :]: tf.io.gfile.GFile(name, "rb").read()
        for name in tf.io.gfile.glob(prefix + ".*")
    }


def _remove(prefix: str) -> None:
    folder = os.path.dirname(prefix)
    if tf.io.gfile.exists(folder):
        tf.io.gfile.rmtree(folder)
