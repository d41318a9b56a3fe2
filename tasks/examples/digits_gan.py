"""`DigitsGAN`: a small GAN on the 8x8 digits -- two models, two optimizers, one custom step.

What Keras `fit` makes hard and a Task makes plain: `build_model` returns
`{"generator": G, "discriminator": D}`, `build_optimizer` one optimizer per model under the same
keys (both checkpointed, both restored), and `train_step` does the two updates of a GAN step.

Loss scaling as in the default step, for each update: the value differentiated on a replica is
the SUM of the per-example losses over its batch divided by the global batch, plus the model's
regularisation divided by the number of replicas; gradients are summed over replicas before
clipping and `keras_compat.apply_gradients`. The noise comes from the input pipeline (a
counter-seeded stateless normal per example), so each replica gets its own and a restart replays
exactly the noise an uninterrupted run would have drawn.
"""

from __future__ import annotations

import gin
import keras
import tensorflow as tf

from orbitask.common import keras_compat
from orbitask.tasks.base import Task
from orbitask.tasks.examples.digits import digits_split
from orbitask.tasks.gradients import all_reduce_sum


def discriminator_loss(real_logits: tf.Tensor, fake_logits: tf.Tensor) -> tf.Tensor:
    """Returns the SUM over the batch of `-log D(real) - log(1 - D(fake))`. Traced."""
    real = tf.nn.softplus(-tf.cast(real_logits, tf.float32))
    fake = tf.nn.softplus(tf.cast(fake_logits, tf.float32))
    return tf.reduce_sum(real) + tf.reduce_sum(fake)


def generator_loss(fake_logits: tf.Tensor) -> tf.Tensor:
    """Returns the SUM over the batch of the non-saturating `-log D(G(z))`. Traced."""
    return tf.reduce_sum(tf.nn.softplus(-tf.cast(fake_logits, tf.float32)))


