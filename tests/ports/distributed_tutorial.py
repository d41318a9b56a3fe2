"""TensorFlow's "Custom training loop with MultiWorkerMirroredStrategy", its original and port.

Original: https://www.tensorflow.org/tutorials/distribute/multi_worker_with_ctl (source:
tensorflow/docs, site/en/tutorials/distribute/multi_worker_with_ctl.ipynb): `dataset_fn` batching
each input pipeline with `input_context.get_per_replica_batch_size`, a CNN (Input, Reshape,
Conv2D, Flatten, Dense, Dense with L2(1e-5) kernel regularizers), `RMSprop(learning_rate=0.001)`,
and its `train_step`: per-example `SparseCategoricalCrossentropy`, `tf.nn.compute_average_loss`,
`tf.nn.scale_regularization_loss` of `model.losses`, `strategy.run` and a SUM reduce of the
replicas' losses, which the loop logs. (The same step is in "Custom training with
tf.distribute.Strategy", tensorflow.org/tutorials/distribute/custom_training.)

Changes in `original()` (the code is otherwise the tutorial's):
  - data: 100 synthetic 8x8 "images" (`make_data`: integers 0..255 and labels 0..9, NumPy
    seed 0) instead of MNIST's 60,000 28x28, scaled by 1/255 as the tutorial does; global batch
    32 (64 per worker in the tutorial), 2 epochs of 4 steps (3 epochs of 70);
  - sizes: images 8x8, Conv2D 4 filters (32), Dense 16 units (128);
  - no `shuffle(60000)`: both sides read the examples in order;
  - one worker: `tf.distribute.MirroredStrategy(["/cpu:0"])`, one replica, stands in for the
    `MultiWorkerMirroredStrategy` of a two-worker cluster (the tutorial's loop and step are the
    same for any number of workers);
  - `reduction=tf.keras.losses.Reduction.NONE` becomes `reduction="none"`: Keras 3 (TF 2.16 and
    later) has no `Reduction` enum;
  - `keras.utils.set_random_seed(SEED)` before the model is built, so both sides start from the
    same weights;
  - the loop records each step's loss instead of printing each epoch's mean, and returns them
    with the final weights; the checkpointed `epoch` / `step_in_epoch` variables, the
    checkpoint manager and the per-epoch accuracy print are left out.

The port (`Tutorial`) overrides `train_step` with the body of the tutorial's `step_fn`
(orbitask runs it per replica inside `strategy.run`); `build_inputs` is `dataset_fn` with
orbitask's `per_replica_batch_size` and `.repeat()` (orbitask counts steps, not epochs). The
body returns `{"loss": loss}` (the tutorial returns `loss`, reduced with SUM over replicas by its
`train_step`) and updates the accuracy metric from `build_metrics`.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

import orbitask
from tests.ports import BATCH_SIZE, EPOCHS, EXAMPLES, SEED, STEPS, Run, StepLogs, weights_of

IMAGE = 8  # 28 in the tutorial


def make_data() -> tuple[np.ndarray, np.ndarray]:
    """`EXAMPLES` images of `IMAGE` x `IMAGE` integer pixels 0..255 and labels 0..9 (seeded)."""
    rng = np.random.RandomState(SEED)
    return rng.randint(0, 256, size=(EXAMPLES, IMAGE, IMAGE)), rng.randint(0, 10, size=EXAMPLES)


# The tutorial's mnist.py, as written there (data and sizes changed).
def mnist_dataset(batch_size):
    x_train, y_train = make_data()
    # The `x` arrays are in uint8 and have values in the range [0, 255].
    # You need to convert them to float32 with values in the range [0, 1]
    x_train = x_train / np.float32(255)
    y_train = y_train.astype(np.int64)
    train_dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train))
    return train_dataset


def dataset_fn(global_batch_size, input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    dataset = mnist_dataset(batch_size)
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    dataset = dataset.batch(batch_size)
    return dataset


def build_cnn_model():
    keras.utils.set_random_seed(SEED)
    regularizer = tf.keras.regularizers.L2(1e-5)
    return tf.keras.Sequential(
        [
            tf.keras.Input(shape=(IMAGE, IMAGE)),
            tf.keras.layers.Reshape(target_shape=(IMAGE, IMAGE, 1)),
            tf.keras.layers.Conv2D(4, 3, activation="relu", kernel_regularizer=regularizer),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(16, activation="relu", kernel_regularizer=regularizer),
            tf.keras.layers.Dense(10, kernel_regularizer=regularizer),
        ]
    )


def original() -> Run:
    """The tutorial's loop on one worker: each step's reduced loss and the final weights."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        # Model building needs to be within `strategy.scope()`.
        multi_worker_model = build_cnn_model()
    global_batch_size = BATCH_SIZE
    with strategy.scope():
        multi_worker_dataset = strategy.distribute_datasets_from_function(
            lambda input_context: dataset_fn(global_batch_size, input_context)
        )
    with strategy.scope():
        # The creation of optimizer and train_accuracy needs to be in
        # `strategy.scope()` as well, since they create variables.
        optimizer = tf.keras.optimizers.RMSprop(learning_rate=0.001)
        train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")

    @tf.function
    def train_step(iterator):
        """Training step function."""

        def step_fn(inputs):
            """Per-Replica step function."""
            x, y = inputs
            with tf.GradientTape() as tape:
                predictions = multi_worker_model(x, training=True)
                per_example_loss = tf.keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True, reduction="none"
                )(y, predictions)
                loss = tf.nn.compute_average_loss(per_example_loss)
                model_losses = multi_worker_model.losses
                if model_losses:
                    loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
            grads = tape.gradient(loss, multi_worker_model.trainable_variables)
            optimizer.apply_gradients(zip(grads, multi_worker_model.trainable_variables))  # noqa: B905
            train_accuracy.update_state(y, predictions)
            return loss

        per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    num_epochs = EPOCHS
    num_steps_per_epoch = STEPS // EPOCHS
    losses = []
    for _epoch in range(num_epochs):
        iterator = iter(multi_worker_dataset)
        for _step_in_epoch in range(num_steps_per_epoch):
            losses.append(float(train_step(iterator)))
        train_accuracy.reset_state()
    return Run({"loss": losses}, weights_of(multi_worker_model))


