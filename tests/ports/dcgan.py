"""TensorFlow's DCGAN tutorial, its original and its port.

Original: "Deep Convolutional Generative Adversarial Network",
https://www.tensorflow.org/tutorials/generative/dcgan (source: tensorflow/docs,
site/en/tutorials/generative/dcgan.ipynb): a generator of Dense, BatchNormalization, LeakyReLU,
Reshape and Conv2DTranspose layers, a discriminator of Conv2D, LeakyReLU, Dropout, Flatten and
Dense layers, the module-level `cross_entropy = tf.keras.losses.BinaryCrossentropy(
from_logits=True)` in `discriminator_loss` and `generator_loss`, two `Adam(1e-4)`, and its
`train_step`, batch 256 without `drop_remainder`.

Changes in `original()` (the code is otherwise the tutorial's):
  - data: 100 synthetic 8x8 "images" (`make_data`: integers 0..255, NumPy seed 0) instead of
    MNIST's 60,000 28x28, normalised to [-1, 1] as the tutorial does; batch 32, 2 epochs;
  - sizes: images 8x8 instead of 28x28, `noise_dim` 8 instead of 100, the generator starts
    from 2x2x16 (7x7x256 in the tutorial) and its Conv2DTranspose layers have 8, 4 and 1
    filters (128, 64, 1), the discriminator's Conv2D layers 4 and 8 (64, 128); the layers,
    kernels, strides, paddings and activations are the tutorial's;
  - no `shuffle(BUFFER_SIZE)`: both sides read the images in order;
  - the noise: `tf.random.normal([BATCH_SIZE, noise_dim])` (a stateful op: its draws depend on
    the graph, so two programs cannot draw the same) becomes `noise_at(step, BATCH_SIZE)`, a
    stateless normal of the same shape seeded by the step (the generator optimizer's
    `iterations`); still `BATCH_SIZE` rows, also for the partial last batch, as the tutorial;
  - `keras.utils.set_random_seed(SEED)` before the models are built, so both sides start from
    the same weights and Dropout seeds;
  - `train_step` returns `gen_loss, disc_loss`, which the loop records at every step; the
    image plots, the cells that call the untrained models, the fixed `seed` for the GIF,
    checkpoints and timing are left out.

The port (`DCGAN`) overrides `train_step` with the tutorial's body: the models, optimizers and
losses are its, from `build_model` / `build_optimizer` dicts. Changes in the body: it takes
`batch`, `model`, `optimizer` and `global_batch_size` from orbitask, and on N replicas each
replica takes its share of the global step's noise (rows `global_batch_size / N` from its
replica index), so N replicas draw the noise one device draws; it returns
`{"gen_loss", "disc_loss"}` as logs.

`DCGAN(distributable=True)` swaps two layers that cannot give one device's numbers on several
replicas whatever the framework does: BatchNormalization with `synchronized=True` (batch
statistics over the global batch, not each replica's half) and Dropout of rate 0 (a replica's
mask for its half of a batch cannot be the one device draws for the whole batch). The tests
compare that variant on 1 device and on 2 replicas; the tutorial's own layers are compared
with the original on 1 device.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

import orbitask
from tests.ports import BATCH_SIZE, EPOCHS, EXAMPLES, SEED, Run, StepLogs, weights_of

layers = tf.keras.layers
IMAGE = 8  # 28 in the tutorial
noise_dim = 8  # 100 in the tutorial


def make_data() -> np.ndarray:
    """`EXAMPLES` images of `IMAGE` x `IMAGE` integer pixels 0..255 (seeded), as MNIST's."""
    return np.random.RandomState(SEED).randint(0, 256, size=(EXAMPLES, IMAGE, IMAGE))


def noise_at(step, rows: int) -> tf.Tensor:
    """The noise of one global step: `rows` x `noise_dim` normals seeded by `step` (traced)."""
    seed = tf.stack([tf.constant(SEED, tf.int64), tf.cast(step, tf.int64)])
    return tf.random.stateless_normal([rows, noise_dim], seed=seed)