@gin.configurable("DigitsGAN", module="orbitask")
class DigitsGAN(Task):
    """Generate 8x8 digit images with a Keras 3 Dense generator and discriminator.

    Batches are `(real_images, noise)` pairs. Both optimizers follow the runner's one
    learning-rate variable; clipping (`Task.clip_norm`) applies to each model's global gradient.

    Args:
      latent_dim: size of the generator's noise input.
      hidden_units: width of the hidden layer of both models.
      l2: L2 regularisation of both models' kernels (lands in `model.losses`).
      beta_1: Adam's first-moment decay for both optimizers (0.5 is usual for GANs).
      shuffle_buffer: training shuffle buffer of the real images.
      seed: seed of the split, the shuffle and the noise.
    """

    def __init__(
        self,
        latent_dim: int = 16,
        hidden_units: int = 64,
        l2: float = 0.0,
        beta_1: float = 0.5,
        shuffle_buffer: int = 2048,
        seed: int = 0,
    ):
        super().__init__()
        self.latent_dim = latent_dim
        self.hidden_units = hidden_units
        self.l2 = l2
        self.beta_1 = beta_1
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        (self._train, _), (self._val, _) = digits_split(seed=seed)

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        """Returns `(real_images, noise)` batches, noise seeded by position. Eager, once."""
        images = tf.data.Dataset.from_tensor_slices(self._train if training else self._val)
        pipeline = 0
        if input_context and input_context.num_input_pipelines > 1:
            pipeline = input_context.input_pipeline_id
            images = images.shard(input_context.num_input_pipelines, pipeline)
        if training:
            images = images.shuffle(self.shuffle_buffer, seed=self.seed).repeat()
        stream = 2 * (self.seed * 1000 + pipeline) + (0 if training else 1)
        noise = tf.data.Dataset.counter().map(
            lambda i: tf.random.stateless_normal(
                [self.latent_dim], seed=tf.stack([tf.cast(stream, tf.int64), i])
            )
        )
        dataset = tf.data.Dataset.zip((images, noise))
        return dataset.batch(per_replica_batch_size, drop_remainder=training).prefetch(2)

    def build_model(self) -> dict:
        """Returns `{"generator": G, "discriminator": D}` (Keras 3). Eager, in strategy scope."""
        reg = keras.regularizers.L2(self.l2) if self.l2 else None
        generator = keras.Sequential(
            [
                keras.Input((self.latent_dim,)),
                keras.layers.Dense(self.hidden_units, "relu", kernel_regularizer=reg),
                keras.layers.Dense(64, "sigmoid", kernel_regularizer=reg),
            ],
            name="generator",
        )
        discriminator = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(self.hidden_units, kernel_regularizer=reg),
                keras.layers.LeakyReLU(0.2),
                keras.layers.Dense(1, kernel_regularizer=reg),
            ],
            name="discriminator",
        )
        return {"generator": generator, "discriminator": discriminator}

    def build_losses(self) -> dict:
        """Returns `{"generator": generator_loss, "discriminator": discriminator_loss}`. Eager."""
        return {"generator": generator_loss, "discriminator": discriminator_loss}

    def build_optimizer(self, learning_rate) -> dict:
        """Returns `{"generator": Adam, "discriminator": Adam}` (Keras 3). Eager, in scope."""
        return {
            key: keras.optimizers.Adam(learning_rate, beta_1=self.beta_1, name=f"{key}_adam")
            for key in ("generator", "discriminator")
        }

    def train_step(self, batch, model, optimizer, metrics=None, *, loss_fn, lr, global_batch_size):
        """A discriminator update, then a generator update against the updated discriminator.

        Traced by tf.function, per replica, inside `strategy.run`.

        Returns logs whose means over replicas are the global batch's: `d_loss`, `g_loss`,
        their sum `loss` (each a mean loss plus the model's regularisation), `d_grad_norm`,
        `g_grad_norm`.
        """
        del metrics
        real, noise = batch
        generator, discriminator = model["generator"], model["discriminator"]

        def d_loss():
            fake = generator(noise, training=True)
            real_logits = discriminator(real, training=True)
            fake_logits = discriminator(fake, training=True)
            return loss_fn["discriminator"](real_logits, fake_logits)

        def g_loss():
            return loss_fn["generator"](discriminator(generator(noise, training=True)))

        logs = {}
        for key, prefix, loss in (("discriminator", "d", d_loss), ("generator", "g", g_loss)):
            logs[f"{prefix}_loss"], logs[f"{prefix}_grad_norm"] = self._update(
                model[key], optimizer[key], loss, lr, global_batch_size, batch, loss_fn
            )
        logs["loss"] = logs["d_loss"] + logs["g_loss"]
        return logs

    def _update(self, own, optimizer, loss, lr, global_batch_size, batch, loss_fn):
        """One model's update: scaled loss, all-reduced gradient, clip, apply (traced).

        Returns `(the loss as one device would report it, the gradient's global norm)`.
        """
        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        variables = own.trainable_variables
        with tf.GradientTape() as tape:
            loss_sum = loss()
            extra = tf.add_n(own.losses) if own.losses else 0.0
            scaled = loss_sum / float(global_batch_size) + extra / float(replicas)
        gradients = all_reduce_sum(tape.gradient(scaled, variables))
        update, display = self.update_pre(
            gradients, loss_sum, None, batch, own, loss_fn, lr, optimizer
        )
        keras_compat.apply_gradients(optimizer, update, variables)
        norm = tf.linalg.global_norm([g for g in display if g is not None])
        return scaled * float(replicas), norm

    def validation_step(self, batch, model, metrics=None, *, loss_fn, lr):
        """Both losses and the discriminator's accuracy on real and on fake images. Traced.

        Returns per-replica sums that the default `reduce_aggregated_logs` divides by
        `num_examples`: `d_loss`, `g_loss`, `loss`, `d_accuracy_real`, `d_accuracy_fake`.
        """
        del metrics, lr
        real, noise = batch
        fake = model["generator"](noise, training=False)
        real_logits = model["discriminator"](real, training=False)
        fake_logits = model["discriminator"](fake, training=False)
        d_loss = loss_fn["discriminator"](real_logits, fake_logits)
        g_loss = loss_fn["generator"](fake_logits)
        return {
            "d_loss": d_loss,
            "g_loss": g_loss,
            "loss": d_loss + g_loss,
            "d_accuracy_real": tf.reduce_sum(tf.cast(real_logits > 0, tf.float32)),
            "d_accuracy_fake": tf.reduce_sum(tf.cast(fake_logits < 0, tf.float32)),
            "num_examples": tf.cast(tf.shape(real)[0], tf.float32),
        }
