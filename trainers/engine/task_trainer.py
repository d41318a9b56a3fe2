"""`TaskTrainer`: the Orbit trainer and evaluator that run a Task's steps under `strategy.run`.

Hook order, as the Controller drives it::

    train(num_steps):                           # one device loop, num_steps from steps_per_loop
      train_loop_begin()                        # eager: replicas' seeds; retrace every
                                                #   step fn if the trainable vars changed
      learning_rate.sync(optimizer)             # traced, first in the loop function: `lr`
                                                #   into the optimizer when it owns the rate
      repeat num_steps times (tf.while_loop in one tf.function; the step's only trace in it,
                              so loops of any length run the same ops):
        logs = step(train_iterator)             # steps.TrainStep: batches to replicas,
                                                #   strategy.run, replica mean, global_step += 1
        (and, for deferred callbacks, append the step's scalar logs to a TensorArray,
         whose last row gives the loop's last float32 scalar logs back)
      return train_loop_end(last logs, metric results, lr, step)   # read in one go
    # then the Controller's schedule: host callbacks (every_steps / at_step), the metrics'
    # window (restarts the train metrics), progress, checkpoint

    evaluate(num_steps or -1): see `trainers.engine.evaluation.TaskEvaluator`
"""

from __future__ import annotations

import functools
from typing import Any

import orbit
import tensorflow as tf

from orbitask.common import keras_compat
from orbitask.tasks import eval_logs
from orbitask.trainers.engine import steps
from orbitask.trainers.engine.evaluation import TaskEvaluator
from orbitask.trainers.engine.step_errors import refuse_hidden_logs
from orbitask.trainers.state import random_state


def step_now(trainer: Any, global_step: tf.Variable) -> int:
    """Returns the global step: the step `trainer`'s last device loop ended at (its
    `last_step`, host state that a NaN rollback keeps current), else (no trainer, another kind
    of trainer, or before the first loop) a read of `global_step` (an eager op). Eager."""
    step = getattr(trainer, "last_step", None)
    return int(global_step.numpy()) if step is None else step