def images_of(train_images: np.ndarray) -> np.ndarray:
    """The tutorial's preprocessing: reshape to N x H x W x 1 float32, normalise to [-1, 1]."""
    train_images = train_images.reshape(train_images.shape[0], IMAGE, IMAGE, 1).astype("float32")
    train_images = (train_images - 127.5) / 127.5  # Normalize the images to [-1, 1]
    return train_images


# The tutorial's models, as written there (sizes changed; `synchronized` and `dropout` only for
# the distributable variant).
def make_generator_model(synchronized=False):
    model = tf.keras.Sequential()
    model.add(layers.Dense(2 * 2 * 16, use_bias=False, input_shape=(noise_dim,)))
    model.add(layers.BatchNormalization(synchronized=synchronized))
    model.add(layers.LeakyReLU())

    model.add(layers.Reshape((2, 2, 16)))
    assert model.output_shape == (None, 2, 2, 16)  # Note: None is the batch size

    model.add(layers.Conv2DTranspose(8, (5, 5), strides=(1, 1), padding="same", use_bias=False))
    assert model.output_shape == (None, 2, 2, 8)
    model.add(layers.BatchNormalization(synchronized=synchronized))
    model.add(layers.LeakyReLU())

    model.add(layers.Conv2DTranspose(4, (5, 5), strides=(2, 2), padding="same", use_bias=False))
    assert model.output_shape == (None, 4, 4, 4)
    model.add(layers.BatchNormalization(synchronized=synchronized))
    model.add(layers.LeakyReLU())

    model.add(
        layers.Conv2DTranspose(
            1, (5, 5), strides=(2, 2), padding="same", use_bias=False, activation="tanh"
        )
    )
    assert model.output_shape == (None, IMAGE, IMAGE, 1)

    return model


def make_discriminator_model(dropout=0.3):
    model = tf.keras.Sequential()
    model.add(
        layers.Conv2D(4, (5, 5), strides=(2, 2), padding="same", input_shape=[IMAGE, IMAGE, 1])
    )
    model.add(layers.LeakyReLU())
    model.add(layers.Dropout(dropout))

    model.add(layers.Conv2D(8, (5, 5), strides=(2, 2), padding="same"))
    model.add(layers.LeakyReLU())
    model.add(layers.Dropout(dropout))

    model.add(layers.Flatten())
    model.add(layers.Dense(1))

    return model


def build_models(distributable: bool = False):
    """`(generator, discriminator)` built from `SEED` (the tutorial's, or the distributable
    variant's layers)."""
    keras.utils.set_random_seed(SEED)
    if distributable:
        return make_generator_model(synchronized=True), make_discriminator_model(dropout=0.0)
    return make_generator_model(), make_discriminator_model()


# This method returns a helper function to compute cross entropy loss
cross_entropy = tf.keras.losses.BinaryCrossentropy(from_logits=True)


def discriminator_loss(real_output, fake_output):
    real_loss = cross_entropy(tf.ones_like(real_output), real_output)
    fake_loss = cross_entropy(tf.zeros_like(fake_output), fake_output)
    total_loss = real_loss + fake_loss
    return total_loss


def generator_loss(fake_output):
    return cross_entropy(tf.ones_like(fake_output), fake_output)


