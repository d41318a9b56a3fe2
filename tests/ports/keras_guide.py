"""Keras' guide "Writing a training loop from scratch in TensorFlow", its original and its port.

Original: https://keras.io/guides/writing_a_custom_training_loop_in_tensorflow/ (source:
keras-team/keras-io, guides/writing_a_custom_training_loop_in_tensorflow.py), the section "Low-level
handling of losses tracked by the model": a model with an `ActivityRegularizationLayer` that adds
`1e-2 * tf.reduce_sum(inputs)` to `model.losses`, trained by the guide's `tf.function` loop with
the step that adds `sum(model.losses)` to the loss, the guide's `Adam(learning_rate=1e-3)` and
`SparseCategoricalCrossentropy(from_logits=True)`, batch 32 without `drop_remainder`.

Changes in `original()` (the code is otherwise the guide's):
  - data: 100 synthetic examples (`make_data`: 16 features uniform in [0, 1), 10 classes, NumPy
    seed 0) instead of MNIST's 50,000 images of 784 raw pixel values; no validation set;
  - sizes: `Dense` widths 8 instead of 64; 2 epochs;
  - no `shuffle(buffer_size=1024)`: both sides read the examples in order;
  - `keras.utils.set_random_seed(SEED)` before the model is built, so both sides start from the
    same weights;
  - the loop records every step's `loss_value` instead of printing every 100th, and returns it
    with the final weights; the accuracy metric, its per-epoch print and reset are left out.

The port (`KerasGuide`) uses orbitask's default step and overrides only the builders: the
loss is the same Keras loss with `reduction="none"` (per-example losses, which the default step
sums and scales), and `clip_norm=None` turns off the default global-norm clip. The default step
adds `model.losses` itself (`grad_pre`). It logs `loss` (the batch's mean loss plus the extra
losses), recorded at every step by an `every_steps` callback.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

import orbitask
from tests.ports import BATCH_SIZE, EPOCHS, EXAMPLES, SEED, Run, StepLogs, weights_of

FEATURES = 16  # 784 in the guide
UNITS = 8  # 64 in the guide


def make_data() -> tuple[np.ndarray, np.ndarray]:
    """`EXAMPLES` inputs of `FEATURES` values in [0, 1) and their labels in 0..9 (seeded)."""
    rng = np.random.RandomState(SEED)
    x = rng.uniform(size=(EXAMPLES, FEATURES)).astype(np.float32)
    y = rng.randint(0, 10, size=EXAMPLES).astype(np.int64)
    return x, y


# The guide's layer and model, as written there (sizes changed).
class ActivityRegularizationLayer(keras.layers.Layer):
    def call(self, inputs):
        self.add_loss(1e-2 * tf.reduce_sum(inputs))
        return inputs


def get_model() -> keras.Model:
    """The guide's model with the activity-regularization layer, built from `SEED`."""
    keras.utils.set_random_seed(SEED)
    inputs = keras.Input(shape=(FEATURES,), name="digits")
    x = keras.layers.Dense(UNITS, activation="relu")(inputs)
    # Insert activity regularization as a layer
    x = ActivityRegularizationLayer()(x)
    x = keras.layers.Dense(UNITS, activation="relu")(x)
    outputs = keras.layers.Dense(10, name="predictions")(x)
    return keras.Model(inputs=inputs, outputs=outputs)


def original() -> Run:
    """The guide's loop on `make_data()`: returns each step's `loss_value` and the weights."""
    x_train, y_train = make_data()
    model = get_model()
    optimizer = keras.optimizers.Adam(learning_rate=1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    batch_size = BATCH_SIZE
    train_dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train))
    train_dataset = train_dataset.batch(batch_size)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss_value = loss_fn(y, logits)
            # Add any extra losses created during the forward pass.
            loss_value += sum(model.losses)
        grads = tape.gradient(loss_value, model.trainable_weights)
        optimizer.apply(grads, model.trainable_weights)
        return loss_value

    losses = []
    epochs = EPOCHS
    for _epoch in range(epochs):
        for _step, (x_batch_train, y_batch_train) in enumerate(train_dataset):
            loss_value = train_step(x_batch_train, y_batch_train)
            losses.append(float(loss_value))
    return Run({"loss": losses}, weights_of(model))


class KerasGuide(orbitask.Task):
    """The guide's model, loss and optimizer through orbitask's default step."""

    def __init__(self):
        super().__init__(clip_norm=None)  # the guide does not clip
        self.logs = StepLogs()
        self.model = None

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        x, y = make_data()
        dataset = tf.data.Dataset.from_tensor_slices((x, y))
        return dataset.batch(per_replica_batch_size).repeat()  # epochs end with a partial batch

    def build_model(self):
        self.model = get_model()
        return self.model

    def build_losses(self):
        per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
        return lambda loss_input: per_example(loss_input[1], loss_input[0])  # (logits, labels)

    def build_optimizer(self, learning_rate):
        return keras.optimizers.Adam(learning_rate=1e-3)

    def every_steps(self):
        return {1: orbitask.deferred(self.logs)}  # every step's logs, without ending loops

    def result(self) -> Run:
        """The trained run: the logged `loss` of every step and the final weights."""
        return Run({"loss": self.logs.column("loss")}, weights_of(self.model))
