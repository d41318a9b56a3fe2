"""`TaskEvaluator`: the Orbit evaluator half of `TaskTrainer`, running a Task's validation step.

Hook order, as the Controller drives it::

    evaluate(num_steps or -1):                  # with the EMA weights swapped in, if any
      eval_begin()                              # reset eval metrics
      each step: logs = strategy.run(task.validation_step)     # tf.function
                 state = task.aggregate_logs(state, per-replica logs)   # eager
      eval_end(state) = task.reduce_aggregated_logs(state) + metric results
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orbit
import tensorflow as tf

from orbitask.trainers.cluster import all_replica_values


class TaskEvaluator(orbit.StandardEvaluator):
    """Evaluates a `tasks.Task` (a mixin of `TaskTrainer`, which sets its attributes).

    Uses `task`, `strategy`, `model`, `loss_fn`, `lr`, `global_step`, `eval_metrics` and `ema`
    (None or a `trainers.ExponentialMovingAverage`).
    """

    def evaluate(self, num_steps: tf.Tensor):
        """Eager: one evaluation, with the averaged weights swapped in when EMA is on.

        Returns the eval logs (`eval_end`'s).
        """
        if self.ema is None:
            return super().evaluate(num_steps)
        with self.ema.averaged():
            return super().evaluate(num_steps)

    def eval_begin(self):
        """Eager: resets eval metrics; returns the empty aggregation state."""
        for metric in self.eval_metrics:
            metric.reset_state()
        return {}

    def eval_step(self, iterator):
        """One distributed validation step; returns per-replica logs as tuples (traced)."""
        batch = next(iterator)
        logs = self.strategy.run(self._replica_eval_step, args=(batch,))
        return tf.nest.map_structure(lambda v: all_replica_values(self.strategy, v), logs)

    def _replica_eval_step(self, batch):
        return self.task.validation_step(
            batch, self.model, self.eval_metrics, loss_fn=self.loss_fn, lr=self.lr
        )

    def eval_reduce(self, state=None, step_outputs=None):
        """Eager: returns the state with one step folded in by the task's `aggregate_logs`."""
        return self.task.aggregate_logs(state, step_outputs)

    def eval_end(self, state=None) -> dict:
        """Eager: returns the task's reduced logs plus Keras metric results."""
        step = int(self.global_step.numpy())
        logs = dict(self.task.reduce_aggregated_logs(state, global_step=step) or {})
        for metric in self.eval_metrics:
            logs[metric.name] = to_python(metric.result())
        return logs


def to_python(value: Any) -> Any:
    """Returns a tensor or array as a Python float (rank 0) or a NumPy array. Eager."""
    value = value.numpy() if hasattr(value, "numpy") else value
    array = np.asarray(value)
    return float(array) if array.ndim == 0 else array
