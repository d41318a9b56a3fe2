"""TensorFlow's tutorial "Neural machine translation with a Transformer and Keras": its loss,
accuracy, schedule and optimizer, the original and the port.

Original: https://www.tensorflow.org/text/tutorials/transformer (source: tensorflow/text,
docs/tutorials/transformer.ipynb): `masked_loss` (per-token cross-entropy over the tokens whose
label is not 0, divided by their number), `masked_accuracy`, `CustomSchedule(d_model,
warmup_steps)` and `Adam(learning_rate, beta_1=0.9, beta_2=0.98, epsilon=1e-9)`, given to
`compile` and trained by `fit`.

Changes in `original()` (the loss, accuracy, schedule and optimizer are the tutorial's):
  - model: an `Embedding` of `D_MODEL` units and a `Dense` layer over the vocabulary, per token,
    instead of the tutorial's encoder-decoder Transformer (the loss sees the same logits shape);
  - data: `EXAMPLES` sequences of `LENGTH` token ids below `VOCAB`, 0 for padding at the end of
    each (seeded), the label sequence a shift of the input; batch 32, 2 epochs, no shuffling;
  - `warmup_steps` 4 instead of 4000 (8 steps here); `keras.utils.set_random_seed(SEED)`.

The port (`TutorialPort`) keeps `masked_loss`'s terms with orbitask's default step: the loss sums
each token's masked cross-entropy and `grad_pre` returns the replica's count of real tokens, so
the step divides by the tokens of all replicas, as one device divides by its batch's. The
schedule object is the run's `learning_rate`; the optimizer is the tutorial's.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

import orbitask
from tests.ports import BATCH_SIZE, EPOCHS, EXAMPLES, SEED

VOCAB, LENGTH, D_MODEL, WARMUP = 20, 7, 16, 4


def make_data() -> tuple[np.ndarray, np.ndarray]:
    """Token ids in 1..VOCAB-1 with a random number of trailing 0s (padding) per sequence."""
    rng = np.random.RandomState(SEED)
    tokens = rng.randint(1, VOCAB, size=(EXAMPLES, LENGTH + 1))
    lengths = rng.randint(2, LENGTH + 2, size=EXAMPLES)
    tokens[np.arange(LENGTH + 1)[None, :] >= lengths[:, None]] = 0
    return tokens[:, :-1].astype(np.int32), tokens[:, 1:].astype(np.int32)


# The tutorial's loss, accuracy and schedule, as written there.
def masked_loss(label, pred):
    mask = label != 0
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    loss = loss_object(label, pred)

    mask = tf.cast(mask, dtype=loss.dtype)
    loss *= mask

    loss = tf.reduce_sum(loss) / tf.reduce_sum(mask)
    return loss


def masked_accuracy(label, pred):
    pred = tf.argmax(pred, axis=2)
    label = tf.cast(label, pred.dtype)
    match = label == pred

    mask = label != 0

    match = match & mask

    match = tf.cast(match, dtype=tf.float32)
    mask = tf.cast(mask, dtype=tf.float32)
    return tf.reduce_sum(match) / tf.reduce_sum(mask)


class CustomSchedule(tf.keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, d_model, warmup_steps=4000):
        super().__init__()

        self.d_model = d_model
        self.d_model = tf.cast(self.d_model, tf.float32)

        self.warmup_steps = warmup_steps

    def __call__(self, step):
        step = tf.cast(step, dtype=tf.float32)
        arg1 = tf.math.rsqrt(step)
        arg2 = step * (self.warmup_steps**-1.5)

        return tf.math.rsqrt(self.d_model) * tf.math.minimum(arg1, arg2)


def get_model() -> keras.Model:
    keras.utils.set_random_seed(SEED)
    return keras.Sequential(
        [
            keras.Input((LENGTH,), dtype="int32"),
            keras.layers.Embedding(VOCAB, D_MODEL),
            keras.layers.Dense(VOCAB),
        ]
    )


def optimizer() -> keras.optimizers.Optimizer:
    learning_rate = CustomSchedule(D_MODEL, warmup_steps=WARMUP)
    return tf.keras.optimizers.Adam(learning_rate, beta_1=0.9, beta_2=0.98, epsilon=1e-9)


def original() -> list[np.ndarray]:
    """`fit`'s weights after `EPOCHS` epochs."""
    x, y = make_data()
    model = get_model()
    model.compile(
        loss=masked_loss, optimizer=optimizer(), metrics=[masked_accuracy], jit_compile=False
    )
    model.fit(x, y, batch_size=BATCH_SIZE, epochs=EPOCHS, shuffle=False, verbose=0)
    return [np.array(w) for w in model.get_weights()]


class TutorialPort(orbitask.Task):
    """The tutorial's loss terms through the default step, its count of tokens from `grad_pre`."""

    def __init__(self):
        super().__init__(clip_norm=None)  # the tutorial does not clip
        self.model = None

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        dataset = tf.data.Dataset.from_tensor_slices(make_data())
        return dataset.batch(per_replica_batch_size).repeat()

    def build_model(self):
        self.model = get_model()
        return self.model

    def build_losses(self):
        def summed_masked_loss(loss_input):
            pred, label = loss_input
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")(
                label, pred
            )
            return tf.reduce_sum(loss * tf.cast(label != 0, loss.dtype))

        return summed_masked_loss

    def grad_pre(self, loss, outputs, batch, model, loss_fn, lr):
        loss_per_batch, extra, variables = super().grad_pre(
            loss, outputs, batch, model, loss_fn, lr
        )
        tokens = tf.reduce_sum(tf.cast(batch[1] != 0, tf.float32))
        return loss_per_batch, extra, variables, tokens

    def build_optimizer(self, learning_rate):
        return optimizer()

    def weights(self) -> list[np.ndarray]:
        return [np.array(w) for w in self.model.get_weights()]
