"""The distributed train step, composed of small parts chosen once, when the trainer is built.

    step(iterator):                              # cross-replica context, traced
      batch = ReplicaBatches(iterator)           # one element per local replica (x K micro-steps)
      learning_rate.step_update(step, optimizer) # only with a learning-rate schedule
      logs = body(batch)                         # PlainBody | GuardedBody
      return Finish(logs)                        # replica mean of logs, EMA, step += 1

`ReplicaBatches` (`trainers.engine.replica_batches`) hands this worker's elements to its replicas.
`PlainBody` runs a replica function on every replica: the task's `train_step`, or (gradient
accumulation) the task's `compute_update` over K micro-batches followed by `apply_gradients`.
`GuardedBody` computes the update on every replica and applies it only when every loss and the
all-reduced gradient (before the task's `update_pre` fixes it) are finite: NaN guard, float16 loss
scaling. `traced_once` traces the step once for the device loop, which calls that trace at
every step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from absl import logging

from orbitask.common import keras_compat
from orbitask.tasks import replica_logs, step_signature
from orbitask.trainers.engine.replica_batches import ReplicaBatches
from orbitask.trainers.state import random_state


@dataclasses.dataclass(frozen=True)
class RunObjects:
    """The run's objects: the task's built objects and the training state around them, the one
    record the builders return and the step, the trainer and the checks before step 1 read.

    Attributes:
      task: the Task.
      strategy: the run's strategy.
      model: the task's model (or dict of models).
      optimizer: the task's optimizer (or dict of optimizers).
      loss_fn: the loss the steps call (the task's, or `loss_share.for_steps`'s wrapper of it);
        None when no step of the run calls it.
      learning_rate: the run's learning rate (`trainers.features.learning_rate.LearningRate`:
        its variable `lr`, schedule, factor and owner).
      global_step: the run's step variable.
      global_batch_size: the examples of one step, over all replicas.
      train_metrics: the training metrics; empty when the run does not train.
      eval_metrics: the validation metrics; empty when the run does not evaluate.
      nan_guard: the NaN guard of a training run (built), else None.
      loss_scale: the dynamic loss scale of a mixed_float16 training run, else None.
      ema: the run's weight averaging (built with the checkpoint), else None.
    """

    task: Any
    strategy: tf.distribute.Strategy
    model: Any
    optimizer: Any
    loss_fn: Any
    learning_rate: Any
    global_step: tf.Variable
    global_batch_size: int
    train_metrics: list = dataclasses.field(default_factory=list)
    eval_metrics: list = dataclasses.field(default_factory=list)
    nan_guard: Any = None
    loss_scale: Any = None
    ema: Any = None

    @property
    def lr(self) -> tf.Variable:
        """The learning-rate variable the stages get as `lr`."""
        return self.learning_rate.lr


class ReplicaUpdate:
    """The update one replica computes (the task's `compute_update`), and how it is applied.

    `check_finite`: the logs carry `nonfinite_gradients` (`Task.compute_update`), as they do
    with a loss scale.
    """

    def __init__(
        self,
        objects: RunObjects,
        accumulation: int,
        loss_scale: Any = None,
        check_finite: bool = False,
    ):
        self.objects = objects
        self.accumulation = accumulation
        self.loss_scale = loss_scale
        self.check_finite = check_finite

    def compute(self, batch) -> tuple[list, list, dict]:
        """Traced, in replica context: returns `(update, variables, logs)`."""
        o = self.objects
        return o.task.compute_update(
            batch,
            o.model,
            o.optimizer,
            o.train_metrics,
            loss_fn=o.loss_fn,
            lr=o.lr,
            global_batch_size=o.global_batch_size * self.accumulation,
            micro_batches=self.accumulation,
            loss_scale=None if self.loss_scale is None else self.loss_scale.scale,
            # Only the NaN guard asks: a task's own compute_update without it runs elsewhere.
            **({"check_finite": True} if self.check_finite else {}),
        )

    def compute_and_apply(self, batch) -> dict:
        """Traced, in replica context: computes the update, applies it; returns the logs."""
        update, variables, logs = self.compute(batch)
        keras_compat.apply_gradients(self.objects.optimizer, update, variables)
        return logs


def task_train_step(objects: RunObjects) -> Callable:
    """The replica function running the task's `train_step` (traced, replica context)."""

    def replica_step(batch):
        o = objects
        return step_signature.train_step(
            o.task,
            batch,
            o.model,
            o.optimizer,
            o.train_metrics,
            loss_fn=o.loss_fn,
            lr=o.lr,
            global_batch_size=o.global_batch_size,
        )

    return replica_step


class PlainBody:
    """Runs `replica_fn` on every replica (optionally XLA-compiled); returns per-replica logs."""

    def __init__(self, strategy: tf.distribute.Strategy, replica_fn: Callable, jit_compile=False):
        self.strategy = strategy
        self.replica_fn = replica_fn
        self.jit_compile = jit_compile
        self.compiled = None

    def reset(self) -> None:
        """Eager: a new loop function retraces, and with it the compiled replica function."""
        fn = self.replica_fn
        self.compiled = tf.function(fn, jit_compile=True) if self.jit_compile else fn

    def __call__(self, batch) -> tuple[Any, dict]:
        """Traced, cross-replica: returns `(per-replica logs, extra logs)`."""
        if self.compiled is None:
            self.reset()
        return self.strategy.run(self.compiled, args=(batch,)), {}


class GuardedBody:
    """Computes the update on every replica; applies it only if every loss and every entry of
    the all-reduced gradient, as computed before `update_pre` zeroes non-finite entries, are
    finite. The check comes before any variable changes.

    The NaN guard counts a step as bad for a non-finite loss or gradient, or (`spike_factor`) a
    loss above that factor times its recent average; with float16 loss scaling a non-finite
    gradient is an overflow, which lowers the scale and is not counted.
    The condition lives in cross-replica context: a `tf.cond` around `apply_gradients` inside
    `strategy.run` would cross a synchronisation point, which tf.distribute forbids.
    """

    def __init__(self, strategy, update: ReplicaUpdate, nan_guard=None, loss_scale=None):
        self.strategy = strategy
        self.update = update
        self.nan_guard = nan_guard
        self.loss_scale = loss_scale

    def reset(self) -> None:
        """Eager: nothing to rebuild."""

    def __call__(self, batch) -> tuple[Any, dict]:
        """Traced, cross-replica: returns `(per-replica logs, extra logs)`."""
        held = {}

        def compute(batch):
            update, variables, logs = self.update.compute(batch)
            pairs = enumerate(zip(update, variables, strict=True))
            held["pairs"] = [(i, v) for i, (g, v) in pairs if g is not None]
            logs = dict(logs)
            loss = logs[self.update.objects.task.loss]
            logs["nonfinite"] = tf.cast(
                tf.logical_not(tf.reduce_all(tf.math.is_finite(loss))), tf.float32
            )
            logs.setdefault("nonfinite_gradients", tf.constant(0.0))
            return [update[i] for i, _ in held["pairs"]], logs

        update, logs = self.strategy.run(compute, args=(batch,))
        total = tf.distribute.ReduceOp.SUM
        bad_loss = self.strategy.reduce(total, logs.pop("nonfinite"), axis=None) > 0
        overflow = self.strategy.reduce(total, logs.pop("nonfinite_gradients"), axis=None) > 0
        step_loss = None  # the step's loss (replica mean), for the guard's spike check
        if self.nan_guard is not None and self.nan_guard.spike_factor is not None:
            mean = tf.distribute.ReduceOp.MEAN
            step_loss = self.strategy.reduce(mean, logs[self.update.objects.task.loss], axis=None)
            bad_loss = tf.logical_or(bad_loss, self.nan_guard.is_spike(step_loss))
        bad = tf.logical_or(bad_loss, overflow)

        def apply():
            def replica_apply(gradients):
                variables = [v for _, v in held["pairs"]]
                keras_compat.apply_gradients(self.update.objects.optimizer, gradients, variables)

            self.strategy.run(replica_apply, args=(update,))
            return tf.constant(False)

        tf.cond(bad, lambda: tf.constant(True), apply)
        extra = {}
        if self.nan_guard is not None:
            self.nan_guard.record(bad_loss if self.loss_scale is not None else bad, step_loss)
            extra["nonfinite_steps"] = tf.cast(self.nan_guard.skipped, tf.float32)
        if self.loss_scale is not None:
            self.loss_scale.update(overflow)
            extra["loss_scale"] = tf.identity(self.loss_scale.scale)
        return logs, extra


class Finish:
    """Ends a step (traced, cross-replica): replica logs combined by the Task's rule
    (`tasks.replica_logs.convention`), EMA moved, step counted."""

    def __init__(
        self, strategy, global_step: tf.Variable, ema: Any = None, rule: str | dict = "mean"
    ):
        self.strategy = strategy
        self.global_step = global_step
        self.ema = ema
        self.rule = rule

    def __call__(self, per_replica_logs: dict, extra: dict) -> dict:
        ops = tf.distribute.ReduceOp
        logs = {}
        for k, v in per_replica_logs.items():
            total = replica_logs.summed(self.rule, k)
            logs[k] = self.strategy.reduce(ops.SUM if total else ops.MEAN, v, axis=None)
        logs.update(extra)
        if self.ema is not None:
            self.ema.update()
        # After the step's logs, which need its batch: a dataset that ends mid-loop leaves the
        # step counting the steps taken (tf.function orders ops on one resource only).
        with tf.control_dependencies(tf.nest.flatten(logs)):
            self.global_step.assign_add(1)
        return logs


class TrainStep:
    """One distributed step = one optimizer update, composed of the parts above.

    Args:
      objects: the run's objects; their `nan_guard` (None: the seed's behaviour), `loss_scale`
        (float16) and `ema` shape the step.
      accumulation: batches per optimizer update (K).
      jit_compile: compile the per-replica step with XLA (not a guarded step).
    """

    def __init__(self, objects: RunObjects, accumulation: int = 1, jit_compile: bool = False):
        strategy, nan_guard, loss_scale = objects.strategy, objects.nan_guard, objects.loss_scale
        self.objects = objects
        learning_rate = objects.learning_rate
        self.schedule = learning_rate if learning_rate.schedule is not None else None
        rule = replica_logs.convention(objects.task)
        warning = replica_logs.warning(objects.task, strategy.num_replicas_in_sync)
        if warning:
            logging.warning("%s", warning)
        per_replica = objects.global_batch_size // strategy.num_replicas_in_sync
        self.batches = ReplicaBatches(strategy, accumulation, per_replica)
        update = ReplicaUpdate(objects, accumulation, loss_scale, nan_guard is not None)
        if nan_guard is not None or loss_scale is not None:
            self.body = GuardedBody(strategy, update, nan_guard, loss_scale)
        elif accumulation > 1:
            self.body = PlainBody(strategy, update.compute_and_apply, jit_compile)
        else:
            self.body = PlainBody(strategy, task_train_step(objects), jit_compile)
        self.finish = Finish(strategy, objects.global_step, objects.ema, rule)

    def reset(self) -> None:
        """Eager, before a new loop function is traced."""
        self.body.reset()

    def __call__(self, iterator) -> dict:
        """Traced, cross-replica: runs one step on the next batches; returns its mean logs."""
        keras_compat.reset_trace_state(self.objects.optimizer)
        batch = self.batches(iterator)
        if self.schedule is not None:
            self.schedule.step_update(self.objects.global_step, self.objects.optimizer)
        return self.finish(*self.body(batch))


def traced_once(step: Any, iterator: Any, loop: Any) -> tuple[Any, Any, list]:
    """The step traced once, as a function the device loop calls at every step; zeros shaped like
    its logs, the loop's value before its first step; and the shape invariants of those whose
    shape a step leaves open. Traced, in the loop function; returns `(traced, logs, invariants)`.

    The loop's `tf.while_loop` calls that one trace at every step (a call costs no more per
    step than the step traced in place: benchmarks/RESULTS.md), so the step is not traced again
    and a loop of any length runs the same ops: a stateful random op of the step (a
    `tf.random.normal` in a stage) draws one sequence whatever the loop lengths. Such ops are
    named in one line (`random_state.unsaved_step_draws`), once per trainer
    (`loop.named_draws`, the trainer's record of its loops): a checkpoint cannot hold their state.
    """
    traced = tf.function(step).get_concrete_function(iterator)
    if not loop.named_draws:
        loop.named_draws = True
        draws = random_state.unsaved_step_draws(traced.graph)
        if draws:
            random_state.say_unsaved("the train step", draws, random_state.STEP_FIX)
    outputs = traced.structured_outputs
    logs, invariants = [], []
    for value in tf.nest.flatten(outputs):
        value = tf.convert_to_tensor(value)
        shape = value.shape
        zero = tf.zeros(
            [d or 0 for d in shape.as_list()] if shape.rank is not None else [], value.dtype
        )
        if not shape.is_fully_defined():
            invariants.append((zero, shape))
        logs.append(zero)
    return traced, tf.nest.pack_sequence_as(outputs, logs), invariants
