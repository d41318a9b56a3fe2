"""A loss may return per-example losses (shape [batch], `reduction="none"`), their sum, or a mean
on a Task that says so (`loss_reduction = "mean"`): a plain mean, or a Keras 3 loss object's
(which Keras divides by the replica count under tf.distribute; the run measures that and
multiplies it back). All train the same weights, on 1 device and on 2 replicas, and report the
same train and evaluation loss, an evaluation-only run included. A mean not declared is refused
before any work: it would train with a 1/batch gradient."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from orbitask import run_experiment
from orbitask.trainers import ConfigError
from tests.helpers import TinyTask


class Summed(TinyTask):
    def build_model(self):
        self.model = super().build_model()
        return self.model


class PerExample(Summed):
    def build_losses(self):
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
        return lambda pair: loss(pair[1], pair[0])


class KerasMean(Summed):
    loss_reduction = "mean"

    def build_losses(self):
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        return lambda pair: loss(pair[1], pair[0])


class PlainMean(Summed):
    def build_losses(self):
        def loss_fn(pair):
            logits, labels = pair
            losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
            return tf.reduce_mean(losses)

        return loss_fn


class DeclaredMean(PlainMean):
    loss_reduction = "mean"


class UndeclaredKerasMean(KerasMean):
    loss_reduction = "sum"


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_per_example_and_summed_losses_train_the_same(tmp_path, strategy):
    results = {}
    for cls in (Summed, PerExample, KerasMean, DeclaredMean):
        task = cls(shuffle=True)
        logs = run_experiment(
            task, str(tmp_path / cls.__name__), mode="train_and_eval", train_steps=6,
            global_batch_size=8, learning_rate=0.05, eval_interval=None, strategy=strategy,
            progress=False,
        )  # fmt: skip
        results[cls] = ([w.numpy() for w in task.model.weights], logs)
    summed, summed_logs = results[Summed]
    for cls in (PerExample, KerasMean, DeclaredMean):
        weights, logs = results[cls]
        for a, b in zip(summed, weights, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        assert logs["train"]["loss"] == pytest.approx(summed_logs["train"]["loss"], rel=1e-5)
        assert logs["eval"]["loss"] == pytest.approx(summed_logs["eval"]["loss"], rel=1e-5)
        assert np.ndim(logs["eval"]["loss"]) == 0
    if strategy == "mirrored":  # an evaluation-only run measures the loss on its own
        evaluated = run_experiment(
            KerasMean(shuffle=True), str(tmp_path / "KerasMean"), mode="eval", train_steps=6,
            global_batch_size=8,
            strategy=strategy, progress=False,
        )  # fmt: skip
        assert evaluated["eval"]["loss"] == pytest.approx(summed_logs["eval"]["loss"], rel=1e-5)


@pytest.mark.parametrize("cls", [PlainMean, UndeclaredKerasMean])
@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_a_mean_not_declared_is_refused_in_one_line_before_any_work(tmp_path, strategy, cls):
    with pytest.raises(ConfigError) as error:
        run_experiment(
            cls(), str(tmp_path), mode="train", train_steps=6, global_batch_size=8,
            strategy=strategy, progress=False,
        )  # fmt: skip
    line = str(error.value).splitlines()[0]
    assert line.startswith(f"{cls.__name__}'s loss is a mean over the batch"), line
    assert "1/8 gradient" in line and "loss_reduction = 'mean'" in line
    assert not list(tmp_path.glob("ckpt-*"))
