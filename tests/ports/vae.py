"""Keras' example "Variational AutoEncoder", its original and its port.

Original: https://keras.io/examples/generative/vae/ (source: keras-team/keras-io,
examples/generative/vae.py): the `Sampling` layer drawing from `keras.random.SeedGenerator(1337)`
in every call, a `VAE(keras.Model)` whose own `train_step` computes the reconstruction and KL
losses, applies the gradient and keeps three `Mean` trackers (`total_loss`,
`reconstruction_loss`, `kl_loss`), trained by `vae.fit` with `Adam()`.

Changes in `original()` (the code is otherwise the example's):
  - data: `EXAMPLES` of scikit-learn's 8x8 digits scaled to [0, 1] instead of MNIST's 70,000
    28x28 images;
  - sizes: the encoder and decoder are Dense layers of 16 units (the example's convolutions
    take 28x28 images), latent dimension 2 as in the example; batch 32, 2 epochs, no shuffling;
  - `keras.utils.set_random_seed(SEED)` before the models are built; `compile(jit_compile=False)`.

The port (`VAEPort`) keeps the example's `train_step` body as the Task's own `train_step` and its
trackers as `build_metrics`. The step logs the step's `loss`; the trackers' running means are the
run's metrics, over windows of one epoch (`metrics_window`), as `fit` restarts them each epoch.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
from keras import layers, ops

import orbitask
from tests.ports import BATCH_SIZE, EPOCHS, EXAMPLES, SEED

LATENT = 2
TRACKERS = ("total_loss", "reconstruction_loss", "kl_loss")


def make_data() -> np.ndarray:
    """`EXAMPLES` 8x8x1 digit images in [0, 1]."""
    from sklearn.datasets import load_digits

    images = load_digits().images[:EXAMPLES] / 16.0
    return images.reshape(-1, 8, 8, 1).astype(np.float32)


class Sampling(layers.Layer):
    """Uses (z_mean, z_log_var) to sample z, the vector encoding a digit."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, inputs):
        z_mean, z_log_var = inputs
        batch = ops.shape(z_mean)[0]
        dim = ops.shape(z_mean)[1]
        epsilon = keras.random.normal(shape=(batch, dim), seed=self.seed_generator)
        return z_mean + ops.exp(0.5 * z_log_var) * epsilon


def build_encoder_decoder() -> tuple[keras.Model, keras.Model]:
    keras.utils.set_random_seed(SEED)
    encoder_inputs = keras.Input(shape=(8, 8, 1))
    x = layers.Flatten()(encoder_inputs)
    x = layers.Dense(16, activation="relu")(x)
    z_mean = layers.Dense(LATENT, name="z_mean")(x)
    z_log_var = layers.Dense(LATENT, name="z_log_var")(x)
    z = Sampling()([z_mean, z_log_var])
    encoder = keras.Model(encoder_inputs, [z_mean, z_log_var, z], name="encoder")
    latent_inputs = keras.Input(shape=(LATENT,))
    x = layers.Dense(16, activation="relu")(latent_inputs)
    x = layers.Dense(64, activation="sigmoid")(x)
    decoder = keras.Model(latent_inputs, layers.Reshape((8, 8, 1))(x), name="decoder")
    return encoder, decoder


def vae_losses(encoder, decoder, data):
    """The example's losses of a batch: (total, reconstruction, kl)."""
    z_mean, z_log_var, z = encoder(data)
    reconstruction = decoder(z)
    reconstruction_loss = ops.mean(
        ops.sum(keras.losses.binary_crossentropy(data, reconstruction), axis=(1, 2))
    )
    kl_loss = -0.5 * (1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var))
    kl_loss = ops.mean(ops.sum(kl_loss, axis=1))
    return reconstruction_loss + kl_loss, reconstruction_loss, kl_loss


class VAE(keras.Model):
    """The example's model, its `train_step` as written there."""

    def __init__(self, encoder, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder
        self.decoder = decoder
        self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
        self.reconstruction_loss_tracker = keras.metrics.Mean(name="reconstruction_loss")
        self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

    @property
    def metrics(self):
        return [self.total_loss_tracker, self.reconstruction_loss_tracker, self.kl_loss_tracker]

    def train_step(self, data):
        with tf.GradientTape() as tape:
            total_loss, reconstruction_loss, kl_loss = vae_losses(self.encoder, self.decoder, data)
        grads = tape.gradient(total_loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights, strict=True))
        self.total_loss_tracker.update_state(total_loss)
        self.reconstruction_loss_tracker.update_state(reconstruction_loss)
        self.kl_loss_tracker.update_state(kl_loss)
        return {
            "loss": self.total_loss_tracker.result(),
            "reconstruction_loss": self.reconstruction_loss_tracker.result(),
            "kl_loss": self.kl_loss_tracker.result(),
        }


def original() -> tuple[dict, list[np.ndarray]]:
    """`fit`'s per-epoch metrics (`history.history`) and the final weights."""
    encoder, decoder = build_encoder_decoder()
    vae = VAE(encoder, decoder)
    vae.compile(optimizer=keras.optimizers.Adam(), jit_compile=False)
    history = vae.fit(make_data(), epochs=EPOCHS, batch_size=BATCH_SIZE, shuffle=False, verbose=0)
    weights = [np.array(w) for m in (encoder, decoder) for w in m.get_weights()]
    return history.history, weights


class VAEPort(orbitask.Task):
    """The example's step as the Task's own; its trackers as the run's metrics."""

    def __init__(self):
        super().__init__()
        self.models = None
        self.epochs: list[dict] = []

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        dataset = tf.data.Dataset.from_tensor_slices(make_data())
        return dataset.batch(per_replica_batch_size).repeat()

    def build_model(self):
        encoder, decoder = build_encoder_decoder()
        self.models = {"encoder": encoder, "decoder": decoder}
        return self.models

    def build_optimizer(self, learning_rate):
        return keras.optimizers.Adam()

    def build_metrics(self, training=True):
        return [keras.metrics.Mean(name=name) for name in TRACKERS]

    def train_step(self, batch, model, optimizer, metrics=None, *, loss_fn, lr, global_batch_size):
        with tf.GradientTape() as tape:
            losses = vae_losses(model["encoder"], model["decoder"], batch)
        variables = model["encoder"].trainable_weights + model["decoder"].trainable_weights
        grads = tape.gradient(losses[0], variables)
        optimizer.apply_gradients(zip(grads, variables, strict=True))
        for tracker, value in zip(metrics, losses, strict=True):
            tracker.update_state(value)
        return {"loss": losses[0]}

    def every_steps(self):
        return {STEPS_PER_EPOCH: self.keep_epoch}

    def keep_epoch(self, task, ctx):
        self.epochs.append({name: ctx.logs[name] for name in TRACKERS})

    def weights(self) -> list[np.ndarray]:
        return [np.array(w) for m in self.models.values() for w in m.get_weights()]


STEPS_PER_EPOCH = -(-EXAMPLES // BATCH_SIZE)
