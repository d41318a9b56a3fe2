"""Small real tasks for tests: a tiny Dense classifier in either Keras flavour."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
import tf_keras

from orbitask.tasks import Task


def keras_module(flavour: str):
    return tf_keras if flavour == "tf_keras" else keras


class TinyTask(Task):
    """3 classes from 6 features; optional L2; data in a fixed order (optionally shuffled)."""

    def __init__(self, flavour="keras", l2=0.01, shuffle=False, n=96, seed=0, **kwargs):
        super().__init__(**kwargs)
        self.flavour, self.l2, self.shuffle, self.seed = flavour, l2, shuffle, seed
        rng = np.random.RandomState(seed)
        self.x = rng.normal(size=(n, 6)).astype(np.float32)
        self.y = (self.x[:, 0] + 2 * self.x[:, 1] > 0).astype(np.int32) + (self.x[:, 2] > 1).astype(
            np.int32
        )

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ds = tf.data.Dataset.from_tensor_slices((self.x, self.y))
        if training:
            if self.shuffle:
                ds = ds.shuffle(64, seed=self.seed)
            ds = ds.repeat()
        return ds.batch(per_replica_batch_size, drop_remainder=training)

    def build_model(self):
        k = keras_module(self.flavour)
        reg = k.regularizers.L2(self.l2) if self.l2 else None
        init = k.initializers.GlorotUniform(seed=1)
        return k.Sequential(
            [
                k.Input((6,)),
                k.layers.Dense(
                    8, activation="tanh", kernel_regularizer=reg, kernel_initializer=init
                ),
                k.layers.Dense(3, kernel_initializer=k.initializers.GlorotUniform(seed=2)),
            ]
        )

    def build_losses(self):
        def loss_fn(loss_input):
            logits, labels = loss_input
            return tf.reduce_sum(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
            )

        return loss_fn

    def build_metrics(self, training=True):
        return [keras.metrics.SparseCategoricalAccuracy("accuracy")]


class Recorder:
    """A plain-Python callback recording (step, logs) after every step it is due at."""

    def __init__(self):
        self.calls = []

    def __call__(self, task, ctx):
        self.calls.append((ctx.step, dict(ctx.logs)))


def weights(model) -> list[np.ndarray]:
    return [np.array(v) for v in model.weights]


def checkpoint_weights(task, model_dir) -> list[np.ndarray]:
    """The model weights in the latest checkpoint of `model_dir`, restored into a fresh model.

    (Keys alone do not tell: a variable is stored once, under the first path the checkpoint
    finds, which may be the optimizer's reference to it.)
    """
    model = task.build_model()
    path = tf.train.latest_checkpoint(str(model_dir))
    tf.train.Checkpoint(train_model=model).restore(path).expect_partial()
    values = weights(model)
    assert values, "the model has no weights"
    return values
