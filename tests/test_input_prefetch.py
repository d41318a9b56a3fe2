"""The training input's prefetch buffer is saved in every checkpoint, so it must stay bounded.

An autotuned `prefetch(tf.data.AUTOTUNE)` doubles its buffer whenever the loop finds it empty;
orbitask replaces one that ends the training pipeline by
`prefetch(run_experiment.train_prefetch)` steps' elements (more, up to 1 MiB, for small ones).
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import tensorflow as tf

from orbitask.trainers.engine import inputs, prefetch
from tests.helpers import TinyTask


def _pipeline(prefetch):
    ds = tf.data.Dataset.range(200).shuffle(50, seed=3, reshuffle_each_iteration=False)
    ds = ds.map(lambda x: x * 2, num_parallel_calls=tf.data.AUTOTUNE).repeat()
    return ds.batch(8).prefetch(prefetch)


def _take(dataset, n):
    return np.stack(list(dataset.take(n).as_numpy_iterator()))


def test_a_final_autotuned_prefetch_becomes_fixed_with_the_same_batches_and_options():
    options = tf.data.Options()
    options.threading.private_threadpool_size = 3
    autotuned = _pipeline(tf.data.AUTOTUNE).with_options(options)
    assert prefetch.autotuned_prefetches(autotuned) == 1

    bounded = prefetch.bound_prefetch(autotuned, 2, "TinyTask")

    assert prefetch.autotuned_prefetches(bounded) == 0
    assert bounded.options().threading.private_threadpool_size == 3
    np.testing.assert_array_equal(_take(bounded, 60), _take(_pipeline(2), 60))


def test_an_autotuned_prefetch_deeper_in_the_pipeline_is_kept_and_named(caplog):
    deeper = tf.data.Dataset.range(100).prefetch(tf.data.AUTOTUNE).batch(4).repeat()

    with caplog.at_level(logging.WARNING):
        out = prefetch.bound_prefetch(deeper, 2, "MyTask")

    assert out is deeper
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        m.startswith("MyTask.build_inputs(training=True) has 1 prefetch(tf.data.AUTOTUNE)")
        for m in warnings
    ), warnings


def test_a_fixed_prefetch_is_left_alone(caplog):
    fixed = _pipeline(4)
    with caplog.at_level(logging.WARNING):
        assert prefetch.bound_prefetch(fixed, 2, "TinyTask") is fixed
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


class AutotunedTask(TinyTask):
    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ds = super().build_inputs(per_replica_batch_size, input_context, training)
        return ds.prefetch(tf.data.AUTOTUNE)


def test_the_train_iterator_prefetches_train_prefetch_batches_unless_none():
    strategy = tf.distribute.get_strategy()
    default = inputs.train_iterator(AutotunedTask(), strategy, 16)
    kept = inputs.train_iterator(AutotunedTask(), strategy, 16, prefetch=prefetch.Prefetch(None))

    assert prefetch.autotuned_prefetches(default._dataset) == 0
    assert prefetch.autotuned_prefetches(kept._dataset) == 1
    first = next(default)
    np.testing.assert_array_equal(first[0].numpy(), next(kept)[0].numpy())


def _top_prefetch_depth(iterator) -> int:
    top = iterator._dataset
    while not hasattr(top, "_buffer_size"):  # options datasets on top
        top = top._input_dataset
    return int(tf.get_static_value(top._buffer_size))


def test_two_replicas_prefetch_train_prefetch_steps_of_elements():
    strategy = tf.distribute.MirroredStrategy(
        [d.name for d in tf.config.list_logical_devices("CPU")[:2]]
    )
    assert strategy.num_replicas_in_sync == 2
    steps_only = prefetch.Prefetch(min_bytes=0)  # the 1 MiB floor: the next test
    with strategy.scope():
        two = inputs.train_iterator(AutotunedTask(), strategy, 16, prefetch=steps_only)
        accumulating = inputs.train_iterator(
            AutotunedTask(), strategy, 16, accumulation=3, prefetch=steps_only
        )
        floored = inputs.train_iterator(AutotunedTask(), strategy, 16)

    assert _top_prefetch_depth(two) == 4 * 2
    assert _top_prefetch_depth(accumulating) == 4 * 2 * 3
    assert _top_prefetch_depth(floored) == 32 * 2  # tiny batches: at most 32 steps' elements


class SizedTask(TinyTask):
    """Elements of `per_replica x 128 KiB` (float32 zeros), autotuned prefetch."""

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ds = tf.data.Dataset.from_tensors(tf.zeros([per_replica_batch_size, 32 * 1024]))
        return ds.repeat().prefetch(tf.data.AUTOTUNE)


def test_small_elements_are_prefetched_until_they_hold_a_mebibyte():
    """A 4-step buffer of small elements runs dry between fast steps: below 1 MiB, as many
    elements as make 1 MiB (at most 32 steps'); 4 steps that hold 1 MiB or more stay 4."""
    strategy = tf.distribute.get_strategy()

    def depth(batch: int) -> int:
        return _top_prefetch_depth(inputs.train_iterator(SizedTask(), strategy, batch))

    assert depth(1) == 8  # 128 KiB elements: 8 make 1 MiB
    assert depth(2) == 4  # 256 KiB: the 4 steps already hold 1 MiB
    assert depth(8) == 4  # 1 MiB elements


def test_the_small_element_floor_stays_within_train_prefetch_bytes(caplog):
    """Under a 600 KiB bound, 128 KiB elements fill it with 4 (the 4 steps'): no deeper, and
    no line saying the bound cut the buffer."""
    bound = prefetch.Prefetch(max_bytes=600 * 1024)
    strategy = tf.distribute.get_strategy()
    with caplog.at_level(logging.INFO):
        iterator = inputs.train_iterator(SizedTask(), strategy, 1, prefetch=bound)
    assert _top_prefetch_depth(iterator) == 4
    assert not [r for r in caplog.records if "prefetching" in r.getMessage()]


class BigBatchTask(TinyTask):
    """Batches of `per_replica x 512 x 512` random float32 (1 MiB an example; checkpoints
    compress their buffers, so constant examples would take no room)."""

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        def example(i):
            return tf.random.stateless_uniform([512, 512], seed=tf.stack([i, i]))

        ds = tf.data.Dataset.range(10**6).map(example)
        return ds.batch(per_replica_batch_size).prefetch(tf.data.AUTOTUNE)


def _checkpoint_mib(iterator, directory) -> float:
    # Let the prefetch thread fill its buffer (a few MiB of random numbers: milliseconds) first.
    next(iterator)
    time.sleep(1.0)
    path = tf.train.Checkpoint(iterator=iterator).write(str(directory / "ckpt"))
    return sum(os.path.getsize(f) for f in tf.io.gfile.glob(path + "*")) / 2**20


def test_big_batches_prefetch_fewer_elements_and_their_checkpoints_shrink(tmp_path):
    strategy = tf.distribute.get_strategy()

    # 3 MiB a batch: 4 would be 12 MiB; a 7 MiB bound leaves 2; at least one step's (1) stays.
    def iterator(max_bytes):
        bound = prefetch.Prefetch(max_bytes=max_bytes)
        return inputs.train_iterator(BigBatchTask(), strategy, 3, prefetch=bound)

    bounded, tiny_bound, unbounded = iterator(7 * 2**20), iterator(1), iterator(None)

    assert _top_prefetch_depth(bounded) == 2
    assert _top_prefetch_depth(tiny_bound) == 1
    assert _top_prefetch_depth(unbounded) == 4
    (tmp_path / "one").mkdir()
    (tmp_path / "four").mkdir()
    # A checkpoint holds the prefetched batches and also 1 to 3 more that tf.data keeps in
    # flight, a number that varies from run to run (measured: the 2-deep one saved 12 MiB here
    # and 15 MiB on CI). So only the bound's effect is asserted: the 1-deep buffer's checkpoint
    # is at least one whole batch (3 MiB) smaller than the 4-deep one's.
    four = _checkpoint_mib(unbounded, tmp_path / "four")
    assert four - _checkpoint_mib(tiny_bound, tmp_path / "one") > 2.5


def test_element_bytes_counts_the_batch_and_gives_up_on_unknown_sizes():
    images = tf.TensorSpec([None, 224, 224, 3], tf.uint8)
    labels = tf.TensorSpec([None], tf.int64)
    assert prefetch.element_bytes((images, labels), 32) == 32 * 224 * 224 * 3 + 32 * 8
    assert prefetch.element_bytes({"x": tf.TensorSpec([None, None], tf.float32)}, 8) is None
    assert prefetch.element_bytes(tf.TensorSpec([None], tf.string), 8) is None
    ragged = tf.RaggedTensorSpec([None, None], tf.float32)
    assert prefetch.element_bytes(ragged, 8) is None
    # Unknown size: the step count decides alone.
    assert prefetch.prefetch_depth(None, elements=8, per_step=2, max_bytes=1) == 8
