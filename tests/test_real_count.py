"""N replicas train like one device when batches are partial and when extra losses depend on the
batch: the default step divides by the examples a step really has, a partial element ends the
step's examples as one device's last batch of an epoch does, and `model.losses` count by kind
(weight regularisers once, activity regularisers as means, `add_loss` sums added up)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from orbitask import run_experiment
from tests.helpers import StepRecorder, TinyTask


class EpochBatches(TinyTask):
    """51 examples batched per epoch without `drop_remainder`: every 4th global batch of 16
    has 3 examples (1 and 2 on 2 replicas); SGD, so the update is exactly the gradient."""

    def __init__(self, **kwargs):
        super().__init__(n=51, clip_norm=None, **kwargs)
        self.recorder = StepRecorder()

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ds = tf.data.Dataset.from_tensor_slices((self.x, self.y)).batch(per_replica_batch_size)
        return ds.repeat() if training else ds

    def build_optimizer(self, learning_rate):
        return keras.optimizers.SGD(learning_rate)

    def every_steps(self):
        return {1: self.recorder}


class SumActivity(keras.layers.Layer):
    """The Keras custom-loop guide's layer: `add_loss` of a sum over the batch."""

    def call(self, inputs):
        self.add_loss(1e-2 * tf.reduce_sum(inputs))
        return inputs


class BatchLosses(EpochBatches):
    """Every kind of extra loss: an L2 kernel regulariser, an L1 activity regulariser (a mean
    over the batch in Keras) and the guide's summed `add_loss`."""

    def build_model(self):
        init = keras.initializers.GlorotUniform
        return keras.Sequential(
            [
                keras.Input((6,)),
                keras.layers.Dense(
                    8,
                    activation="tanh",
                    kernel_initializer=init(seed=1),
                    kernel_regularizer=keras.regularizers.L2(0.01),
                    activity_regularizer=keras.regularizers.L1(0.05),
                ),
                SumActivity(),
                keras.layers.Dense(3, kernel_initializer=init(seed=2)),
            ]
        )


def _train(tmp_path, task, strategy, steps=7, batch=16, **settings):
    run_experiment(
        task, str(tmp_path / strategy / str(settings)), mode="train", train_steps=steps,
        global_batch_size=batch, learning_rate=0.1, strategy=strategy, progress=False, **settings,
    )  # fmt: skip
    return task.recorder


def _assert_same_steps(one, two):
    assert sorted(one.steps) == sorted(two.steps)
    np.testing.assert_allclose(
        [s["logs"]["loss"] for s in two.steps.values()],
        [s["logs"]["loss"] for s in one.steps.values()],
        rtol=1e-5,
    )
    for a, b in zip(one.column("weights"), two.column("weights"), strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6)


def test_partial_batches_train_on_two_replicas_as_on_one_device(tmp_path):
    one = _train(tmp_path, EpochBatches(), "one_device")
    _assert_same_steps(one, _train(tmp_path, EpochBatches(), "mirrored"))
    # and with 2 micro-batches of 4 per replica; the 3-example step leaves a slot empty
    accumulated = _train(
        tmp_path, EpochBatches(), "mirrored", batch=8, gradient_accumulation_steps=2
    )
    _assert_same_steps(one, accumulated)


def test_a_partial_batch_is_the_mean_of_its_own_examples(tmp_path):
    """One device: the 3-example step moves the weights as its 2 examples' mean loss says."""
    task = EpochBatches(l2=0.0)
    one = _train(tmp_path, task, "one_device", steps=4)
    before, after = one.steps[3]["weights"], one.steps[4]["weights"]
    model = task.build_model()
    model.set_weights(before)
    x, y = task.x[48:], task.y[48:]
    with tf.GradientTape() as tape:
        logits = model(x, training=True)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
    gradients = tape.gradient(loss, model.trainable_variables)
    for w0, w1, g in zip(before, after, gradients, strict=True):
        np.testing.assert_allclose(w1, w0 - 0.1 * g.numpy(), rtol=1e-5, atol=1e-6)
    assert one.steps[4]["logs"]["loss"] == pytest.approx(float(loss), rel=1e-5)


def test_every_kind_of_extra_loss_counts_on_two_replicas_as_on_one_device(tmp_path):
    one = _train(tmp_path, BatchLosses(), "one_device", steps=4)
    _assert_same_steps(one, _train(tmp_path, BatchLosses(), "mirrored", steps=4))