class TaskTrainer(orbit.StandardTrainer, TaskEvaluator):
    """Runs a `tasks.Task`'s train step (a `steps.TrainStep`) and validation step on a strategy.

    Args:
      objects: the run's objects (`steps.RunObjects`); a tripped `nan_guard` of theirs ends the
        device loop early, and evaluation swaps their `ema`'s weights in.
      step: the composed train step (`steps.TrainStep`).
      train_iterator: a plain `tf.data` iterator yielding one per-replica batch per `next`; each
        step takes one batch per local replica, so it can be checkpointed (exact resume).
      eval_dataset: a distributed dataset for `validation_step`, a dict `{name: dataset}` of
        validation sets (each evaluated in turn, `TaskEvaluator.evaluate`), or None.
      use_tf_while_loop: run each device loop as one `tf.while_loop` (default) or a Python loop.
      record_history: keep every step's scalar logs (metrics and learning rate included) of the
        last device loop in `loop_history` (for `tasks.deferred` callbacks).
    """

    # The loop function copies `lr` into the optimizer first; a subclass whose loops run where
    # that copy cannot happen once per loop (ParameterServerTrainer) copies it on the host.
    copies_learning_rate_in_loop = True

    def __init__(
        self,
        *,
        objects: Any,
        step: Any,
        train_iterator: Any = None,
        eval_dataset: Any = None,
        use_tf_while_loop: bool = True,
        record_history: bool = False,
    ):
        self.objects = objects
        self.task = objects.task
        self.strategy = objects.strategy
        self.model = objects.model
        self.optimizer = objects.optimizer
        self.loss_fn = objects.loss_fn
        self.lr = objects.lr
        self.global_step = objects.global_step
        self.global_batch_size = objects.global_batch_size
        self.train_metrics = list(objects.train_metrics)
        self.eval_metrics = list(objects.eval_metrics)
        self.step = step
        self.nan_guard = objects.nan_guard
        self.ema = objects.ema
        self.record_history = record_history
        # Per-loop host state lives in a plain object: an attribute set on this tf.Module is
        # tracked (a dict or tuple is wrapped), which slows every device loop's host work.
        self._loop = _LoopRecord()
        self._history_keys: list[str] = []
        self._use_tf_while_loop = use_tf_while_loop
        self.mark_loops = False  # set by `trainers.actions.profiling.Profiler` while it traces
        self.kept = None  # a `kept_step.KeptStep` when a callback asks for a step's tensors
        self._trainable_signature = None
        roots = {"task": self.task, "model": self.model, "loss": self.loss_fn}
        self.replica_draws = random_state.ReplicaDraws(roots, self.strategy)
        orbit.StandardTrainer.__init__(
            self,
            None,
            options=orbit.StandardTrainerOptions(use_tf_while_loop=use_tf_while_loop),
        )
        # `train` is this class's own: its loop function and iterator are its own attributes,
        # not the ones Orbit's `StandardTrainer.train` keeps.
        self._loop_fn = None
        self._iterator = train_iterator
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
        self.phase = "step"
        self.train_loop_begin()
        fresh = self._loop_fn is None
        if fresh:
            self._loop_fn = self.create_train_loop_fn()
            if hasattr(self._loop_fn, "get_concrete_function"):  # traced now, run below
                self._loop_fn.get_concrete_function(self._iterator, num_steps)
                refuse_hidden_logs(self.task, self._loop.log_names, self.train_metrics)
        run, start = self._loop_fn, step_now(self, self.global_step)
        if self.kept is not None and self.kept.due(start + int(num_steps)):
            run = functools.partial(self.kept.run, self._loop_fn)  # the last step's tensors
        if self.mark_loops:  # while profiling: each loop a "train" step in TensorBoard
            with tf.profiler.experimental.Trace("train", step_num=start, _r=1):
                out = run(self._iterator, num_steps)
        else:
            out = run(self._iterator, num_steps)
        if fresh:
            keras_compat.refresh_tracking(self.optimizer)
        loop = self._loop
        loop.last_step = int(out["step"])
        if "history" in out:
            rows = out.pop("history").numpy()
            first = loop.last_step - len(rows) + 1
            loop.history = (first, dict(zip(self._history_keys, rows.T, strict=True)))
        return self.train_loop_end(out)

    def set_train_iterator(self, iterator: Any) -> None:
        """Makes the next device loops read `iterator` (an input rebuilt at its position). Eager;
        returns None."""
        self._iterator = iterator

    @property
    def last_step(self) -> int | None:
        """Returns the global step the last device loop ended at (None before the first). Eager
        host state, set after each loop and by a NaN rollback: reading it runs no op."""
        return self._loop.last_step

    @last_step.setter
    def last_step(self, step: int) -> None:
        self._loop.last_step = step

    @property
    def loop_history(self) -> tuple[int, dict]:
        """Returns `(first_step, {name: per-step values})` of the last device loop, when
        recorded (`record_history`). Eager host state (numpy arrays)."""
        return self._loop.history

    def _history_row(self, logs: dict) -> tf.Tensor:
        """The step's scalar logs, the train metrics' results so far in their window and the
        learning rate, as one float32 vector (traced); names in `_history_keys`. The names are
        those of the logs at a loop's end (`train_loop_end`)."""
        scalars = {**logs, **{m.name: m.result() for m in self.train_metrics}}
        scalars = {k: tf.convert_to_tensor(v) for k, v in scalars.items()}
        scalars["learning_rate"] = self.lr.read_value()
        self._history_keys = sorted(k for k, v in scalars.items() if v.shape.rank == 0)
        return tf.stack([tf.cast(scalars[k], tf.float32) for k in self._history_keys])

    def _not_in_rows(self, logs: dict) -> dict:
        """The logs a history row does not hold exactly (not float32 scalars, or named like a
        train metric or `learning_rate`, whose values the row holds under that name)."""
        taken = {m.name for m in self.train_metrics} | {"learning_rate"}
        return {
            k: v for k, v in logs.items()
            if k in taken or v.dtype != tf.float32 or v.shape.rank != 0
        }  # fmt: skip

    def create_train_loop_fn(self):
        """A tf.function running `num_steps` steps and returning the last step's logs."""
        self.step.reset()  # a new loop function retraces the step, compiled parts included
        if not self._use_tf_while_loop:
            return self._python_loop_fn()
        step, guard = self.train_step, self.nan_guard
        record = self._history_row if self.record_history else None

        def more(i, num_steps):
            # The loops use `while more(...)`, never `break`: for a loop with a `break`,
            # autograph tests a break flag in a `tf.cond` at every step (~1% of the MLP's loop).
            if guard is None:
                return i < num_steps
            return tf.logical_and(i < num_steps, tf.logical_not(guard.tripped()))

        @tf.function
        def loop(iterator, num_steps):
            self._rate_into_optimizer()
            traced, logs, invariants = steps.traced_once(step, iterator, self._loop)
            i = tf.zeros_like(num_steps)
            while more(i, num_steps):  # a tripped NaN guard hands over to the host
                tf.autograph.experimental.set_loop_options(shape_invariants=invariants)
                logs = traced(iterator)
                i += 1
            return self._loop_output(logs)

        @tf.function
        def recording_loop(iterator, num_steps):
            self._rate_into_optimizer()
            traced, logs, invariants = steps.traced_once(step, iterator, self._loop)
            # The rows hold the float32 scalar logs, so the loop carries only the others: a
            # log carried as well as recorded costs about 2% of the MLP's step (RESULTS.md).
            before, carried = record(logs), self._not_in_rows(logs)
            history = tf.TensorArray(tf.float32, size=0, dynamic_size=True)
            i = tf.zeros_like(num_steps)
            while more(i, num_steps):
                tf.autograph.experimental.set_loop_options(shape_invariants=invariants)
                step_logs = traced(iterator)
                history = history.write(i, record(step_logs))
                carried = {k: step_logs[k] for k in carried}
                i += 1
            rows = history.stack()
            last = tf.concat([before[tf.newaxis], rows], 0)[i]  # `before` after no step
            keys = self._history_keys
            logs = {k: carried[k] if k in carried else last[keys.index(k)] for k in logs}
            return self._loop_output(logs, rows)

        return recording_loop if record else loop

    def _python_loop_fn(self):
        """The device loop as a Python loop over the traced step (`use_tf_while_loop=False`)."""
        step_fn, guard = tf.function(self.train_step), self.nan_guard
        record = self._history_row if self.record_history else None

        def python_loop(iterator, num_steps):
            self._rate_into_optimizer()
            logs = step_fn(iterator)
            rows = [record(logs)] if record else []
            for _ in range(int(num_steps) - 1):
                if guard is not None and bool(guard.tripped()):
                    break
                logs = step_fn(iterator)
                rows += [record(logs)] if record else []
            return self._loop_output(logs, tf.stack(rows) if record else None)

        return python_loop

    def _rate_into_optimizer(self, in_loop: bool = True) -> None:
        """`lr` into the optimizer: first in each loop function (traced, `in_loop`) where the
        loop copies it (`copies_learning_rate_in_loop`), else before each loop (eager). The
        loop functions, the kept step and `train_loop_begin` all call it."""
        if in_loop == self.copies_learning_rate_in_loop:
            self.objects.learning_rate.sync(self.optimizer)

    def _loop_output(self, logs: dict, history: tf.Tensor | None = None) -> dict:
        """What a device loop returns (traced): the last step's logs, the metric results, the
        learning rate and step at its end, and the per-step history when recorded, so that the
        host reads them all in one go."""
        self._loop.log_names = sorted(logs)
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
        """Eager, before each device loop: lr into the optimizer (where the loop does not copy
        it), each replica's own seeds, retrace check. Returns None. (The train metrics restart
        in the schedule's `metrics_window` entry: `run.entries.metrics_window_entry`.)
        """
        self._rate_into_optimizer(in_loop=False)
        self.replica_draws()
        signature = _trainable_signature(self.model)
        if signature != self._trainable_signature:
            # A callback froze or unfroze layers: every traced function is traced anew, so the
            # step trains the new set (and a frozen BatchNorm runs as Keras runs it frozen).
            self._trainable_signature = signature
            self.retrace()

    def retrace(self) -> None:
        """Drops every traced function of this trainer (the loop function, the kept step, the
        evaluation's), so each is traced again when next used. Eager; returns None."""
        self._loop_fn = None
        if self.kept is not None:
            self.kept.reset()
        self._eval_device_fns = self._eval_gather_fns = None

    def train_step(self, iterator):
        """One distributed step = one optimizer update (cross-replica context, traced).

        Returns the step's logs, averaged over replicas (`steps.TrainStep`).
        """
        return self.step(iterator)

    def train_loop_end(self, loop_output=None) -> dict:
        """Eager: returns the last step's logs, train metrics and learning rate, as floats.

        `loop_output` is what the loop function returned (`_loop_output`).
        """
        loop_output = loop_output or {}
        logs = {**loop_output.get("logs", {}), **loop_output.get("metrics", {})}
        out = {k: eval_logs.to_python(v) for k, v in logs.items()}
        lr = loop_output.get("learning_rate")
        out["learning_rate"] = float(self.lr.numpy() if lr is None else lr)
        self.phase = None  # the device loop is over
        return out


class _LoopRecord:
    """What the host knows about the last device loop (see `TaskTrainer.last_step`)."""

    def __init__(self):
        self.last_step: int | None = None
        self.history: tuple[int, dict] = (0, {})
        self.named_draws = False  # the step's unsaved random ops were named (first trace)
        self.log_names: list[str] = []  # the step's log keys, as traced


def _trainable_signature(model: Any) -> tuple:
    models = model.values() if isinstance(model, dict) else [model]
    return tuple(id(v) for m in models for v in getattr(m, "trainable_variables", []))
