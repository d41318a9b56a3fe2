"""Exponential moving average of the model weights, for evaluation and export.

After every optimizer update (in the device loop, cross-replica context) each shadow becomes
`decay * shadow + (1 - decay) * weight`. Evaluations, and the best-checkpoint export of
`ValidationControl`, run with the averaged weights swapped in; training always continues from
the raw weights. The shadows are checkpointed (`ema/`), so averaging survives a resume.
"""

from __future__ import annotations

import contextlib
from typing import Any

import gin
import tensorflow as tf

from orbitask.common import setting_rules


@gin.configurable("ExponentialMovingAverage", module="orbitask")
class ExponentialMovingAverage:
    """Averages the model's trainable weights with `decay` (e.g. 0.999).

    Args:
      decay: weight of the previous average; in (0, 1).
    """

    def __init__(self, decay: float = 0.999):
        setting_rules.check("ExponentialMovingAverage", {"decay": decay})
        self.decay = decay
        self.variables: list = []
        self.shadows: list = []

    def build(self, model: Any) -> tf.train.Checkpoint:
        """Eager, in strategy scope: creates the shadows; returns them to checkpoint."""
        models = model.values() if isinstance(model, dict) else [model]
        self.variables = [v for m in models for v in m.trainable_variables]
        self.shadows = [
            tf.Variable(
                tf.convert_to_tensor(v),
                trainable=False,
                name="ema",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )
            for v in self.variables
        ]
        return tf.train.Checkpoint(shadows=self.shadows)

    def update(self) -> None:
        """Traced, cross-replica, after each update: moves every shadow toward its weight.

        Returns None.
        """
        for shadow, variable in zip(self.shadows, self.variables, strict=True):
            shadow.assign(self.decay * shadow + (1.0 - self.decay) * tf.convert_to_tensor(variable))

    @contextlib.contextmanager
    def averaged(self):
        """Eager context: the model holds the averaged weights inside, its own ones after.

        Returns (yields) nothing; use it as `with ema.averaged(): ...`.
        """
        saved = [tf.identity(tf.convert_to_tensor(v)) for v in self.variables]
        for variable, shadow in zip(self.variables, self.shadows, strict=True):
            variable.assign(tf.convert_to_tensor(shadow))
        try:
            yield
        finally:
            for variable, value in zip(self.variables, saved, strict=True):
                variable.assign(value)
