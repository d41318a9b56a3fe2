"""`TaskEvaluator`: the Orbit evaluator half of `TaskTrainer`, running a Task's validation step.

Hook order, as the Controller drives it::

    evaluate(num_steps or -1):                  # with the EMA weights swapped in, if any
      for each validation set: the one dataset, or each of a dict {name: dataset} in its
                               order, up to num_steps steps each; returns the set's logs,
                               or {name: logs} for a dict
        eval_begin()                            # reset eval metrics; a fresh state
        device loop (the default log reduction): one tf.function runs every step in a
          tf.while_loop, summing each log over replicas and steps on the device, until
          `num_steps` or the end of the dataset; the sums and the count of values are the
          state `tasks.eval_logs.aggregate` would have built
        gathered (a task's own aggregate_logs / reduce_aggregated_logs): device loops of up
          to 100 steps return each step's per-replica logs; on the host, step by step:
                   state = task.aggregate_logs(state, per-replica logs)   # eager
        per-step (parameter server, one dataset): each step its own tf.function call, then
          aggregate_logs
        eval_end(state) = task.reduce_aggregated_logs(state) + metric results
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import orbit
import tensorflow as tf

from orbitask.common import files
from orbitask.tasks import eval_logs, step_signature
from orbitask.tasks.base import Task
from orbitask.trainers import compat
from orbitask.trainers.distribution.cluster import all_replica_values
from orbitask.trainers.errors import ConfigError
from orbitask.trainers.state import checkpoint_files

ALL_STEPS = 2**31 - 1  # a device loop's bound when evaluating to the end of the dataset
GATHER_STEPS = 100  # steps per device loop whose logs a task's own aggregate_logs folds in


class TaskEvaluator(orbit.StandardEvaluator):
    """Evaluates a `tasks.Task` (a mixin of `TaskTrainer`, which sets its attributes).

    Uses `task`, `strategy`, `model`, `loss_fn`, `lr`, `global_step`, `eval_metrics` and `ema`
    (None or a `trainers.ExponentialMovingAverage`).
    """

    device_eval_loop = True  # False: every evaluation step is its own call (parameter server)
    phase: str | None = None  # "step" while a device loop runs, "evaluation" from one on

    def evaluate(self, num_steps: tf.Tensor):
        """Eager: one evaluation, with the averaged weights swapped in when EMA is on.

        Returns the eval logs (`eval_end`'s); for validation sets (`eval_dataset` a dict
        `{name: dataset}`), `{name: logs}`, each set evaluated for up to `num_steps` steps with
        its metrics and aggregation state started afresh (the Controller writes each set's
        summaries under `eval/<name>/`).
        """
        self.phase = "evaluation"  # until the next device loop: the eval actions follow
        with self.ema.averaged() if self.ema is not None else contextlib.nullcontext():
            sets = self.eval_dataset
            if not isinstance(sets, dict):
                return self._evaluate(num_steps, sets)
            return {name: self._evaluate(num_steps, data, name) for name, data in sets.items()}

    def reduces_on_device(self) -> bool:
        """Returns whether the logs are summed on the device: True when the task keeps the
        default log reduction (`tasks.eval_logs`); else its `aggregate_logs` gets them on the
        host. Eager."""
        task = type(self.task)
        return (
            task.aggregate_logs is Task.aggregate_logs
            and task.reduce_aggregated_logs is Task.reduce_aggregated_logs
        )

    def _evaluate(self, num_steps, dataset, name: str | None = None):
        """One evaluation of `dataset` (the validation set `name`, or None for the one);
        returns its logs. Eager."""
        if not self.device_eval_loop:  # parameter_server: one dataset, `eval_dataset`
            return super().evaluate(num_steps)
        if not self.reduces_on_device():
            return self._evaluate_gathered(num_steps, dataset, name)
        self.eval_begin()
        iterator = iter(dataset)
        if getattr(self, "_eval_device_fns", None) is None:
            self._eval_device_fns = (tf.function(self._first_sums), tf.function(self._sums_loop))
        first, loop = self._eval_device_fns
        limit = ALL_STEPS if int(num_steps) < 0 else int(num_steps)
        if limit == 0:
            return self.eval_end({})
        try:
            sums = first(iterator)
        except (tf.errors.OutOfRangeError, StopIteration) as e:
            raise empty_validation_error(self.task, name) from e
        sums, steps = loop(iterator, sums, tf.constant(limit - 1))
        state = {key: value.numpy() for key, value in sums.items()}
        state[eval_logs.VALUES] = int(steps.numpy() + 1) * self.strategy.num_replicas_in_sync
        return self.eval_end(state)

    def _evaluate_gathered(self, num_steps, dataset, name: str | None):
        """A task's own log reduction: device loops of up to `GATHER_STEPS` steps return every
        step's per-replica logs, which are folded in by `eval_reduce` on the host, step by step."""
        state = self.eval_begin()
        iterator = iter(dataset)
        if getattr(self, "_eval_gather_fns", None) is None:
            self._eval_gather_fns = (tf.function(self.eval_step), tf.function(self._gather_loop))
        first, loop = self._eval_gather_fns
        remaining = ALL_STEPS if int(num_steps) < 0 else int(num_steps)
        evaluated = False
        while remaining > 0:
            try:
                outputs = first(iterator)
            except (tf.errors.OutOfRangeError, StopIteration) as e:
                if not evaluated:
                    raise empty_validation_error(self.task, name) from e
                break
            evaluated = True
            leaves = [tf.convert_to_tensor(v) for v in tf.nest.flatten(outputs)]
            chunk = min(GATHER_STEPS, remaining)
            steps, gathered, shapes = loop(iterator, leaves, tf.constant(chunk - 1))
            steps = int(steps) + 1
            for step_leaves in _per_step(gathered, shapes, steps):
                state = self.eval_reduce(state, tf.nest.pack_sequence_as(outputs, step_leaves))
            remaining -= steps
            if steps < chunk:
                break
        return self.eval_end(state)

    def _gather_loop(self, iterator, first: list, limit: tf.Tensor):
        """Up to `limit` more steps after the one that gave `first` (its flat logs), to the end
        of the dataset; returns the steps taken and, for each leaf, every step's values
        flattened and concatenated, with each step's shape, so that shapes may vary from step
        to step (e.g. sequences padded per batch) (traced)."""
        arrays = [_array(v.dtype).write(0, tf.reshape(v, [-1])) for v in first]
        shapes = [_array(tf.int32).write(0, tf.shape(v)) for v in first]
        steps = tf.constant(0)
        for _ in tf.range(limit):
            batch = iterator.get_next_as_optional()
            if not batch.has_value():
                break
            logs = self.strategy.run(self._replica_eval_step, args=(batch.get_value(),))
            values = tf.nest.flatten(
                tf.nest.map_structure(lambda v: all_replica_values(self.strategy, v), logs)
            )
            pairs = zip(arrays, shapes, values, strict=True)
            written = [(a.write(steps + 1, tf.reshape(v, [-1])), s.write(steps + 1, tf.shape(v)))
                       for a, s, v in pairs]  # fmt: skip
            arrays, shapes = [a for a, _ in written], [s for _, s in written]
            steps += 1
        return steps, [a.concat() for a in arrays], [s.stack() for s in shapes]

    def _step_sums(self, batch) -> dict:
        """One step's logs summed over replicas, as float64 (traced, cross-replica)."""
        logs = self.strategy.run(self._replica_eval_step, args=(batch,))
        total = tf.distribute.ReduceOp.SUM
        return {
            key: tf.cast(self.strategy.reduce(total, value, axis=None), tf.float64)
            for key, value in logs.items()
        }

    def _first_sums(self, iterator) -> dict:
        """The first step's sums (traced); raises OutOfRangeError on an empty dataset."""
        return self._step_sums(next(iterator))

    def _sums_loop(self, iterator, sums: dict, limit: tf.Tensor):
        """Up to `limit` more steps in one tf.while_loop, to the end of the dataset; returns the
        running sums and the steps taken (traced)."""
        steps = tf.constant(0)
        for _ in tf.range(limit):
            batch = iterator.get_next_as_optional()
            if not batch.has_value():
                break
            step = self._step_sums(batch.get_value())
            sums = {key: sums[key] + step[key] for key in sums}
            steps += 1
        return sums, steps

    def eval_begin(self):
        """Eager: resets eval metrics, gives each replica its own seeds; returns the empty
        aggregation state."""
        for metric in self.eval_metrics:
            metric.reset_state()
        self.replica_draws()
        return {}

    def eval_step(self, iterator):
        """One distributed validation step; returns per-replica logs as tuples (traced)."""
        batch = next(iterator)
        logs = self.strategy.run(self._replica_eval_step, args=(batch,))
        return tf.nest.map_structure(lambda v: all_replica_values(self.strategy, v), logs)

    def _replica_eval_step(self, batch):
        return step_signature.validation_step(
            self.task, batch, self.model, self.eval_metrics, loss_fn=self.loss_fn, lr=self.lr
        )

    def eval_reduce(self, state=None, step_outputs=None):
        """Eager: returns the state with one step folded in by the task's `aggregate_logs`."""
        return self.task.aggregate_logs(state, step_outputs)

    def eval_end(self, state=None) -> dict:
        """Eager: returns the task's reduced logs plus Keras metric results."""
        step = int(self.global_step.numpy())
        logs = dict(self.task.reduce_aggregated_logs(state, global_step=step) or {})
        for metric in self.eval_metrics:
            logs[metric.name] = eval_logs.to_python(metric.result())
        return logs


