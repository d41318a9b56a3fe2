"""`DigitsCNN`: a small convolutional network on the same 8x8 digits as `DigitsClassification`."""

from __future__ import annotations

import gin
import keras

from orbitask.tasks.examples.digits import DigitsClassification


@gin.configurable("DigitsCNN", module="orbitask")
class DigitsCNN(DigitsClassification):
    """Classify the 8x8 digit images with a Keras 3 CNN; data, split, loss and metric as the MLP.

    The input stays the flat 64 pixels of `DigitsClassification.build_inputs`; the model reshapes
    it to 8x8x1. Only `build_model` differs from the MLP task.

    Args:
      filters: output channels of the 3x3 ReLU convolutions (a 2x2 max-pool follows the first).
      dense_units: width of the hidden dense layer after the convolutions.
      l2: L2 regularisation of the convolution and dense kernels (lands in `model.losses`).
      shuffle_buffer: None: a global shuffle by index; a number: a `tf.data` shuffle buffer.
      seed: seed of the split and the shuffle.
    """

    def __init__(
        self,
        filters: tuple = (32, 64),
        dense_units: int = 64,
        l2: float = 0.0,
        shuffle_buffer: int | None = None,
        seed: int = 0,
    ):
        super().__init__(hidden_units=(), l2=l2, shuffle_buffer=shuffle_buffer, seed=seed)
        self.filters = tuple(filters)
        self.dense_units = dense_units

    def build_model(self):
        """Returns the Keras 3 CNN (`digits_cnn`). Eager, once, inside `strategy.scope()`."""
        reg = keras.regularizers.L2(self.l2) if self.l2 else None
        layers = [keras.Input((64,)), keras.layers.Reshape((8, 8, 1))]
        for i, channels in enumerate(self.filters):
            layers.append(
                keras.layers.Conv2D(
                    channels, 3, padding="same", activation="relu", kernel_regularizer=reg
                )
            )
            if i == 0:
                layers.append(keras.layers.MaxPooling2D(2))
        layers += [
            keras.layers.Flatten(),
            keras.layers.Dense(self.dense_units, activation="relu", kernel_regularizer=reg),
            keras.layers.Dense(10),
        ]
        return keras.Sequential(layers, name="digits_cnn")