def original() -> Run:
    """The tutorial's loop on `make_data()`: each step's `gen_loss` and `disc_loss`, and the
    final weights of the generator then the discriminator."""
    train_images = images_of(make_data())
    train_dataset = tf.data.Dataset.from_tensor_slices(train_images).batch(BATCH_SIZE)
    generator, discriminator = build_models()
    generator_optimizer = tf.keras.optimizers.Adam(1e-4)
    discriminator_optimizer = tf.keras.optimizers.Adam(1e-4)

    # Notice the use of `tf.function`
    # This annotation causes the function to be "compiled".
    @tf.function
    def train_step(images):
        noise = noise_at(generator_optimizer.iterations, BATCH_SIZE)

        with tf.GradientTape() as gen_tape, tf.GradientTape() as disc_tape:
            generated_images = generator(noise, training=True)

            real_output = discriminator(images, training=True)
            fake_output = discriminator(generated_images, training=True)

            gen_loss = generator_loss(fake_output)
            disc_loss = discriminator_loss(real_output, fake_output)

        gradients_of_generator = gen_tape.gradient(gen_loss, generator.trainable_variables)
        gradients_of_discriminator = disc_tape.gradient(
            disc_loss, discriminator.trainable_variables
        )

        generator_optimizer.apply_gradients(
            zip(gradients_of_generator, generator.trainable_variables)  # noqa: B905
        )
        discriminator_optimizer.apply_gradients(
            zip(gradients_of_discriminator, discriminator.trainable_variables)  # noqa: B905
        )
        return gen_loss, disc_loss

    losses = {"gen_loss": [], "disc_loss": []}

    def train(dataset, epochs):
        for _epoch in range(epochs):
            for image_batch in dataset:
                gen_loss, disc_loss = train_step(image_batch)
                losses["gen_loss"].append(float(gen_loss))
                losses["disc_loss"].append(float(disc_loss))

    train(train_dataset, EPOCHS)
    return Run(losses, weights_of(generator, discriminator))


class DCGAN(orbitask.Task):
    """The tutorial's GAN: two models, two optimizers, its own `train_step`.

    Args:
      distributable: synchronized BatchNormalization and no Dropout (see the module docstring).
    """

    # Both logs are Keras 3 loss objects' means, which Keras divides by the replica count.
    replica_logs = "sum"

    def __init__(self, distributable: bool = False):
        super().__init__()
        self.distributable = distributable
        self.logs = StepLogs()
        self.models = None

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        dataset = tf.data.Dataset.from_tensor_slices(images_of(make_data()))
        return dataset.batch(per_replica_batch_size).repeat()  # epochs end with a partial batch

    def build_model(self):
        generator, discriminator = build_models(self.distributable)
        self.models = {"generator": generator, "discriminator": discriminator}
        return self.models

    def build_optimizer(self, learning_rate):
        return {
            "generator": tf.keras.optimizers.Adam(1e-4),
            "discriminator": tf.keras.optimizers.Adam(1e-4),
        }

    def train_step(self, batch, model, optimizer, metrics=None, *, loss_fn, lr, global_batch_size):
        """The tutorial's step on this replica's images. Traced, per replica; returns its logs."""
        images = batch
        generator, discriminator = model["generator"], model["discriminator"]
        generator_optimizer = optimizer["generator"]
        discriminator_optimizer = optimizer["discriminator"]
        context = tf.distribute.get_replica_context()
        rows = global_batch_size // context.num_replicas_in_sync
        first = context.replica_id_in_sync_group * rows  # this replica's share of the noise
        noise = noise_at(generator_optimizer.iterations, global_batch_size)[first : first + rows]

        with tf.GradientTape() as gen_tape, tf.GradientTape() as disc_tape:
            generated_images = generator(noise, training=True)

            real_output = discriminator(images, training=True)
            fake_output = discriminator(generated_images, training=True)

            gen_loss = generator_loss(fake_output)
            disc_loss = discriminator_loss(real_output, fake_output)

        gradients_of_generator = gen_tape.gradient(gen_loss, generator.trainable_variables)
        gradients_of_discriminator = disc_tape.gradient(
            disc_loss, discriminator.trainable_variables
        )

        generator_optimizer.apply_gradients(
            zip(gradients_of_generator, generator.trainable_variables)  # noqa: B905
        )
        discriminator_optimizer.apply_gradients(
            zip(gradients_of_discriminator, discriminator.trainable_variables)  # noqa: B905
        )
        return {"gen_loss": gen_loss, "disc_loss": disc_loss}

    def every_steps(self):
        return {1: orbitask.deferred(self.logs)}  # every step's logs, without ending loops

    def result(self) -> Run:
        """The trained run: each step's logged losses and the final weights of both models."""
        losses = {name: self.logs.column(name) for name in ("gen_loss", "disc_loss")}
        return Run(losses, weights_of(self.models["generator"], self.models["discriminator"]))
