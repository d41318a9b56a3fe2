"""A task whose train_step is its own owns its batch, its model and its loss: no build_losses, no
(inputs, labels) batches, and no Input layer needed (a dry step builds the weights)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from orbitask import Task, run_experiment


class OwnStep(Task):
    """Dict batches, a model without an Input layer, a loss inside the step."""

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        rng = np.random.RandomState(0)
        x = rng.normal(size=(64, 5)).astype(np.float32)
        ds = tf.data.Dataset.from_tensor_slices({"x": x, "y": x.sum(axis=1, keepdims=True)})
        return ds.repeat().batch(per_replica_batch_size, drop_remainder=True)

    def build_model(self):
        self.model = keras.Sequential([keras.layers.Dense(8, "tanh"), keras.layers.Dense(1)])
        return self.model

    def build_optimizer(self, learning_rate):
        return keras.optimizers.SGD(0.05)

    def build_metrics(self, training=True):
        return [keras.metrics.Sum("steps_seen")]

    def train_step(self, batch, model, optimizer, metrics=None, *, loss_fn, lr, global_batch_size):
        with tf.GradientTape() as tape:
            error = model(batch["x"], training=True) - batch["y"]
            loss = tf.nn.compute_average_loss(
                tf.square(error[:, 0]), global_batch_size=global_batch_size
            )
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        metrics[0].update_state(1.0)
        return {"loss": loss}

    replica_logs = "sum"

    def every_steps(self):
        return {}


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_a_step_of_its_own_trains_without_the_default_steps_demands(tmp_path, strategy):
    task = OwnStep()
    logs = run_experiment(
        task, str(tmp_path), mode="train", train_steps=30, global_batch_size=8,
        strategy=strategy, progress=False, loop_seconds=None, steps_per_loop=30,
    )  # fmt: skip
    assert task.model.built and len(task.model.trainable_variables) == 4
    assert np.isfinite(logs["train"]["loss"]) and logs["train"]["loss"] < 1.0
    replicas = 2 if strategy == "mirrored" else 1
    assert logs["train"]["steps_seen"] == 30.0 * replicas  # the loop's steps, not the dry step
