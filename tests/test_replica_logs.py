"""An overridden train_step's logs report the same loss on 1 device and on 2 replicas, for the
conventions of Keras' guides (each replica's mean, `replica_logs = "mean"`) and of TensorFlow's
custom-training tutorial (each replica's sum over the global batch, `replica_logs = "sum"`), and,
with no convention set, for logs made by Keras 3 loss objects (which divide by the replica count
under tf.distribute) or `tf.nn.compute_average_loss` beside plain means."""

import keras
import pytest
import tensorflow as tf

from orbitask import ConfigError, run_experiment
from tests.helpers import TinyTask


class KerasStyle(TinyTask):
    def train_step(self, batch, model, optimizer, metrics=None, *, loss_fn, lr, global_batch_size):
        inputs, labels = batch
        logits = model(inputs, training=False)
        per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        return {"loss": tf.reduce_mean(per_example)}  # the replica's own batch


class TutorialStyle(KerasStyle):
    replica_logs = "sum"

    def train_step(self, batch, model, optimizer, metrics=None, *, loss_fn, lr, global_batch_size):
        inputs, labels = batch
        logits = model(inputs, training=False)
        per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        return {
            "loss": tf.nn.compute_average_loss(per_example, global_batch_size=global_batch_size)
        }


class TutorialUndeclared(TutorialStyle):
    replica_logs = None


class KerasLossObject(KerasStyle):
    """The Keras custom-loop guide's way: a Keras 3 loss object, and a plain mean beside it."""

    def train_step(self, batch, model, optimizer, metrics=None, *, loss_fn, lr, global_batch_size):
        inputs, labels = batch
        logits = model(inputs, training=False)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits)
        return {"loss": loss + 0.0, "mean_logit": tf.reduce_mean(logits)}


def _logs(tmp_path, task_cls, strategy):
    logs = run_experiment(
        task_cls(), str(tmp_path / strategy), mode="train", train_steps=1, global_batch_size=8,
        strategy=strategy, progress=False,
    )  # fmt: skip
    return logs["train"]


def _loss(tmp_path, task_cls, strategy):
    logs = run_experiment(
        task_cls(), str(tmp_path / strategy), mode="train", train_steps=1, global_batch_size=8,
        strategy=strategy, progress=False,
    )  # fmt: skip
    return logs["train"]["loss"]


@pytest.mark.parametrize("task_cls", [KerasStyle, TutorialStyle, TutorialUndeclared])
def test_one_device_and_two_replicas_report_the_same_loss(tmp_path, task_cls):
    one = _loss(tmp_path, task_cls, "one_device")
    two = _loss(tmp_path, task_cls, "mirrored")
    assert two == pytest.approx(one, rel=1e-5)


def test_keras_loss_objects_are_summed_and_plain_means_averaged(tmp_path):
    one = _logs(tmp_path, KerasLossObject, "one_device")
    two = _logs(tmp_path, KerasLossObject, "mirrored")
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5)
    assert two["mean_logit"] == pytest.approx(one["mean_logit"], rel=1e-5)


def test_an_unknown_combination_is_one_line(tmp_path):
    class Wrong(KerasStyle):
        replica_logs = "max"

    with pytest.raises(ConfigError, match=r"`Wrong.replica_logs` must be None, 'mean' or 'sum'"):
        _loss(tmp_path, Wrong, "one_device")
