"""`DigitsParity`: odd or even, on the same 8x8 digits as `DigitsClassification`."""

from __future__ import annotations

import gin

from orbitask.tasks.examples.digits import DigitsClassification


@gin.configurable("DigitsParity", module="orbitask")
class DigitsParity(DigitsClassification):
    """Tell odd from even digits: the digits MLP with 2 logits and labels `digit % 2`.

    Same images, split and shuffle as `DigitsClassification` with the same seed, so in a
    `MultiTask` with sharing="trunk" it is a second head on the digit classifier's trunk
    (experiments/digits_multitask.gin).

    Args:
      hidden_units: widths of the hidden ReLU layers.
      l2: L2 regularisation of the hidden kernels (lands in `model.losses`).
      shuffle_buffer: None: a global shuffle by index; a number: a `tf.data` shuffle buffer.
      seed: seed of the split and the shuffle.
    """

    num_classes = 2

    def __init__(
        self,
        hidden_units: tuple = (128, 64),
        l2: float = 0.0,
        shuffle_buffer: int | None = None,
        seed: int = 0,
    ):
        super().__init__(hidden_units=hidden_units, l2=l2, shuffle_buffer=shuffle_buffer, seed=seed)
        self._train = (self._train[0], self._train[1] % 2)
        self._val = (self._val[0], self._val[1] % 2)
