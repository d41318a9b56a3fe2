"""An Embedding's gradient reaches the optimizer as Keras `fit` hands it over: `IndexedSlices`,
a row per lookup, applied sparsely.

Keras 3 Adam applied to `IndexedSlices` sums the squares of a token's rows into its second
moment; applied to the same gradient made dense, it squares their sum. The original is Keras
`fit` on a bag-of-embeddings classifier (token ids that repeat within and across examples),
Adam at 1e-2, batches of 32 without shuffling; the port trains the same model through orbitask's
default step (`clip_norm=None`, as `fit` does not clip). On one device and on 2 mirrored
replicas, the port ends at `fit`'s weights; the gradient accumulated over 2 micro-batches keeps
its rows too. tf_keras' optimizers sum a token's rows before they apply them, so there both kinds
agree; the tf_keras cases check that the gathered rows still train `fit`'s weights.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import orbitask
from orbitask.tasks.gradients import zero_nans_and_clip
from tests.helpers import keras_module
from tests.ports import BATCH_SIZE, EPOCHS, EXAMPLES, SEED, STEPS, weights_of

VOCAB, LENGTH, CLASSES = 12, 6, 3
TOLERANCE = dict(rtol=1e-5, atol=1e-6)  # the order of a row sum; densified: off by 2e-2


def make_data() -> tuple[np.ndarray, np.ndarray]:
    """`EXAMPLES` sequences of `LENGTH` token ids below `VOCAB`, and labels (seeded)."""
    rng = np.random.RandomState(SEED)
    x = rng.randint(0, VOCAB, size=(EXAMPLES, LENGTH)).astype(np.int32)
    return x, rng.randint(0, CLASSES, size=EXAMPLES).astype(np.int64)


def get_model(k) -> keras.Model:
    """The classifier in Keras flavour `k` (the module `keras` or `tf_keras`)."""
    k.utils.set_random_seed(SEED)
    return k.Sequential(
        [
            k.Input((LENGTH,), dtype="int32"),
            k.layers.Embedding(VOCAB, 8),
            k.layers.GlobalAveragePooling1D(),
            k.layers.Dense(CLASSES),
        ]
    )


def fit(flavour="keras", examples=EXAMPLES, epochs=EPOCHS) -> list[np.ndarray]:
    """Keras `fit`'s weights after `epochs` epochs of the first `examples` examples."""
    x, y = make_data()
    k = keras_module(flavour)
    model = get_model(k)
    loss = k.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=k.optimizers.Adam(1e-2), loss=loss)
    model.fit(
        x[:examples], y[:examples], batch_size=BATCH_SIZE, epochs=epochs, shuffle=False, verbose=0
    )
    return weights_of(model)


class Embedded(orbitask.Task):
    def __init__(self, flavour):
        super().__init__(clip_norm=None)
        self.k = keras_module(flavour)
        self.model = None

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        dataset = tf.data.Dataset.from_tensor_slices(make_data())
        return dataset.batch(per_replica_batch_size).repeat()

    def build_model(self):
        self.model = get_model(self.k)
        return self.model

    def build_losses(self):
        losses = self.k.losses
        per_example = losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
        return lambda loss_input: per_example(loss_input[1], loss_input[0])

    def build_optimizer(self, learning_rate):
        return self.k.optimizers.Adam(1e-2)


def _port(model_dir, flavour="keras", replicas=1, micro_batches=1, steps=STEPS):
    """The port's weights after `steps` steps."""
    task = Embedded(flavour)
    distribution = (
        {"strategy": "mirrored", "cpu_devices": replicas} if replicas > 1 else {}
    )  # fmt: skip
    orbitask.run_experiment(
        task, str(model_dir), mode="train", train_steps=steps,
        global_batch_size=BATCH_SIZE // micro_batches, gradient_accumulation_steps=micro_batches,
        progress=False, seed=SEED, **distribution,
    )  # fmt: skip
    return weights_of(task.model)


def _assert_close(expected, got):
    assert len(expected) == len(got)
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_allclose(b, a, **TOLERANCE)


FLAVOURS = ["keras", "tf_keras"]


@pytest.mark.slow
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_one_device_trains_fits_weights(flavour, tmp_path):
    _assert_close(fit(flavour), _port(tmp_path, flavour))


@pytest.mark.slow
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_two_replicas_train_fits_weights(flavour, tmp_path):
    """Each replica's rows are gathered; a Keras 3 optimizer (which sums over replicas itself)
    gets every row once."""
    _assert_close(fit(flavour), _port(tmp_path, flavour, replicas=2))


@pytest.mark.slow
def test_an_accumulated_gradient_keeps_its_rows(tmp_path):
    """Updates of two batches of 16 each (the first epoch's 96 examples, then `fit` in batches
    of 32): their rows are joined, not summed densely."""
    _assert_close(fit(examples=96, epochs=1), _port(tmp_path, micro_batches=2, steps=3))


def test_the_norm_and_the_clip_are_those_of_the_dense_gradient():
    """Rows of one index count as their sum in the global norm (the `grad_norm` log and the
    clip), and the clipped gradient stays `IndexedSlices`."""
    values = tf.constant([[3.0, 0.0], [1.0, 0.0], [0.0, 4.0]])
    sparse = tf.IndexedSlices(values, tf.constant([2, 2, 0]), tf.constant([5, 2]))
    dense = tf.convert_to_tensor(sparse)
    update, display = zero_nans_and_clip([sparse], clip_norm=2.0)
    assert float(display.global_norm) == pytest.approx(float(tf.norm(dense)))  # 4 * sqrt(2)
    assert isinstance(update[0], tf.IndexedSlices)
    np.testing.assert_allclose(tf.convert_to_tensor(update[0]), dense * 2.0 / tf.norm(dense))
