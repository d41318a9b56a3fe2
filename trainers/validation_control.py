"""nabu's validation-driven control: keep the best checkpoint, halve the LR, stop early.

An Orbit eval action. Each evaluation's chosen metric is compared with the best so far; a better
one is exported to `model_dir/best/` (`best_ckpt-<step>`, and `info.json` written by
`official.core.train_utils.BestCheckpointExporter`). The state that decides what happens next
(the best value, the count of worse validations in a row; the learning-rate factor is the
run's) lives in variables of the run's checkpoint, which the action saves after each
evaluation: a checkpoint says how far validation had got, never the JSON file, which a killed
run may have written past its last checkpoint. An evaluation repeated after a resume compares
with the same best value and rewrites the same export.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import gin
import numpy as np
import tensorflow as tf
from absl import logging

from orbitask.trainers.errors import ConfigError, EarlyStop


@gin.configurable("ValidationControl", module="orbitask")
class ValidationControl:
    """What to do when a validation is not better than the best so far.

    Args:
      metric: the eval log to watch (nested keys joined with "|"), e.g. "loss" or "accuracy".
      higher_is_better: True for accuracy-like metrics.
      halve_lr_on_worse: multiply the learning rate by `lr_multiplier` after a worse validation.
      lr_multiplier: nabu halves (0.5).
      early_stop_patience: stop after this many worse validations in a row (None: never).
    """

    def __init__(
        self,
        metric: str = "loss",
        higher_is_better: bool = False,
        halve_lr_on_worse: bool = True,
        lr_multiplier: float = 0.5,
        early_stop_patience: int | None = None,
    ):
        if early_stop_patience is not None and early_stop_patience < 1:
            raise ConfigError(
                f"`ValidationControl.early_stop_patience` must be >= 1 or None; received "
                f"{early_stop_patience!r}."
            )
        self.metric = metric
        self.higher_is_better = higher_is_better
        self.halve_lr_on_worse = halve_lr_on_worse
        self.lr_multiplier = lr_multiplier
        self.early_stop_patience = early_stop_patience
        self.worse = None
        self.best = None

    def build(self) -> tf.train.Checkpoint:
        """Eager, in strategy scope: creates the state; returns it (a Checkpoint) to save."""
        self.worse = _state(0, tf.int64, "worse_validations")
        self.best = _state(float("nan"), tf.float64, "best_value")  # NaN: no validation yet
        return tf.train.Checkpoint(worse_validations=self.worse, best_value=self.best)

    def better(self, value: float) -> bool:
        """Eager. Returns whether `value` beats the best so far (any value beats none)."""
        best = float(self.best.numpy())
        if best != best:
            return True
        return value > best if self.higher_is_better else value < best

    def stopped(self) -> bool:
        """Eager. Returns True if the (restored) state says training already stopped early."""
        patience = self.early_stop_patience
        return patience is not None and int(self.worse.numpy()) >= patience

    def action(self, model_dir, checkpoint, manager, learning_rate, global_step, ema=None):
        """Eager. Returns the eval action, a callable run eagerly after each evaluation."""
        from official.core import train_utils  # here: `official` is heavy to import

        directory = os.path.join(model_dir, "best")
        exporter = train_utils.BestCheckpointExporter(
            directory, self.metric, "higher" if self.higher_is_better else "lower"
        )
        best_manager = tf.train.CheckpointManager(
            checkpoint, directory, max_to_keep=1, checkpoint_name=train_utils.BEST_CHECKPOINT_NAME
        )

        def act(eval_logs: dict[str, Any]) -> None:
            step = int(global_step.numpy())
            value = _check_metric(eval_logs, self.metric)
            if self.better(value):
                self.best.assign(value)
                self.worse.assign(0)
                exporter.export_best_eval_metric(eval_logs, step)
                with ema.averaged() if ema is not None else contextlib.nullcontext():
                    best_manager.save(checkpoint_number=step)
            else:
                self.worse.assign_add(1)
                if self.halve_lr_on_worse:
                    learning_rate.scale(self.lr_multiplier)
                    logging.info("validation worse at step %d: learning rate scaled", step)
            # Save the control state with the step it belongs to, so a resume agrees with it.
            manager.save(checkpoint_number=step, check_interval=False)
            if self.stopped():
                raise EarlyStop(
                    f"early stop at step {step}: {self.metric} did not improve for "
                    f"{self.early_stop_patience} validation(s)"
                )

        return act


def _state(value, dtype, name: str) -> tf.Variable:
    aggregation = tf.VariableAggregation.ONLY_FIRST_REPLICA
    return tf.Variable(value, dtype=dtype, trainable=False, name=name, aggregation=aggregation)


def _check_metric(logs: dict, metric: str) -> float:
    """Returns the value of `metric` in `logs`; raises ConfigError when it is not there."""
    node: Any = logs
    for key in metric.split("|"):
        if not isinstance(node, dict) or key not in node:
            raise ConfigError(
                f"ValidationControl.metric {metric!r} is not in the eval logs (keys: "
                f"{sorted(logs)}); set it to one of them in your .gin file."
            )
        node = node[key]
    return float(np.asarray(node))
