"""`ParameterServerTrainer`: the `TaskTrainer` for `ParameterServerStrategy`, run by a coordinator.

The chief is the coordinator: it runs the program, the Controller, callbacks and checkpoints.
Each device loop of `num_steps` steps is split into a few closures that
`ClusterCoordinator.schedule` hands to whichever worker is free; `train` returns after `join()`.
Workers apply their updates to the variables on the parameter servers asynchronously: a step is
one worker's update on `global_batch_size` examples (`global_batch_size / replicas per worker`
per replica), not a synchronous step of the whole cluster.

Worker failures are TensorFlow's to handle: the coordinator re-runs a failed closure on another
worker and re-admits the worker when it comes back. A re-run closure may have applied part of
its updates already (as in any asynchronous job), but the global step is set by the coordinator
after `join()` to exactly the steps scheduled. A parameter server or coordinator failure ends
the job: restart it from the last checkpoint (`orbitask launch --max_restarts`).

Evaluation runs on the coordinator, reading the variables from the parameter servers.
"""

from __future__ import annotations

import tensorflow as tf

from orbitask.common import keras_compat
from orbitask.trainers.distribution.cluster import num_ps_workers
from orbitask.trainers.engine.task_trainer import TaskTrainer
from orbitask.trainers.errors import ConfigError


class ParameterServerTrainer(TaskTrainer):
    """`TaskTrainer` whose device loops run on the workers through `ClusterCoordinator.schedule`.

    Takes `TaskTrainer`'s arguments; `train_iterator` is the per-worker iterator of
    `trainers.engine.inputs.train_input`. Loops are always `tf.function`s (scheduled functions must
    be); `nan_guard` is not supported (workers do not update in lockstep).

    Raises:
      ConfigError: when a NanGuard is given.
    """

    copies_learning_rate_in_loop = False  # once on the coordinator, not in every closure
    device_eval_loop = False  # the coordinator evaluates a plain dataset, step by step

    def __init__(self, **kwargs):
        if kwargs["objects"].nan_guard is not None:
            raise ConfigError(
                "`nan_guard` is not supported with strategy='parameter_server' (workers update "
                "asynchronously); remove run_experiment.nan_guard from your .gin file."
            )
        kwargs["use_tf_while_loop"] = True
        super().__init__(**kwargs)
        self.coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(self.strategy)
        self.workers = num_ps_workers(self.strategy)

    def train(self, num_steps: tf.Tensor) -> dict:
        """Eager: schedules `num_steps` steps over the workers, waits; returns the last logs."""
        self.phase = "step"
        self.train_loop_begin()
        fresh = self._loop_fn is None
        if fresh:
            self._loop_fn = self.create_train_loop_fn()
        start, total = int(self.global_step.numpy()), int(num_steps)
        results = [
            self.coordinator.schedule(self._loop_fn, args=(self._iterator, tf.constant(n)))
            for n in split_steps(total, 2 * self.workers)
        ]
        self.coordinator.join()
        # In-graph increments count a closure re-run after a worker failure twice; this does not.
        self.global_step.assign(start + total)
        self.last_step = start + total
        if fresh:
            keras_compat.refresh_tracking(self.optimizer)
        out = results[-1].fetch()
        # After `join`: every closure's updates are in the metrics and the learning rate.
        out["metrics"] = {m.name: m.result() for m in self.train_metrics}
        out["learning_rate"] = self.lr.numpy()
        return self.train_loop_end(out)

    def eval_step(self, iterator):
        """One validation step on the coordinator (traced); logs as 1-tuples (one "replica")."""
        logs = self._replica_eval_step(next(iterator))
        return {key: (value,) for key, value in logs.items()}


def split_steps(total: int, pieces: int) -> list[int]:
    """`total` steps as at most `pieces` near-equal positive chunks, larger ones first."""
    pieces = max(1, min(total, pieces))
    base, extra = divmod(total, pieces)
    return [base + (1 if i < extra else 0) for i in range(pieces)]
