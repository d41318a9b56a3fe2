"""`NanGuard`: skip updates whose loss or gradient is not finite, or whose loss spikes; roll
back once after K bad steps in a row.

A step is bad when its loss or any entry of its all-reduced gradient (before `update_pre` zeroes
non-finite entries) is NaN or +-Inf, or, with `spike_factor` F, when its loss (the mean over
replicas) exceeds F times the recent average of accepted losses; a bad step is detected before
its update and applies none. The recent average is the mean of the first `SPIKE_HORIZON` losses
of steps the guard accepted, then an exponential moving average of them with weight
1 / `SPIKE_HORIZON`; it acts once `spike_warmup` steps were accepted, and only while it is
positive. The counters and the average are in the checkpoint, so a resumed run decides as an
uninterrupted one, and a rollback restores them with the weights.
Off by default (the default `update_pre` then zeroes non-finite gradient entries and the step is
taken; `ZeroedSteps` counts those steps and says so). Enable it in gin with
`orbitask.run_experiment.nan_guard = @orbitask.NanGuard()`. Works with the default `train_step`
(it needs `Task.compute_update`); a task that overrides `train_step` whole is rejected.
"""

from __future__ import annotations

from typing import Any

import gin
import tensorflow as tf
from absl import logging

from orbitask.common import setting_rules
from orbitask.tasks import gradients as gradients_lib
from orbitask.trainers.actions.schedule import Periodic
from orbitask.trainers.actions.triggers import Trigger
from orbitask.trainers.distribution import cluster
from orbitask.trainers.errors import ConfigError, NonFiniteLossError

SPIKE_HORIZON = 100  # accepted losses in the recent average (the EMA's 1 / weight)


