"""Runs one after the other in one process on 2 replicas (a sweep, a notebook, a Model Garden
task beside a Keras 3 task): Keras 3 or tf_keras, then either, each with its own model, train
as they do alone. Every `MirroredStrategy` numbers its collectives from the same keys, and the
collective runtime remembers each key's shape for the process's life, so the second run's
strategy must get keys of its own (`compat.own_collective_keys`)."""

import numpy as np
import pytest
import tensorflow as tf

from orbitask.trainers import run_experiment
from orbitask.trainers.distribution.strategies import build_strategy
from tests.helpers import TinyTask, keras_module


class Sized(TinyTask):
    """TinyTask with a hidden layer of `width` units (so its gradients have another size)."""

    def __init__(self, width, **kwargs):
        super().__init__(n=40, **kwargs)
        self.width = width

    def build_model(self):
        k = keras_module(self.flavour)
        return k.Sequential([k.Input((6,)), k.layers.Dense(self.width), k.layers.Dense(3)])


def _train(model_dir, flavour, width):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    return run_experiment(
        Sized(width, flavour=flavour), str(model_dir), mode="train_and_eval", train_steps=10,
        steps_per_loop=5, eval_interval=5, global_batch_size=8, learning_rate=0.05,
        strategy=strategy, progress=False,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "first, second",
    [("keras", "keras"), ("keras", "tf_keras"), ("tf_keras", "keras"), ("tf_keras", "tf_keras")],
)
def test_a_run_of_either_flavour_after_either(tmp_path, first, second):
    _train(tmp_path / "first", first, 8)
    logs = _train(tmp_path / "second", second, 16)
    assert np.isfinite(logs["train"]["loss"]) and np.isfinite(logs["eval"]["loss"])


def test_each_mirrored_strategy_reduces_under_keys_of_its_own():
    """Three strategies in turn all-reduce tensors of three shapes under their first key."""
    for shape in ([484], [1], [7, 3]):
        strategy = build_strategy(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))

        @tf.function
        def reduce(strategy=strategy, shape=shape):
            context = lambda: tf.distribute.get_replica_context()  # noqa: E731
            return strategy.run(lambda: context().all_reduce("sum", tf.ones(shape)))

        values = strategy.experimental_local_results(reduce())
        assert [v.shape.as_list() for v in values] == [shape, shape]
        np.testing.assert_array_equal(values[0], np.full(shape, 2.0))
