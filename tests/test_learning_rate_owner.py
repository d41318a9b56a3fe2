"""The rate a user gives is the rate used: the optimizer's own when run_experiment.learning_rate is
unset, orbitask's setting when set (with one line when the two differ), each optimizer's own in a
dict of optimizers with different rates."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from orbitask import Task, run_experiment


class OneWeight(Task):
    """y = w * x with w starting at 0; the loss is the SUM of (w*x - 1)^2, x = 1: one step moves w
    by exactly lr * 2 * batch / global_batch = 2 * lr (SGD)."""

    def __init__(self, optimizer_fn, **kwargs):
        super().__init__(clip_norm=None, **kwargs)
        self.optimizer_fn = optimizer_fn

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ones = np.ones((8, 1), np.float32)
        ds = tf.data.Dataset.from_tensor_slices((ones, ones))
        return ds.repeat().batch(per_replica_batch_size, drop_remainder=True)

    def build_model(self):
        layer = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")
        self.built = keras.Sequential([keras.Input((1,)), layer])
        return self.built

    def build_losses(self):
        return lambda pair: tf.reduce_sum(tf.square(pair[0] - pair[1]))

    def build_optimizer(self, learning_rate):
        return self.optimizer_fn(learning_rate)

    def every_steps(self):
        return {}


def _train(task, tmp_path, **kwargs):
    settings = dict(mode="train", train_steps=1, global_batch_size=4, progress=False)
    run_experiment(task, str(tmp_path), **{**settings, **kwargs})
    return task


def _weight_after_one_step(tmp_path, optimizer_fn, **kwargs):
    task = _train(OneWeight(optimizer_fn), tmp_path, **kwargs)
    return float(task.built.weights[0].numpy().squeeze())


def test_the_optimizers_own_rate_is_used_when_none_is_set(tmp_path):
    w = _weight_after_one_step(tmp_path, lambda lr: keras.optimizers.SGD(learning_rate=0.5))
    assert w == pytest.approx(2 * 0.5)


def test_the_rate_build_optimizer_receives_is_used(tmp_path):
    w = _weight_after_one_step(tmp_path, lambda lr: keras.optimizers.SGD(learning_rate=lr))
    assert w == pytest.approx(2 * 1e-3)


def test_a_set_rate_wins_and_one_line_says_so(tmp_path, capsys):
    w = _weight_after_one_step(
        tmp_path, lambda lr: keras.optimizers.SGD(learning_rate=0.5), learning_rate=0.1
    )
    assert w == pytest.approx(2 * 0.1)
    lines = [line for line in capsys.readouterr().out.splitlines() if "replaces the rate" in line]
    assert lines == [
        "orbitask: run_experiment.learning_rate (0.1) replaces the rate build_optimizer gave the "
        "optimizer (0.5); unset run_experiment.learning_rate to keep the optimizer's."
    ]


class TwoOptimizers(Task):
    """Two Dense models, each with its own SGD; `train_step` moves each by its own optimizer."""

    def __init__(self, rates):
        super().__init__(clip_norm=None)
        self.rates = rates

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ones = np.ones((8, 1), np.float32)
        return tf.data.Dataset.from_tensor_slices(ones).repeat().batch(per_replica_batch_size)

    def build_model(self):
        make = lambda: keras.Sequential(  # noqa: E731
            [keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")]
        )
        self.built = {"g": make(), "d": make()}
        return self.built

    def build_optimizer(self, learning_rate):
        return {k: keras.optimizers.SGD(learning_rate=r) for k, r in self.rates.items()}

    def train_step(self, batch, model, optimizer, metrics=None, *, loss_fn, lr, global_batch_size):
        logs = {}
        for key in ("g", "d"):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(model[key](batch) - 1.0)) / global_batch_size
            grads = tape.gradient(loss, model[key].trainable_variables)
            optimizer[key].apply_gradients(zip(grads, model[key].trainable_variables, strict=True))
            logs[f"{key}_loss"] = loss
        logs["loss"] = logs["g_loss"] + logs["d_loss"]
        return logs

    def build_losses(self):
        return None

    def every_steps(self):
        return {}


@pytest.mark.parametrize("rates", [{"g": 3e-4, "d": 3e-4}, {"g": 0.5, "d": 0.1}])
def test_each_optimizer_in_a_dict_keeps_its_own_rate(tmp_path, rates):
    task = TwoOptimizers(rates)
    _train(task, tmp_path, train_steps=3)
    for key, rate in rates.items():
        w = float(task.built[key].weights[0].numpy().squeeze())
        expected = 0.0
        for _ in range(3):  # SGD on (w - 1)^2 averaged: w += rate * 2 * (1 - w)
            expected += rate * 2 * (1 - expected)
        assert w == pytest.approx(expected, rel=1e-5), key
