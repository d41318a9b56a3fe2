"""Seeds every random source and turns on TensorFlow's op determinism."""

from __future__ import annotations

import random

import keras
import numpy as np
import tensorflow as tf
import tf_keras

from orbitask.trainers.errors import ConfigError


def make_deterministic(seed: int) -> None:
    """Seeds Python, NumPy, TensorFlow and both Keras flavours; enables op determinism.

    Call before anything random is built (the runner does, first thing, when `seed` is set).
    Two fresh runs of the same experiment then give identical weights.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(
            f"`seed` must be an integer or None; received {seed!r}. Set run_experiment.seed."
        )
    random.seed(seed)
    np.random.seed(seed)
    tf.random.set_seed(seed)
    keras.utils.set_random_seed(seed)
    tf_keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()
