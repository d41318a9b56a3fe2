"""When checkpoints are written (steps, seconds, end) and what the input position costs in them."""

import os
import time

import numpy as np
import pytest
import tensorflow as tf

from tests.helpers import TinyTask
from trainers import inputs, run_experiment
from trainers.errors import ConfigError


def _saved_steps(model_dir) -> list[int]:
    state = tf.train.get_checkpoint_state(str(model_dir))
    return [int(p.rsplit("-", 1)[1]) for p in state.all_model_checkpoint_paths]


def _train(model_dir, **kwargs):
    settings = dict(mode="train", train_steps=6, global_batch_size=8, steps_per_loop=2)
    settings.update(progress=False, **kwargs)
    run_experiment(TinyTask(), str(model_dir), **settings)
    return _saved_steps(model_dir)


def test_default_saves_only_at_the_end_of_a_short_run(tmp_path):
    assert _train(tmp_path) == [6]  # the time rule (600 s) is not reached


def test_time_rule_saves_after_every_loop_that_ends_late_enough(tmp_path):
    assert _train(tmp_path, checkpoint_seconds=1e-6) == [2, 4, 6]


def test_step_rule_saves_at_multiples_without_the_time_rule(tmp_path):
    assert _train(tmp_path, checkpoint_interval=3, checkpoint_seconds=None) == [3, 6]


@pytest.mark.parametrize("bad", [0, -5, "60", True])
def test_bad_checkpoint_seconds_is_one_line(tmp_path, bad):
    with pytest.raises(ConfigError, match=r"`checkpoint_seconds` must be a positive number"):
        _train(tmp_path, checkpoint_seconds=bad)


class Prefetching(TinyTask):
    """Big batches behind a deep prefetch buffer (or a cache, which has no symbolic state)."""

    def __init__(self, cache=False, **kwargs):
        super().__init__(n=4096, **kwargs)
        self.x = np.tile(self.x, (1, 200))  # 1200 floats an example: ~600 KiB a batch of 128
        self.cache = cache

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ds = tf.data.Dataset.from_tensor_slices((self.x, self.y))
        ds = (ds.cache() if self.cache else ds).repeat().batch(per_replica_batch_size)
        return ds.prefetch(32)


def _iterator_checkpoint_kib(task, tmp_path) -> float:
    iterator = inputs.train_iterator(task, tf.distribute.get_strategy(), 128)
    next(iterator)
    time.sleep(1.0)  # let the prefetch buffer fill
    prefix = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "ckpt"))
    files = tf.io.gfile.glob(prefix + "*")
    return sum(os.path.getsize(f) for f in files) / 1024


def test_input_position_does_not_hold_the_prefetch_buffer(tmp_path):
    # Explicit iterator state holds the prefetched batches of ~600 KiB each (next test).
    assert _iterator_checkpoint_kib(Prefetching(), tmp_path) < 1024


def test_pipeline_without_symbolic_support_keeps_the_explicit_state(tmp_path):
    assert _iterator_checkpoint_kib(Prefetching(cache=True), tmp_path) > 2 * 1024
