"""An overridden train_step's logs report the same loss on 1 device and on 2 replicas, for the
conventions of Keras' guides (each replica's mean, `replica_logs = "mean"` or None) and of
TensorFlow's custom-training tutorial (each replica's share of the global mean, "sum"), and for a
Keras 3 loss object's result beside a plain mean (`{"loss": "sum"}`). TensorFlow's and Keras'
functions stay as they are during a run."""

import keras
import pytest
import tensorflow as tf
from absl import logging

from orbitask import ConfigError, run_experiment
from orbitask.tasks import replica_logs
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


class KerasLossObject(KerasStyle):
    """The Keras custom-loop guide's way: a Keras 3 loss object, and a plain mean beside it."""

    replica_logs = {"loss": "sum"}

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


@pytest.mark.parametrize("task_cls", [KerasStyle, TutorialStyle])
def test_one_device_and_two_replicas_report_the_same_loss(tmp_path, task_cls):
    one = _loss(tmp_path, task_cls, "one_device")
    two = _loss(tmp_path, task_cls, "mirrored")
    assert two == pytest.approx(one, rel=1e-5)


def test_declared_keys_are_summed_and_the_others_averaged(tmp_path):
    one = _logs(tmp_path, KerasLossObject, "one_device")
    two = _logs(tmp_path, KerasLossObject, "mirrored")
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5)
    assert two["mean_logit"] == pytest.approx(one["mean_logit"], rel=1e-5)


def test_an_unknown_combination_is_one_line(tmp_path):
    class Wrong(KerasStyle):
        replica_logs = "max"

    with pytest.raises(ConfigError, match=r"`Wrong.replica_logs` must be None, 'mean', 'sum' or"):
        _loss(tmp_path, Wrong, "one_device")

    class WrongKey(KerasStyle):
        replica_logs = {"loss": "total"}

    with pytest.raises(ConfigError, match=r"`WrongKey.replica_logs` must be None"):
        _loss(tmp_path, WrongKey, "one_device")


def test_an_undeclared_rule_on_several_replicas_is_named_once(tmp_path, monkeypatch):
    warnings = []
    monkeypatch.setattr(logging, "warning", lambda msg, *args: warnings.append(msg % args))
    _loss(tmp_path, TutorialStyle, "mirrored")  # declared: no warning
    assert not [w for w in warnings if "replica_logs" in w]

    class Undeclared(TutorialStyle):
        replica_logs = None

    loss = _loss(tmp_path / "undeclared", Undeclared, "mirrored")
    named = [w for w in warnings if "replica_logs" in w]
    assert len(named) == 1 and named[0].startswith("Undeclared.train_step's logs are averaged")
    assert "the optimizer sums their gradients" in named[0], named[0]
    one = _loss(tmp_path / "undeclared", Undeclared, "one_device")
    assert loss == pytest.approx(one / 2, rel=1e-5)  # averaged shares: what it warns of


def test_the_warning_speaks_of_gradients_and_logs_only_for_an_undeclared_own_step():
    class Undeclared(TutorialStyle):
        replica_logs = None

    text = replica_logs.warning(Undeclared(), 2)
    assert "logs are averaged over the 2 replicas" in text
    assert "a plain tf.reduce_mean) trains with 2x one device's gradients" in text
    assert "divide by global_batch_size" in text and "Keras 3 loss object" in text
    assert "declare Undeclared.replica_logs = 'sum'" in text
    assert replica_logs.warning(Undeclared(), 1) is None
    assert replica_logs.warning(TutorialStyle(), 2) is None  # declared
    assert replica_logs.warning(TinyTask(), 2) is None  # the default step scales its loss


class Watching(TinyTask):
    """The default step; records, as it is traced, the functions in effect."""

    seen: list = []

    def loss_pre(self, outputs, batch, model, lr):
        Watching.seen.append(
            (tf.nn.compute_average_loss, keras.src.losses.loss.scale_loss_for_distribution)
        )
        return super().loss_pre(outputs, batch, model, lr)


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_tensorflow_and_keras_functions_are_the_originals_during_a_run(tmp_path, strategy):
    originals = (tf.nn.compute_average_loss, keras.src.losses.loss.scale_loss_for_distribution)
    Watching.seen = []
    run_experiment(
        Watching(), str(tmp_path), mode="train_and_eval", train_steps=2, global_batch_size=8,
        strategy=strategy, progress=False,
    )  # fmt: skip
    assert Watching.seen and all(seen == originals for seen in Watching.seen)
