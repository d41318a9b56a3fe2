"""`orbitask verify`: the digits experiment trains alike on one device and on 2 replicas; a port
whose own step averages its loss per replica, while the optimizer sums gradients, is flagged with
that cause."""

from pathlib import Path

import gin
import keras
import pytest
import tensorflow as tf

from orbitask import DigitsClassification
from orbitask.trainers.commands import cli, verify

DIGITS = str(Path(__file__).resolve().parents[1] / "experiments" / "digits.gin")


@gin.configurable("MeanPerReplica", module="verify_test")
class MeanPerReplica(DigitsClassification):
    """A port of a `GradientTape` loop written for one device: the loss is the mean over this
    replica's batch, and SGD applies the sum of the replicas' gradients."""

    replica_logs = "mean"

    def build_optimizer(self, learning_rate):
        return keras.optimizers.SGD(0.05)

    def train_step(self, batch, model, optimizer, metrics=None, *, loss_fn, lr, global_batch_size):
        x, y = batch
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, True))
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        return {"loss": loss}


def _verify(tmp_path, *params):
    flags = ["verify", f"--gin_file={DIGITS}", "--steps=4"]
    flags += ["--gin_params=orbitask.run_experiment.global_batch_size = 32"]
    return cli.main(flags + [f"--gin_params={p}" for p in params])


@pytest.mark.slow  # two short trainings
def test_the_digits_experiment_trains_alike_on_one_device_and_two_replicas(tmp_path, capsys):
    assert _verify(tmp_path) == 0
    out = capsys.readouterr().out
    assert "orbitask verify: OK: 2 replicas train as one device" in out, out
    assert not list(Path.cwd().glob("ckpt-*"))


@pytest.mark.slow  # two short trainings
def test_a_per_replica_mean_loss_is_flagged_with_its_cause(tmp_path, capsys):
    assert _verify(tmp_path, "TASK = @verify_test.MeanPerReplica()") == 1
    out = capsys.readouterr().out
    assert "orbitask verify: FAILED: 2 replicas do not train as one device" in out, out
    assert "the loss is averaged per replica while the optimizer sums the gradients" in out, out


def test_the_likely_cause_is_named_from_the_differences():
    moved_twice = [("0:dense/kernel", 1.0, 0.01, 2.02), ("1:dense/bias", 0.9, 0.02, 1.97)]
    same_losses = ([1.0, 0.9], [1.0, 0.9])
    assert "averaged per replica while the optimizer sums" in verify.likely_cause(
        moved_twice, same_losses, 2, "Dense"
    )
    moved_alike = [("0:dense/kernel", 0.01, 0.001, 1.0)]
    assert "the logged loss is 2x one device's" in verify.likely_cause(
        moved_alike, ([1.0, 0.9], [2.0, 1.8]), 2, "Dense"
    )
    assert "per-replica batch statistics (BatchNorm)" in verify.likely_cause(
        moved_alike, same_losses, 2, "BatchNormalization (BatchNormalization)"
    )
    assert "not recognised" in verify.likely_cause(moved_alike, same_losses, 2, "Dense")
