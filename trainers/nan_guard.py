"""`NanGuard`: skip updates whose loss or gradient is not finite; roll back once after K bad
steps in a row.

A step is bad when its loss or any entry of its all-reduced gradient (before `update_pre` zeroes
non-finite entries) is NaN or +-Inf; a bad step is detected before its update and applies none.
Off by default (the default `update_pre` then zeroes non-finite gradient entries and the step is
taken). Enable it in gin with `orbitask.run_experiment.nan_guard = @orbitask.NanGuard()`. Works
with the default `train_step` (it needs `Task.compute_update`); a task that overrides
`train_step` whole is rejected.
"""

from __future__ import annotations

import gin
import tensorflow as tf
from absl import logging

from orbitask.trainers.errors import ConfigError, NonFiniteLossError


@gin.configurable("NanGuard", module="orbitask")
class NanGuard:
    """Skips steps whose loss or gradient is not finite (weights, optimizer slots and
    iterations unchanged).

    Args:
      patience: consecutive skipped steps that trigger a rollback to the latest checkpoint.
      max_rollbacks: rollbacks allowed in one run; reaching `patience` again after them stops
        the run with `NonFiniteLossError` (never an endless restore-replay loop).
    """

    def __init__(self, patience: int = 3, max_rollbacks: int = 1):
        for name, value, low in (("patience", patience, 1), ("max_rollbacks", max_rollbacks, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(
                    f"`NanGuard.{name}` must be an integer >= {low}; received {value!r}. "
                    "Fix it in your .gin file."
                )
        self.patience = patience
        self.max_rollbacks = max_rollbacks
        self.rollbacks = 0
        self.streak = None
        self.skipped = None

    def build(self) -> None:
        """Creates the counters; returns None. Eager, once, inside `strategy.scope()`."""
        kwargs = dict(
            dtype=tf.int64,
            trainable=False,
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
        self.streak = tf.Variable(0, name="nan_guard_streak", **kwargs)
        self.skipped = tf.Variable(0, name="nan_guard_skipped", **kwargs)

    def record(self, bad: tf.Tensor) -> None:
        """Counts one step (cross-replica context, traced by tf.function); returns None.

        `bad` is a scalar bool.
        """
        bad = tf.cast(bad, tf.int64)
        self.skipped.assign_add(bad)
        self.streak.assign((self.streak + 1) * bad)

    def tripped(self) -> tf.Tensor:
        """Returns True once `patience` bad steps happened in a row (ends the device loop early).

        Traced by tf.function, in the device loop's condition.
        """
        return self.streak >= self.patience

    def action(self, checkpoint, manager, strategy, global_step, trainer):
        """Returns the train action (eager, after each device loop) calling `after_loop`; after
        a rollback it sets `trainer.last_step` to the restored step."""

        def roll_back_if_due(train_output) -> None:
            del train_output
            if self.after_loop(checkpoint, manager, strategy, global_step):
                trainer.last_step = int(global_step.numpy())

        return roll_back_if_due

    def after_loop(self, checkpoint, manager, strategy, global_step) -> bool:
        """Eager, after each device loop and before any save: rolls back or stops.

        Returns whether it rolled back (the global step moved).

        Raises:
          NonFiniteLossError: when the rollbacks are used up or there is no checkpoint.
        """
        if int(self.streak.numpy()) < self.patience:
            return False
        step = int(global_step.numpy())
        if self.rollbacks >= self.max_rollbacks:
            raise NonFiniteLossError(
                f"the loss or its gradient was not finite for {self.patience} consecutive steps "
                f"(up to step {step}) after {self.rollbacks} rollback(s); stopping. Check the "
                "input data or lower the learning rate; the checkpoints in the model directory "
                "are intact."
            )
        manager.sync()  # an async save under way is the newest checkpoint once written
        path = manager.latest_checkpoint
        if path is None:
            raise NonFiniteLossError(
                f"the loss or its gradient was not finite for {self.patience} consecutive steps "
                f"(up to step {step}) and there is no checkpoint to roll back to; stopping."
            )
        with strategy.scope():
            checkpoint.restore(path)
        self.rollbacks += 1
        self.streak.assign(0)
        logging.warning(
            "NanGuard: %d non-finite steps in a row up to step %d; rolled back to %s.",
            self.patience,
            step,
            path,
        )
        print(
            f"orbitask: non-finite loss or gradient up to step {step}; rolled back to {path}",
            flush=True,
        )
        return True
