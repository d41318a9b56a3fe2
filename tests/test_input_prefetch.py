"""The training input's prefetch buffer is saved in every checkpoint, so it must stay bounded.

An autotuned `prefetch(tf.data.AUTOTUNE)` doubles its buffer whenever the loop finds it empty;
orbitask replaces one that ends the training pipeline by `prefetch(Task.train_prefetch)`.
"""

from __future__ import annotations

import logging

import numpy as np
import tensorflow as tf

from tests.helpers import TinyTask
from trainers import inputs


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
    assert inputs.autotuned_prefetches(autotuned) == 1

    bounded = inputs.bound_prefetch(autotuned, 2, "TinyTask")

    assert inputs.autotuned_prefetches(bounded) == 0
    assert bounded.options().threading.private_threadpool_size == 3
    np.testing.assert_array_equal(_take(bounded, 60), _take(_pipeline(2), 60))


def test_an_autotuned_prefetch_deeper_in_the_pipeline_is_kept_and_named(caplog):
    deeper = tf.data.Dataset.range(100).prefetch(tf.data.AUTOTUNE).batch(4).repeat()

    with caplog.at_level(logging.WARNING):
        out = inputs.bound_prefetch(deeper, 2, "MyTask")

    assert out is deeper
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        m.startswith("MyTask.build_inputs(training=True) has 1 prefetch(tf.data.AUTOTUNE)")
        for m in warnings
    ), warnings


def test_a_fixed_prefetch_is_left_alone(caplog):
    fixed = _pipeline(4)
    with caplog.at_level(logging.WARNING):
        assert inputs.bound_prefetch(fixed, 2, "TinyTask") is fixed
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


class AutotunedTask(TinyTask):
    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ds = super().build_inputs(per_replica_batch_size, input_context, training)
        return ds.prefetch(tf.data.AUTOTUNE)


def test_the_train_iterator_prefetches_train_prefetch_batches_unless_none():
    strategy = tf.distribute.get_strategy()
    default = inputs.train_iterator(AutotunedTask(), strategy, 16)
    kept = inputs.train_iterator(AutotunedTask(train_prefetch=None), strategy, 16)

    assert inputs.autotuned_prefetches(default._dataset) == 0
    assert inputs.autotuned_prefetches(kept._dataset) == 1
    first = next(default)
    np.testing.assert_array_equal(first[0].numpy(), next(kept)[0].numpy())