def empty_validation_error(task: Any, name: str | None = None) -> ConfigError:
    """Returns the error for a validation input (the validation set `name`, or None for the
    one) without a single batch, whose metrics would read 0. Eager."""
    which = "" if name is None else f"'s validation set {name!r}"
    return ConfigError(
        f"{type(task).__name__}.build_inputs(training=False){which} yields no batches, so there "
        "is nothing to evaluate; give the validation input at least one batch (a batch with "
        "drop_remainder=True needs global_batch_size / replicas examples), or use --mode=train."
    )


def flat_set_logs(logs: dict, names: Any) -> dict:
    """Returns `logs` of an evaluation with the logs of each validation set in `names` (a
    `{name: logs}` entry) as `<name>/<key>` entries; other entries (e.g. Orbit's
    `steps_per_second`) as they are. Eager."""
    flat = {}
    for key, value in logs.items():
        if key in names and isinstance(value, dict):
            flat.update({f"{key}/{inner}": item for inner, item in value.items()})
        else:
            flat[key] = value
    return flat


def check_checkpoint(path: str) -> None:
    """Checks that `path` (`--checkpoint`, `run_experiment.eval_checkpoint`) is a checkpoint
    prefix whose every tensor reads back. Eager; returns None.

    Raises:
      ConfigError: naming `path` and what is wrong with it.
    """
    if not isinstance(path, str) or not path:
        raise ConfigError(
            f"`eval_checkpoint` must be a checkpoint prefix such as runs/x/ckpt-1000; received "
            f"{path!r}. Fix --checkpoint or orbitask.run_experiment.eval_checkpoint."
        )
    if files.is_folder(path):
        reason = "it is a directory"
    elif not tf.io.gfile.exists(path + ".index"):
        reason = f"there is no {path}.index"
    else:
        reason = checkpoint_files.unreadable_reason(path)
    if reason is not None:
        raise ConfigError(
            f"--checkpoint {path!r} is not a readable checkpoint: {reason}. Pass a checkpoint "
            "prefix, the name before .index (e.g. runs/x/ckpt-1000)."
        )


