"""The benchmark workloads: one model, dataset and global batch per name, for every contender.

Every contender (orbitask, the hand-written loop, Keras 3 and tf_keras `fit`) builds its model and
input from here, so they train the same network on the same batches with the same optimizer:

- `mlp`: overhead-bound. The digits MLP (64 -> 128 -> 64 -> 10, ReLU) on scikit-learn's 8x8
  digits, global batch 128.
- `cnn`: compute-bound. Conv(16)-pool-Conv(32)-pool-Dense(10) on synthetic 32x32x3 images,
  global batch 64.
- `input`: input-bound. The digits MLP fed through a per-example augmentation (random flip and
  shift of the 8x8 image, noise; stateless ops) in a parallel `map`, global batch 128.

Optimizer everywhere: Nadam(learning_rate 1e-3, epsilon 1e-3) on the global gradient with NaN set
to 0 and the global norm clipped at 10 (orbitask's seed defaults). Loss: softmax cross-entropy,
summed over the replica's batch and divided by the global batch.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

LEARNING_RATE = 1e-3
EPSILON = 1e-3
CLIP_NORM = 10.0
SHUFFLE_SEED = 0


@dataclasses.dataclass(frozen=True)
class Workload:
    """What a workload trains and how long a timed window is.

    Attributes:
      name: "mlp", "cnn" or "input".
      global_batch: examples per step over all replicas.
      window: steps per timed window (a multiple of 100, so orbitask's loops are not cut).
    """

    name: str
    global_batch: int
    window: int


WORKLOADS = {
    "mlp": Workload("mlp", 128, 1000),
    "cnn": Workload("cnn", 64, 100),
    "input": Workload("input", 128, 200),
}


def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    data = load_digits()
    return (data.data / 16.0).astype(np.float32), data.target.astype(np.int32)


def _images() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(0)
    x = rng.uniform(size=(2048, 32, 32, 3)).astype(np.float32)
    return x, rng.randint(0, 10, size=2048).astype(np.int32)


def _augment(example, seed):
    """Per-example augmentation of a flattened 8x8 digit: flip, shift by up to 1 pixel, noise.

    Stateless random ops seeded from `tf.data.Dataset.random`, so the iterator (and with it the
    input position) can be checkpointed; stateful ones (`tf.image.random_flip_left_right`)
    cannot be.
    """
    x, y = example
    seeds = tf.random.experimental.stateless_split(tf.stack([seed, seed // 7]), 3)
    image = tf.reshape(x, (8, 8, 1))
    image = tf.image.stateless_random_flip_left_right(image, seeds[0])
    image = tf.image.pad_to_bounding_box(image, 1, 1, 10, 10)
    image = tf.image.stateless_random_crop(image, (8, 8, 1), seeds[1])
    image = image + tf.random.stateless_normal((8, 8, 1), seeds[2], stddev=0.05)
    return tf.reshape(image, (64,)), y


def dataset(
    name: str,
    per_replica_batch: int,
    input_context: tf.distribute.InputContext | None = None,
    prefetch: int | None = None,
) -> tf.data.Dataset:
    """The infinite, shuffled training dataset of workload `name`, batched per replica. Eager.

    `prefetch` batches are prefetched; by default `tf.data.AUTOTUNE`, except for `input`,
    which prefetches 2: an autotuned buffer grows while the consumer waits, so an input-bound
    contender could bank hundreds of batches while the others run their windows.
    """
    if prefetch is None:
        prefetch = 2 if name == "input" else tf.data.AUTOTUNE
    x, y = _images() if name == "cnn" else _digits()
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    if input_context and input_context.num_input_pipelines > 1:
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    ds = ds.shuffle(len(x) if name != "cnn" else 256, seed=SHUFFLE_SEED).repeat()
    if name == "input":
        ds = tf.data.Dataset.zip(ds, tf.data.Dataset.random(seed=SHUFFLE_SEED))
        ds = ds.map(_augment, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(per_replica_batch, drop_remainder=True)
    return ds.prefetch(prefetch)


def build_model(name: str, flavour: str = "keras"):
    """The workload's model in the given Keras flavour ("keras" or "tf_keras"). Eager."""
    if flavour == "tf_keras":
        import tf_keras as k
    else:
        import keras as k
    if name == "cnn":
        layers = [
            k.Input((32, 32, 3)),
            k.layers.Conv2D(16, 3, padding="same", activation="relu"),
            k.layers.MaxPooling2D(),
            k.layers.Conv2D(32, 3, padding="same", activation="relu"),
            k.layers.MaxPooling2D(),
            k.layers.Flatten(),
            k.layers.Dense(10),
        ]
    else:
        layers = [
            k.Input((64,)),
            k.layers.Dense(128, activation="relu"),
            k.layers.Dense(64, activation="relu"),
            k.layers.Dense(10),
        ]
    return k.Sequential(layers, name=f"bench_{name}")


def build_optimizer(flavour: str = "keras", **kwargs):
    """Nadam(1e-3, epsilon 1e-3) of the given flavour; kwargs go to the constructor. Eager."""
    if flavour == "tf_keras":
        import tf_keras as k
    else:
        import keras as k
    return k.optimizers.Nadam(learning_rate=LEARNING_RATE, epsilon=EPSILON, **kwargs)


def sum_cross_entropy(labels, logits) -> tf.Tensor:
    """Softmax cross-entropy summed over the batch (traced)."""
    return tf.reduce_sum(
        tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=tf.cast(labels, tf.int32), logits=tf.cast(logits, tf.float32)
        )
    )
