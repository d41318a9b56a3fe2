"""nabu's validation-driven control: keep the best checkpoint, halve the LR, stop early.

An Orbit eval action. Each evaluation's chosen metric is compared with the best so far using
`official.core.train_utils.BestCheckpointExporter`, which also exports the best checkpoint to
`model_dir/best/` and persists the best value (a JSON file), so all of it survives a resume.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import gin
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

    def build(self) -> tf.train.Checkpoint:
        """Eager, in strategy scope: creates the state; returns it (a Checkpoint) to save."""
        self.worse = tf.Variable(
            0,
            dtype=tf.int64,
            trainable=False,
            name="worse_validations",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
        return tf.train.Checkpoint(worse_validations=self.worse)

    def stopped(self) -> bool:
        """Eager. Returns True if the (restored) state says training already stopped early."""
        patience = self.early_stop_patience
        return patience is not None and int(self.worse.numpy()) >= patience

    def action(self, model_dir, checkpoint, manager, learning_rate, global_step, ema=None):
        """Eager. Returns the eval action, a callable run eagerly after each evaluation."""
        from official.core import train_utils  # here: `official` is heavy to import

        exporter = train_utils.BestCheckpointExporter(
            os.path.join(model_dir, "best"),
            self.metric,
            "higher" if self.higher_is_better else "lower",
        )

        def act(eval_logs: dict[str, Any]) -> None:
            step = int(global_step.numpy())
            _check_metric(eval_logs, self.metric)
            with ema.averaged() if ema is not None else contextlib.nullcontext():
                improved = exporter.maybe_export_checkpoint(checkpoint, eval_logs, step)
            if improved:
                self.worse.assign(0)
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


def _check_metric(logs: dict, metric: str) -> None:
    node: Any = logs
    for key in metric.split("|"):
        if not isinstance(node, dict) or key not in node:
            raise ConfigError(
                f"ValidationControl.metric {metric!r} is not in the eval logs (keys: "
                f"{sorted(logs)}); set it to one of them in your .gin file."
            )
        node = node[key]
