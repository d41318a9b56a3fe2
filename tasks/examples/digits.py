"""`DigitsClassification`: an MLP on scikit-learn's bundled 8x8 digits (no download needed)."""

from __future__ import annotations

import gin
import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

from orbitask.tasks.base import Task
from orbitask.tasks.indexed_input import IndexedInput


def digits_split(validation_fraction: float = 0.2, seed: int = 0):
    """Returns `((x_train, y_train), (x_val, y_val))`, pixels scaled to [0, 1], a fixed split."""
    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int32)
    order = np.random.RandomState(seed).permutation(len(x))
    n_val = int(round(len(x) * validation_fraction))
    val, train = order[:n_val], order[n_val:]
    return (x[train], y[train]), (x[val], y[val])


def sum_sparse_crossentropy(loss_input):
    """`(logits, labels) -> sum over the batch of softmax cross-entropy`."""
    logits, labels = loss_input
    per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(labels, tf.int32), logits=tf.cast(logits, tf.float32)
    )
    return tf.reduce_sum(per_example)


@gin.configurable("DigitsClassification", module="orbitask")
class DigitsClassification(Task):
    """Classify 8x8 digit images (1,797 of them, 20% held out) with a small Keras 3 MLP.

    Args:
      hidden_units: widths of the hidden ReLU layers.
      l2: L2 regularisation of the hidden kernels (lands in `model.losses`).
      shuffle_buffer: None (default) reads the training examples in a global shuffle by index
        (`orbitask.IndexedInput`: a saved position of a few bytes, resumable on any number of
        workers); a number uses a `tf.data` shuffle buffer of that size instead.
      seed: seed of the split and the shuffle.

    The seed's defaults (clip_norm, optimizer_epsilon, ...) are bound on `orbitask.Task`.
    """

    num_classes = 10  # logits of the last layer (DigitsParity: 2)

    def __init__(
        self,
        hidden_units: tuple = (128, 64),
        l2: float = 0.0,
        shuffle_buffer: int | None = None,
        seed: int = 0,
    ):
        super().__init__()
        self.hidden_units = tuple(hidden_units)
        self.l2 = l2
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self._train, self._val = digits_split(seed=seed)

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        x, y = self._train if training else self._val
        if training and self.shuffle_buffer is None:
            return IndexedInput.from_tensors((x, y), per_replica_batch_size, seed=self.seed)
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        if input_context and input_context.num_input_pipelines > 1:
            ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        if training:
            ds = ds.shuffle(self.shuffle_buffer, seed=self.seed).repeat()
        ds = ds.batch(per_replica_batch_size, drop_remainder=training)
        # A fixed buffer: checkpoints save it, and an autotuned one grows.
        return ds.prefetch(2)

    def build_model(self):
        reg = keras.regularizers.L2(self.l2) if self.l2 else None
        layers = [keras.Input((64,))]
        for units in self.hidden_units:
            layers.append(keras.layers.Dense(units, activation="relu", kernel_regularizer=reg))
        layers.append(keras.layers.Dense(self.num_classes))
        return keras.Sequential(layers, name="digits_mlp")

    def build_losses(self):
        return sum_sparse_crossentropy

    def build_metrics(self, training=True):
        return [keras.metrics.SparseCategoricalAccuracy("accuracy")]
