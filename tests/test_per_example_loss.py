"""A loss may return per-example losses (shape [batch], `reduction="none"`), their sum, or a Keras 3
loss object's mean (which Keras divides by the replica count under tf.distribute): all train the
same weights, on 1 device and on 2 replicas, and report the same train and evaluation loss."""

import keras
import numpy as np
import pytest

from orbitask import run_experiment
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
    def build_losses(self):
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        return lambda pair: loss(pair[1], pair[0])


@pytest.mark.parametrize(
    "strategy", ["one_device", pytest.param("mirrored", marks=pytest.mark.slow)]
)
def test_per_example_and_summed_losses_train_the_same(tmp_path, strategy):
    results = {}
    for cls in (Summed, PerExample, KerasMean):
        task = cls(shuffle=True)
        logs = run_experiment(
            task, str(tmp_path / cls.__name__), mode="train_and_eval", train_steps=6,
            global_batch_size=8, learning_rate=0.05, eval_interval=None, strategy=strategy,
            progress=False,
        )  # fmt: skip
        results[cls] = ([w.numpy() for w in task.model.weights], logs)
    summed, summed_logs = results[Summed]
    for cls in (PerExample, KerasMean):
        weights, logs = results[cls]
        for a, b in zip(summed, weights, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        assert logs["train"]["loss"] == pytest.approx(summed_logs["train"]["loss"], rel=1e-5)
        assert logs["eval"]["loss"] == pytest.approx(summed_logs["eval"]["loss"], rel=1e-5)
        assert np.ndim(logs["eval"]["loss"]) == 0