class Tutorial(orbitask.Task):
    """The tutorial's model, input and `step_fn` as an orbitask task."""

    replica_logs = "sum"  # `tf.nn.compute_average_loss`: each replica's share of the global mean

    def __init__(self):
        super().__init__()
        self.logs = StepLogs()
        self.model = None

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        dataset = mnist_dataset(per_replica_batch_size)
        if input_context:
            dataset = dataset.shard(
                input_context.num_input_pipelines, input_context.input_pipeline_id
            )
        return dataset.batch(per_replica_batch_size).repeat()  # epochs end with a partial batch

    def build_model(self):
        self.model = build_cnn_model()
        return self.model

    def build_optimizer(self, learning_rate):
        return tf.keras.optimizers.RMSprop(learning_rate=0.001)

    def build_metrics(self, training=True):
        return [tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")]

    def train_step(self, batch, model, optimizer, metrics=None, *, loss_fn, lr, global_batch_size):
        """The tutorial's `step_fn`. Traced, per replica; returns its loss as logs."""
        multi_worker_model, (train_accuracy,) = model, metrics
        x, y = batch
        with tf.GradientTape() as tape:
            predictions = multi_worker_model(x, training=True)
            per_example_loss = tf.keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction="none"
            )(y, predictions)
            loss = tf.nn.compute_average_loss(per_example_loss)
            model_losses = multi_worker_model.losses
            if model_losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
        grads = tape.gradient(loss, multi_worker_model.trainable_variables)
        optimizer.apply_gradients(zip(grads, multi_worker_model.trainable_variables))  # noqa: B905
        train_accuracy.update_state(y, predictions)
        return {"loss": loss}

    def every_steps(self):
        return {1: orbitask.deferred(self.logs)}  # every step's logs, without ending loops

    def result(self) -> Run:
        """The trained run: each step's logged loss and the final weights."""
        return Run({"loss": self.logs.column("loss")}, weights_of(self.model))