@gin.configurable("NanGuard", module="orbitask")
class NanGuard:
    """Skips steps whose loss or gradient is not finite, or whose loss spikes (weights,
    optimizer slots and iterations unchanged).

    Args:
      patience: consecutive skipped steps that trigger a rollback to the latest checkpoint.
      max_rollbacks: rollbacks allowed in one run; reaching `patience` again after them stops
        the run with `NonFiniteLossError` (never an endless restore-replay loop).
      spike_factor: F > 1: also skip (and count) a step whose loss exceeds F times the recent
        average of accepted losses (module docstring); None: off.
      spike_warmup: accepted steps before the spike check acts (their losses make the first
        average).
    """

    def __init__(
        self,
        patience: int = 3,
        max_rollbacks: int = 1,
        spike_factor: float | None = None,
        spike_warmup: int = 20,
    ):
        setting_rules.check(
            "NanGuard",
            dict(
                patience=patience,
                max_rollbacks=max_rollbacks,
                spike_factor=spike_factor,
                spike_warmup=spike_warmup,
            ),
        )
        if spike_factor is not None and spike_factor <= 1:
            raise ConfigError(
                f"`NanGuard.spike_factor` must be greater than 1 (or None: off); received "
                f"{spike_factor!r}: a factor <= 1 skips ordinary steps. Fix "
                "orbitask.NanGuard.spike_factor in your .gin file."
            )
        self.patience = patience
        self.max_rollbacks = max_rollbacks
        self.spike_factor = spike_factor
        self.spike_warmup = spike_warmup
        self.rollbacks = 0
        self.streak = None
        self.skipped = None
        self.loss_average = None
        self.accepted = None

    def build(self) -> None:
        """Creates the counters; returns None. Eager, once, inside `strategy.scope()`."""
        kwargs = dict(
            dtype=tf.int64,
            trainable=False,
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
        self.streak = tf.Variable(0, name="nan_guard_streak", **kwargs)
        self.skipped = tf.Variable(0, name="nan_guard_skipped", **kwargs)
        self.accepted = tf.Variable(0, name="nan_guard_accepted", **kwargs)
        kwargs["dtype"] = tf.float32
        self.loss_average = tf.Variable(0.0, name="nan_guard_loss_average", **kwargs)

    def checkpoint(self) -> tf.train.Checkpoint:
        """Returns the guard's state to save with the run (counters and recent average). Eager,
        after `build`."""
        return tf.train.Checkpoint(
            streak=self.streak,
            skipped=self.skipped,
            accepted=self.accepted,
            loss_average=self.loss_average,
        )

    def is_spike(self, loss: tf.Tensor) -> tf.Tensor:
        """Returns whether `loss` (the step's loss, a scalar) exceeds `spike_factor` times the
        recent average, once `spike_warmup` steps were accepted and while the average is
        positive (False when `spike_factor` is None). Cross-replica context, traced."""
        if self.spike_factor is None:
            return tf.constant(False)
        average = self.loss_average.read_value()
        warm = tf.logical_and(self.accepted >= self.spike_warmup, average > 0)
        return tf.logical_and(warm, tf.cast(loss, tf.float32) > self.spike_factor * average)

    def record(self, bad: tf.Tensor, loss: tf.Tensor | None = None) -> None:
        """Counts one step (cross-replica context, traced by tf.function); returns None.

        `bad` is a scalar bool; `loss`, the step's loss (a scalar), joins the recent average
        when the step is not bad (None: the average is not kept).
        """
        if loss is not None:
            good = tf.logical_not(bad)
            count = self.accepted + tf.cast(good, tf.int64)
            weight = 1.0 / tf.cast(tf.clip_by_value(count, 1, SPIKE_HORIZON), tf.float32)
            average = self.loss_average.read_value()
            moved = average + (tf.cast(loss, tf.float32) - average) * weight
            self.loss_average.assign(tf.where(good, moved, average))
            self.accepted.assign(count)
        bad = tf.cast(bad, tf.int64)
        self.skipped.assign_add(bad)
        self.streak.assign((self.streak + 1) * bad)

    def tripped(self) -> tf.Tensor:
        """Returns True once `patience` bad steps happened in a row (ends the device loop early).

        Traced by tf.function, in the device loop's condition.
        """
        return self.streak >= self.patience

    def entry(self, checkpoint, manager, strategy, global_step, trainer) -> Periodic:
        """The `nan_guard` entry of a schedule: after a device loop that left `patience` bad
        steps in a row (its trigger's condition, one read of `streak`), rolls back or stops
        (`after_loop`) and sets `trainer.last_step` to the restored step. Eager; returns the
        `Periodic`."""

        def roll_back(train_output) -> None:
            del train_output
            if self.after_loop(checkpoint, manager, strategy, global_step):
                trainer.last_step = int(global_step.numpy())

        return Periodic("nan_guard", roll_back, when=Trigger(condition=self.is_tripped))

    def is_tripped(self) -> bool:
        """Returns whether the last device loop left `patience` bad steps in a row (a bool).
        Eager, one read of `streak`."""
        return int(self.streak.numpy()) >= self.patience

    def after_loop(self, checkpoint, manager, strategy, global_step) -> bool:
        """Eager, after each device loop and before any save: rolls back or stops.

        Returns whether it rolled back (the global step moved).

        Raises:
          NonFiniteLossError: when the rollbacks are used up or there is no checkpoint.
        """
        if not self.is_tripped():
            return False
        step = int(global_step.numpy())
        bad = "not finite"
        if self.spike_factor is not None:
            bad += f" (or the loss over {self.spike_factor:g} x its recent average)"
        if self.rollbacks >= self.max_rollbacks:
            raise NonFiniteLossError(
                f"the loss or its gradient was {bad} for {self.patience} consecutive steps "
                f"(up to step {step}) after {self.rollbacks} rollback(s); stopping. Check the "
                "input data or lower the learning rate; the checkpoints in the model directory "
                "are intact."
            )
        manager.sync()  # an async save under way is the newest checkpoint once written
        path = manager.latest_checkpoint
        if path is None:
            raise NonFiniteLossError(
                f"the loss or its gradient was {bad} for {self.patience} consecutive steps "
                f"(up to step {step}) and there is no checkpoint to roll back to; stopping."
            )
        with strategy.scope():
            checkpoint.restore(path)
        self.rollbacks += 1
        self.streak.assign(0)
        logging.warning(
            "NanGuard: %d bad steps in a row up to step %d; rolled back to %s.",
            self.patience,
            step,
            path,
        )
        what = "non-finite or spiking loss" if self.spike_factor is not None else "non-finite loss"
        print(
            f"orbitask: {what} or gradient up to step {step}; rolled back to {path}",
            flush=True,
        )
        return True


class ZeroedSteps:
    """Without the NaN guard: counts the steps whose non-finite gradient entries the default
    update set to 0 (`tasks.gradients.counting_zeroed`), says it in one line at the device loop
    where the first came and at the end of the run, and writes the count as the TensorBoard
    scalar `nonfinite_gradient_steps` after each device loop that added to it. Eager; one read
    of the counter after each device loop, no work in a step without such an entry.
    """

    TAG = "nonfinite_gradient_steps"

    def __init__(self):
        self.count = tf.Variable(0, dtype=tf.int64, trainable=False, name=self.TAG)
        self.said = 0

    def counting(self):
        """The context in which the steps traced count (`counting_zeroed`)."""
        return gradients_lib.counting_zeroed(self.count)

    def after_loop(self, step: int, writer) -> None:
        """After a device loop that ended at `step`: the first line, and the summary into
        `writer` when the count grew. Eager; returns None."""
        count = int(self.count.numpy())
        if count == self.said:
            return
        if self.said == 0:
            print(
                f"orbitask: warning: non-finite gradients (NaN or Inf) by step {step}: their "
                "entries were set to 0 and the steps taken; the count is said at the end "
                "(orbitask.run_experiment.nan_guard = @orbitask.NanGuard() skips such steps)",
                flush=True,
            )
        self.said = count
        with writer.as_default():
            tf.summary.scalar(self.TAG, count, step=step)

    def end(self) -> None:
        """At the end of the run (finished or stopped): its line, when a step had such an
        entry. Eager; returns None."""
        count = int(self.count.numpy())
        if count:
            print(f"orbitask: {count} steps had non-finite gradients, zeroed", flush=True)

    @classmethod
    def of_run(cls, training_chief: bool, strategy: Any, objects: Any) -> ZeroedSteps | None:
        """A count for the chief of a training run (`training_chief`) without the NaN guard or
        float16 loss scaling (which skip such steps), not under parameter_server; else None.
        Eager."""
        if not training_chief or objects.nan_guard is not None or objects.loss_scale is not None:
            return None
        return None if cluster.is_parameter_server(strategy) else cls()
