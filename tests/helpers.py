"""Small real tasks for tests: a tiny Dense classifier and a linear model with a known gradient."""

from __future__ import annotations

import keras
import numpy as np
import orbit
import tensorflow as tf
import tf_keras

from orbitask.tasks import Task


def keras_module(flavour: str):
    return tf_keras if flavour == "tf_keras" else keras


class Killed(BaseException):  # noqa: N818 -- a death, not an error
    """Raised by a test's callback where the process should die: no handler of the run saves on
    it (an `Exception` outside the step is saved first), so it stands for kill -9 there."""


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


class DiesAt(TinyTask):
    """Dies (`Killed`: nothing saves) after step `at`, if given."""

    def __init__(self, at=None, **kwargs):
        super().__init__(**kwargs)
        self.at = at

    def at_step(self):
        if self.at is None:
            return {}

        def die(task, ctx):
            raise Killed(f"died at step {ctx.step}")

        return {self.at: die}


class Recorder:
    """A plain-Python callback recording (step, logs) after every step it is due at, and the
    replica counts of the strategies it ran under (`replicas`, a set)."""

    def __init__(self):
        self.calls = []
        self.replicas = set()

    def __call__(self, task, ctx):
        self.calls.append((ctx.step, dict(ctx.logs)))
        self.replicas.add(ctx.strategy.num_replicas_in_sync)


class LinearTask(Task):
    """`y = x @ w` with w (one weight per column of x) starting at 0, loss `SUM(y * m)`, plain SGD.

    The differentiated value is `SUM(y * m) / global_batch_size`, so each step's gradient of
    `w[j]` is the batch mean of `x[:, j] * m`: with a column of ones and `m` = 1 it is exactly 1,
    and SGD moves that weight by exactly minus the optimizer's rate. Batches are rows in order.
    """

    def __init__(self, x, m=None, flavour="keras", **kwargs):
        super().__init__(**kwargs)
        self.x = np.asarray(x, np.float32)
        self.m = np.ones(len(self.x), np.float32) if m is None else np.asarray(m, np.float32)
        self.flavour = flavour

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ds = tf.data.Dataset.from_tensor_slices((self.x, self.m))
        if training:
            ds = ds.repeat()
        return ds.batch(per_replica_batch_size, drop_remainder=training)

    def build_model(self):
        k = keras_module(self.flavour)
        dense = k.layers.Dense(1, use_bias=False, kernel_initializer="zeros")
        return k.Sequential([k.Input((self.x.shape[1],)), dense])

    def build_losses(self):
        def loss_fn(loss_input):
            outputs, m = loss_input
            return tf.reduce_sum(outputs[:, 0] * tf.cast(m, outputs.dtype))

        return loss_fn

    def build_optimizer(self, learning_rate):
        return keras_module(self.flavour).optimizers.SGD(learning_rate)


def nan_rows(n, rows) -> np.ndarray:
    """LinearTask inputs: two columns of ones, column 1 NaN at `rows`. A step with such a row
    has a NaN loss and a NaN gradient for `w[1]`, while `w[0]`'s gradient stays exactly 1."""
    x = np.ones((n, 2), np.float32)
    x[rows, 1] = np.nan
    return x


class StepRecorder:
    """A plain-Python callback recording, by step, what the optimizer holds after that step.

    `steps[s]` has `logs`, `optimizer_lr` (the optimizer's own rate, not orbitask's `lr`),
    `iterations` (the optimizer's update count), `weights` (the model's) and `replicas`.
    """

    def __init__(self):
        self.steps = {}

    def __call__(self, task, ctx):
        self.steps[ctx.step] = dict(
            logs=dict(ctx.logs),
            optimizer_lr=float(np.array(ctx.optimizer.learning_rate)),
            iterations=int(np.array(ctx.optimizer.iterations)),
            weights=weights(ctx.model),
            replicas=ctx.strategy.num_replicas_in_sync,
        )

    def column(self, name) -> list:
        return [self.steps[s][name] for s in sorted(self.steps)]


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


class StepTrainer(orbit.StandardTrainer):
    """An Orbit trainer whose step only counts: the global step, one element of input a step."""

    def __init__(self):
        self.global_step = orbit.utils.create_global_step()
        super().__init__(tf.data.Dataset.range(4).repeat())

    def train_step(self, iterator):
        next(iterator)
        self.global_step.assign_add(1)
