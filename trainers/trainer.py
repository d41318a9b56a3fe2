"""`TaskTrainer`: the Orbit trainer and evaluator that run a Task's steps under `strategy.run`.

Hook order, as the Controller drives it::

    train(num_steps):                           # one device loop, num_steps from steps_per_loop
      train_loop_begin()                        # eager: reset metrics, rebuild the step fn
                                                #   if trainable vars changed
      copy lr into the optimizer                # traced, first in the loop function
      repeat num_steps times (tf.while_loop in one tf.function):
        batches = [next(train_iterator) for each local replica]   # plain, checkpointed iterator
        logs = strategy.run(task.train_step, replica r gets batches[r])
        global_step += 1
        (and, for deferred callbacks, append the step's scalar logs to a TensorArray)
      return train_loop_end(last logs, metric results, lr, step)   # read in one go
    # then the Controller's actions: host callbacks (every_steps / at_step), progress, checkpoint

    evaluate(num_steps or -1): see `trainers.evaluation.TaskEvaluator`
"""

from __future__ import annotations

from typing import Any

import orbit
import tensorflow as tf

from orbitask.tasks import keras_compat
from orbitask.trainers.evaluation import TaskEvaluator, to_python


class TaskTrainer(orbit.StandardTrainer, TaskEvaluator):
    """Runs a `tasks.Task`'s `train_step` / `validation_step` on a strategy.

    Args:
      task: the Task.
      strategy: the strategy every object below was built under.
      model, optimizer, loss_fn: the task's built objects.
      lr: the checkpointed learning-rate variable; copied into the optimizer at each loop begin.
      global_step: int64 variable incremented once per train step.
      global_batch_size: the batch of one step summed over replicas.
      train_iterator: a plain `tf.data` iterator yielding one per-replica batch per `next`; each
        step takes one batch per local replica, so it can be checkpointed (exact resume).
      eval_dataset: a distributed dataset for `validation_step`, or None.
      train_metrics, eval_metrics: Keras metrics built by the task.
      use_tf_while_loop: run each device loop as one `tf.while_loop` (default) or a Python loop.
      nan_guard: a built `trainers.NanGuard`, or None (the seed's behaviour).
      gradient_accumulation_steps: batches per optimizer update (K); each step takes K batches
        per replica and sums their gradients before one all-reduce and one update.
      learning_rate: a `trainers.learning_rate.LearningRate` whose schedule sets `lr` at every
        step, or None (then `lr` changes only when a callback assigns it).
      jit_compile: compile the per-replica train step with XLA (not the NaN guard's step).
      record_history: keep every step's scalar logs of the last device loop in `loop_history`
        (for `tasks.deferred` callbacks; about 2 us per step).
    """

    def __init__(
        self,
        *,
        task: Any,
        strategy: tf.distribute.Strategy,
        model: Any,
        optimizer: Any,
        loss_fn: Any,
        lr: tf.Variable,
        global_step: tf.Variable,
        global_batch_size: int,
        train_iterator: Any = None,
        eval_dataset: Any = None,
        train_metrics: list | None = None,
        eval_metrics: list | None = None,
        use_tf_while_loop: bool = True,
        nan_guard: Any = None,
        gradient_accumulation_steps: int = 1,
        learning_rate: Any = None,
        loss_scale: Any = None,
        ema: Any = None,
        jit_compile: bool = False,
        record_history: bool = False,
    ):
        self.task = task
        self.record_history = record_history
        # Per-loop host state lives in a plain object: an attribute set on this tf.Module is
        # tracked (a dict or tuple is wrapped), which cost ~0.25 ms after every device loop.
        self._loop = _LoopRecord()
        self._history_keys: list[str] = []
        self._sync_in_loop = True  # the loop copies `lr` into the optimizer (ParameterServer: host)
        self.nan_guard = nan_guard
        self.accumulation = gradient_accumulation_steps
        self.learning_rate = learning_rate
        self.loss_scale = loss_scale
        self.ema = ema
        self.jit_compile = jit_compile
        self._replica_fn = None
        self.strategy = strategy
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.lr = lr
        self.global_step = global_step
        self.global_batch_size = global_batch_size
        self.train_metrics = list(train_metrics or [])
        self.eval_metrics = list(eval_metrics or [])
        self._use_tf_while_loop = use_tf_while_loop
        self._local_replicas = strategy.extended.worker_devices
        self._trainable_signature = None
        orbit.StandardTrainer.__init__(
            self,
            None,
            options=orbit.StandardTrainerOptions(use_tf_while_loop=use_tf_while_loop),
        )
        self._train_iter = train_iterator
        if eval_dataset is not None:
            TaskEvaluator.__init__(
                self,
                eval_dataset,
                options=orbit.StandardEvaluatorOptions(use_tf_while_loop=False),
            )

    # ---------------------------------------------------------------------------- training

    def train(self, num_steps: tf.Tensor) -> dict:
        """Runs `num_steps` train steps as one device loop; returns the last step's logs.

        Eager; the loop itself is one tf.function (Orbit's `create_train_loop_fn`).
        """
        self.train_loop_begin()
        fresh = self._train_loop_fn is None
        if fresh:
            self._train_loop_fn = self.create_train_loop_fn()
        out = self._train_loop_fn(self._train_iter, num_steps)
        if fresh:
            keras_compat.refresh_tracking(self.optimizer)
        loop = self._loop
        loop.last_step = int(out["step"])
        if "history" in out:
            rows = out.pop("history").numpy()
            first = loop.last_step - len(rows) + 1
            loop.history = (first, dict(zip(self._history_keys, rows.T, strict=True)))
        return self.train_loop_end(out)

    @property
    def last_step(self) -> int | None:
        """Returns the global step the last device loop ended at (None before the first). Eager
        host state, set after each loop and by a NaN rollback: reading it runs no op."""
        return self._loop.last_step

    @last_step.setter
    def last_step(self, step: int) -> None:
        self._loop.last_step = step

    def step_now(self) -> int:
        """Returns the global step: `last_step`, or (before the first loop) a read of the
        variable, an eager op of ~30-60 us. Eager."""
        step = self._loop.last_step
        return int(self.global_step.numpy()) if step is None else step

    @property
    def loop_history(self) -> tuple[int, dict]:
        """Returns `(first_step, {name: per-step values})` of the last device loop, when
        recorded (`record_history`). Eager host state (numpy arrays)."""
        return self._loop.history

    def _history_row(self, logs: dict) -> tf.Tensor:
        """The step's scalar logs as one float32 vector (traced); names in `_history_keys`."""
        self._history_keys = sorted(k for k, v in logs.items() if v.shape.rank == 0)
        return tf.stack([tf.cast(logs[k], tf.float32) for k in self._history_keys])

    def create_train_loop_fn(self):
        """A tf.function running `num_steps` steps and returning the last step's logs."""
        step = self.train_step
        guard = self.nan_guard
        replica_fn = self._replica_train_step if self.accumulation == 1 else self._replica_update
        # Made afresh with each loop function, so a retrace also retraces the compiled step.
        self._replica_fn = (
            tf.function(replica_fn, jit_compile=True) if self.jit_compile else replica_fn
        )

        record = self._history_row if self.record_history else None
        sync = self._sync_in_loop

        if not self._use_tf_while_loop:
            step_fn = tf.function(step)

            def python_loop(iterator, num_steps):
                if sync:
                    keras_compat.sync_learning_rate(self.optimizer, self.lr)
                logs = step_fn(iterator)
                rows = [record(logs)] if record else []
                for _ in range(int(num_steps) - 1):
                    if guard is not None and bool(guard.tripped()):
                        break
                    logs = step_fn(iterator)
                    rows += [record(logs)] if record else []
                return self._loop_output(logs, tf.stack(rows) if record else None)

            return python_loop

        def more(i, num_steps):
            # The loops use `while more(...)`, never `break`: for a loop with a `break`,
            # autograph tests a break flag in a `tf.cond` at every step (~1% of the MLP's loop).
            if guard is None:
                return i < num_steps
            return tf.logical_and(i < num_steps, tf.logical_not(guard.tripped()))

        @tf.function
        def loop(iterator, num_steps):
            if sync:
                keras_compat.sync_learning_rate(self.optimizer, self.lr)
            logs = step(iterator)
            i = tf.ones_like(num_steps)
            while more(i, num_steps):  # a tripped NaN guard hands over to the host
                logs = step(iterator)
                i += 1
            return self._loop_output(logs)

        @tf.function
        def recording_loop(iterator, num_steps):
            if sync:
                keras_compat.sync_learning_rate(self.optimizer, self.lr)
            logs = step(iterator)
            history = tf.TensorArray(tf.float32, size=0, dynamic_size=True)
            history = history.write(0, record(logs))
            i = tf.ones_like(num_steps)
            while more(i, num_steps):
                logs = step(iterator)
                history = history.write(i, record(logs))
                i += 1
            return self._loop_output(logs, history.stack())

        return recording_loop if record else loop

    def _loop_output(self, logs: dict, history: tf.Tensor | None = None) -> dict:
        """What a device loop returns (traced): the last step's logs, the metric results, the
        learning rate and step at its end, and the per-step history when recorded, so that the
        host reads them all in one go."""
        out = {
            "logs": logs,
            "metrics": {m.name: m.result() for m in self.train_metrics},
            "learning_rate": self.lr.read_value(),
            "step": self.global_step.read_value(),
        }
        if history is not None:
            out["history"] = history
        return out

    def train_loop_begin(self):
        """Eager, before each device loop: lr into the optimizer, metrics reset, retrace check.

        Returns None.
        """
        if not self._sync_in_loop:
            keras_compat.sync_learning_rate(self.optimizer, self.lr)
        for metric in self.train_metrics:
            metric.reset_state()
        signature = _trainable_signature(self.model)
        if signature != self._trainable_signature:
            # A callback froze or unfroze layers: retrace so the step trains the new set.
            self._trainable_signature = signature
            self._train_loop_fn = None

    def train_step(self, iterator):
        """One distributed step = one optimizer update (cross-replica context, traced).

        Returns the step's logs, averaged over replicas.
        """
        batch = self._next_replica_batches(iterator)
        if self.learning_rate is not None:
            self.learning_rate.step_update(self.global_step, self.optimizer)
        if self.nan_guard is not None or self.loss_scale is not None:
            return self._guarded_train_step(batch)
        return self._finish_step(self.strategy.run(self._replica_fn, args=(batch,)))

    def _finish_step(self, per_replica_logs, extra=None):
        """Cross-replica, traced: logs averaged over replicas, EMA moved, step counted."""
        logs = {
            k: self.strategy.reduce(tf.distribute.ReduceOp.MEAN, v, axis=None)
            for k, v in per_replica_logs.items()
        }
        logs.update(extra or {})
        if self.ema is not None:
            self.ema.update()
        # After the step's logs, which need its batch: a dataset that ends mid-loop leaves the
        # step counting the steps taken (tf.function orders ops on one resource only).
        with tf.control_dependencies(tf.nest.flatten(logs)):
            self.global_step.assign_add(1)
        return logs

    def _step_arguments(self, batch) -> tuple[tuple, dict]:
        """The arguments `train_step` and `compute_update` share (traced)."""
        args = (batch, self.model, self.optimizer, self.train_metrics)
        return args, {"loss_fn": self.loss_fn, "lr": self.lr}

    def _compute_update(self, batch):
        args, kwargs = self._step_arguments(batch)
        return self.task.compute_update(
            *args,
            **kwargs,
            global_batch_size=self.global_batch_size * self.accumulation,
            micro_batches=self.accumulation,
            loss_scale=None if self.loss_scale is None else self.loss_scale.scale,
        )

    def _replica_update(self, batch):
        update, variables, logs = self._compute_update(batch)
        keras_compat.apply_gradients(self.optimizer, update, variables)
        return logs

    def _guarded_train_step(self, batch):
        """Computes the update on every replica, applies it only if every loss is finite
        (NaN guard) and, with float16 loss scaling, the all-reduced gradient too.

        The condition lives in cross-replica context: a `tf.cond` around `apply_gradients`
        inside `strategy.run` would cross a synchronisation point, which tf.distribute forbids.
        """
        held = {}

        def compute(batch):
            update, variables, logs = self._compute_update(batch)
            held["pairs"] = [
                (i, v)
                for i, (g, v) in enumerate(zip(update, variables, strict=True))
                if g is not None
            ]
            logs = dict(logs)
            logs["nonfinite"] = tf.cast(
                tf.logical_not(tf.reduce_all(tf.math.is_finite(logs["loss"]))), tf.float32
            )
            if "nonfinite_gradients" not in logs:
                logs["nonfinite_gradients"] = tf.constant(0.0)
            return [update[i] for i, _ in held["pairs"]], logs

        update, logs = self.strategy.run(compute, args=(batch,))
        sum_ = tf.distribute.ReduceOp.SUM
        bad_loss = self.strategy.reduce(sum_, logs.pop("nonfinite"), axis=None) > 0
        overflow = self.strategy.reduce(sum_, logs.pop("nonfinite_gradients"), axis=None) > 0
        bad = tf.logical_or(bad_loss, overflow) if self.loss_scale is not None else bad_loss

        def apply():
            def replica_apply(gradients):
                variables = [v for _, v in held["pairs"]]
                keras_compat.apply_gradients(self.optimizer, gradients, variables)

            self.strategy.run(replica_apply, args=(update,))
            return tf.constant(False)

        tf.cond(bad, lambda: tf.constant(True), apply)
        extra = {}
        if self.nan_guard is not None:
            self.nan_guard.record(bad_loss)
            extra["nonfinite_steps"] = tf.cast(self.nan_guard.skipped, tf.float32)
        if self.loss_scale is not None:
            self.loss_scale.update(overflow)
            extra["loss_scale"] = tf.identity(self.loss_scale.scale)
        return self._finish_step(logs, extra)

    def _replica_train_step(self, batch):
        args, kwargs = self._step_arguments(batch)
        return self.task.train_step(*args, **kwargs, global_batch_size=self.global_batch_size)

    def _next_replica_batches(self, iterator):
        """Takes the elements of one step from the plain iterator and hands them to replicas.

        One element per replica (replica r gets the r-th); with gradient accumulation K,
        K rounds of that, and replica r gets the tuple of its K micro-batches. Multi-worker: every
        worker reads the same stream, takes all replicas' elements and keeps its own.
        """
        count = self.strategy.num_replicas_in_sync
        rounds = [[next(iterator) for _ in range(count)] for _ in range(self.accumulation)]
        if count == 1:
            return rounds[0][0] if self.accumulation == 1 else tuple(r[0] for r in rounds)

        def for_replica(ctx):
            replica = ctx.replica_id_in_sync_group
            if self.accumulation == 1:
                return rounds[0][replica]
            return tuple(r[replica] for r in rounds)

        return self.strategy.experimental_distribute_values_from_function(for_replica)

    def train_loop_end(self, loop_output=None) -> dict:
        """Eager: returns the last step's logs, train metrics and learning rate, as floats.

        `loop_output` is what the loop function returned (`_loop_output`).
        """
        loop_output = loop_output or {}
        logs = {**loop_output.get("logs", {}), **loop_output.get("metrics", {})}
        out = {k: to_python(v) for k, v in logs.items()}
        lr = loop_output.get("learning_rate")
        out["learning_rate"] = float(self.lr.numpy() if lr is None else lr)
        return out


class _LoopRecord:
    """What the host knows about the last device loop (see `TaskTrainer.last_step`)."""

    def __init__(self):
        self.last_step: int | None = None
        self.history: tuple[int, dict] = (0, {})


def _trainable_signature(model: Any) -> tuple:
    models = model.values() if isinstance(model, dict) else [model]
    return tuple(id(v) for m in models for v in getattr(m, "trainable_variables", []))
