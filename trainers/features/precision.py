"""Mixed precision: the Keras policy while a model is built, and dynamic loss scaling.

Loss scaling for mixed_float16 is done in cross-replica context, for both Keras flavours.

The default step multiplies the loss by `scale` before differentiating and divides the gradients
back; when the all-reduced gradient is not finite the update is skipped (the trainer's guarded
step) and the scale halves; after `growth_interval` finite steps in a row it doubles. Keras'
LossScaleOptimizer does the same inside `apply`, where a `tf.cond` around the all-reduce is not
allowed under a MirroredStrategy, hence this small version.
"""

from __future__ import annotations

import contextlib

import keras
import tensorflow as tf
import tf_keras


class DynamicLossScale:
    """The loss scale and its good-step counter (checkpointed). Build inside strategy scope.

    Args:
      initial: the starting scale (2**15, as Keras).
      growth_interval: finite steps in a row before the scale doubles.
    """

    def __init__(self, initial: float = 2.0**15, growth_interval: int = 2000):
        kwargs = dict(trainable=False, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        self.scale = tf.Variable(initial, dtype=tf.float32, name="loss_scale", **kwargs)
        self.good_steps = tf.Variable(0, dtype=tf.int64, name="loss_scale_good_steps", **kwargs)
        self.growth_interval = growth_interval

    def update(self, nonfinite: tf.Tensor) -> None:
        """Traced, cross-replica, after each step: halve on overflow, double after a good run.

        Returns None.
        """
        good = tf.logical_not(nonfinite)
        steps = tf.where(good, self.good_steps + 1, 0)
        grow = steps >= self.growth_interval
        self.scale.assign(
            tf.where(
                good,
                tf.where(grow, self.scale * 2.0, self.scale),
                tf.maximum(self.scale / 2.0, 1.0),
            )
        )
        self.good_steps.assign(tf.where(grow, tf.zeros_like(steps), steps))

    def checkpoint(self) -> tf.train.Checkpoint:
        """Eager. Returns the state to save with the run's checkpoint."""
        return tf.train.Checkpoint(scale=self.scale, good_steps=self.good_steps)


@contextlib.contextmanager
def precision_policy(name: str | None):
    """Eager context manager: the Keras policy of both flavours for the block (None: as is)."""
    if name is None:
        yield
        return
    previous = (keras.mixed_precision.global_policy(), tf_keras.mixed_precision.global_policy())
    keras.mixed_precision.set_global_policy(name)
    tf_keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous[0])
        tf_keras.mixed_precision.set_global_policy(previous[1])