def saved_checkpoints(manager) -> list[str]:
    """The readable checkpoints in `manager`'s directory, oldest first, found by their files
    (`<name>-<N>.index`), for `--mode=eval_all`. Eager; reads each in full and names the ones
    that do not read back in a warning (they are left out, and left in place).

    Raises:
      ConfigError: when the directory holds no readable checkpoint.
    """
    name = compat.manager_settings(manager)["checkpoint_name"]
    found = checkpoint_files.scan(manager.directory, name)
    readable = []
    for path in found:
        reason = checkpoint_files.unreadable_reason(path)
        if reason is None:
            readable.append(path)
        else:
            print(f"orbitask: warning: checkpoint {path} is unreadable, not evaluated: {reason}")
    if not readable:
        some = f"none of its {len(found)} is readable" if found else f"it has no {name}-<N>"
        raise ConfigError(
            f"--mode=eval_all evaluates the checkpoints in {manager.directory!r}, and {some}; "
            "pass the --model_dir you trained into."
        )
    return readable


def _array(dtype) -> tf.TensorArray:
    return tf.TensorArray(dtype, size=0, dynamic_size=True, infer_shape=False)


def _per_step(gathered: list, shapes: list, steps: int):
    """Yields each step's flat logs from `_gather_loop`'s output, as eager tensors (what a
    step-by-step evaluation hands `aggregate_logs`; Model Garden's call `.numpy()`). Eager."""
    columns = []
    for values, step_shapes in zip(gathered, shapes, strict=True):
        step_shapes = step_shapes.numpy()
        sizes = np.prod(step_shapes, axis=1, dtype=np.int64)  # a scalar's empty shape: 1
        pieces = np.split(values.numpy(), np.cumsum(sizes)[:-1])
        columns.append([p.reshape(shape) for p, shape in zip(pieces, step_shapes, strict=True)])
    for step in range(steps):
        yield [tf.constant(column[step]) for column in columns]
