"""`ModelGardenTask`: a Model Garden `official.core.base_task.Task`, trained by orbitask as it is.

`run_experiment` (and gin's `TASK = @...`) wraps a Model Garden task in this adapter itself; the
task keeps every method of its own, with Model Garden's signatures::

    build_inputs(per_replica_batch_size, input_context, training)
        -> task.build_inputs(task_config.train_data or .validation_data, input_context)
    build_model()                -> task.build_model()
    build_metrics(training)      -> task.build_metrics(training)
    build_optimizer(lr)          -> task.create_optimizer(experiment.trainer.optimizer_config,
                                    experiment.runtime), or the seed's Nadam (epsilon 1e-3,
                                    global-norm clipping at `clip_norm` for tf_keras models)
    train_step(batch, ...)       -> task.train_step(batch, model=, optimizer=, metrics=)
    validation_step(batch, ...)  -> task.validation_step(batch, model=, metrics=)
    aggregate_logs / reduce_aggregated_logs -> the task's own, when it has them
    initialize(model)            -> task.initialize(model), on a fresh run only
    process_metrics(metrics, labels, outputs) -> task.process_metrics(...)
    build_checkpoint(directory, **trackables) -> orbitask's checkpoint, which also holds
                                    Model Garden's names (`model_garden_names`)

A checkpoint is shared with Model Garden both ways: besides orbitask's names it holds the objects
under the names `official.core.base_trainer.Trainer` gives them (`global_step`, `model`,
`optimizer` and the model's `checkpoint_items`), so Model Garden's eval mode and a task's
`initialize` with `init_checkpoint` read it; and orbitask restores the model, optimizer and step
of a checkpoint that Model Garden's `train_lib.run_experiment` wrote
(`trainers.state.checkpoint_restore`).

The global batch is `run_experiment.global_batch_size`; a `DataConfig.global_batch_size` that is
set must agree with it for training (`check_global_batch_size`), and one left at 0 is filled in.
The evaluation loss `logs[task.loss]` is Model Garden's `validation_loss`: the mean of its
per-replica, per-step values. A task that keeps base_task's `aggregate_logs` evaluates as one
device loop (orbitask's default reduction of that one log); one with its own gets every step's
per-replica values of every log from device loops, folded in by its `aggregate_logs` on the host.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Mapping
from typing import Any

import gin
import numpy as np
import tensorflow as tf

from orbitask.common import keras_compat
from orbitask.common.errors import ConfigError
from orbitask.tasks import eval_logs
from orbitask.tasks.base import Task

GUIDE = "docs/porting_from_model_garden.md"
_BASE_TASK = "official.core.base_task"
# Model Garden's name (official.core.base_trainer.Trainer's checkpoint) -> orbitask's name.
MODEL_GARDEN_NAMES = {"global_step": "step", "model": "train_model", "optimizer": "optimizer"}


def is_model_garden_task(task: Any) -> bool:
    """Whether `task` is an `official.core.base_task.Task`. Eager; imports nothing (a task can
    only be one once `official` is imported)."""
    module = sys.modules.get(_BASE_TASK)
    return module is not None and isinstance(task, module.Task)


def _own_log_reduction(task: Any) -> bool:
    """Whether a Model Garden task overrides base_task's `aggregate_logs` or
    `reduce_aggregated_logs`."""
    base = sys.modules[_BASE_TASK].Task
    kind = type(task)
    return (
        kind.aggregate_logs is not base.aggregate_logs
        or kind.reduce_aggregated_logs is not base.reduce_aggregated_logs
    )


def model_garden_names(trackables: Mapping[str, Any]) -> dict[str, Any]:
    """Returns the objects of orbitask's checkpoint `trackables` under the names Model Garden's
    trainer saves them with (`global_step`, `model`, `optimizer`, and `model.checkpoint_items`,
    e.g. a BERT classifier's `encoder`), each one whose name orbitask does not use. Eager."""
    names = {mg: trackables[ours] for mg, ours in MODEL_GARDEN_NAMES.items() if ours in trackables}
    model = trackables.get("train_model")
    names.update(dict(getattr(model, "checkpoint_items", None) or {}))
    return {name: obj for name, obj in names.items() if name not in trackables}


def adapt(task: Any) -> Any:
    """Returns a Model Garden task wrapped in `ModelGardenTask`, any other task unchanged. Eager;
    `ModelGardenTask`'s gin bindings (its `experiment`) apply."""
    return ModelGardenTask(task) if is_model_garden_task(task) else task


def with_experiment(task: Any, experiment: Any) -> ModelGardenTask:
    """Returns the Model Garden `task` wrapped with its `ExperimentConfig` (`run_experiment`'s
    `params`). Eager.

    Raises:
      ConfigError: when `task` is not a Model Garden task as it is (an orbitask Task, or one
        already wrapped: pass its `experiment` there).
    """
    if not is_model_garden_task(task):
        raise ConfigError(
            "run_experiment.params is a Model Garden ExperimentConfig for a Model Garden task as "
            f"it is; received a task of type {type(task).__name__}. For an already wrapped task, "
            "pass orbitask.ModelGardenTask(task, experiment=params) instead."
        )
    return ModelGardenTask(task, experiment=experiment)


@gin.configurable("ModelGardenTask", module="orbitask")
class ModelGardenTask(Task):
    """A Model Garden task as an orbitask Task (module docstring). `run_experiment` wraps one
    itself; wrap it yourself to pass an `experiment`.

    Args:
      task: an `official.core.base_task.Task`, constructed as Model Garden constructs it (with
        its `TaskConfig`, whose `train_data` / `validation_data` are `DataConfig`s).
      experiment: an `ExperimentConfig`; when given, the optimizer is Model Garden's
        `create_optimizer(experiment.trainer.optimizer_config, experiment.runtime)`. None: the
        seed's default optimizer.
      **task_kwargs: `orbitask.Task`'s arguments (clip_norm, optimizer_epsilon, keras_flavour,
        name, save_layer_draws).

    Raises:
      ConfigError: when `task` is not a Model Garden task.
    """

    # Model Garden's steps log each replica's own mean loss, which its trainer averages.
    replica_logs = "mean"
    # Its train_step logs its metrics' results too; the metrics' own, over all replicas, apply.
    logs_its_metrics = True

    def __init__(self, task: Any, experiment: Any = None, **task_kwargs: Any):
        if not is_model_garden_task(task):
            raise ConfigError(
                "ModelGardenTask wraps an official.core.base_task.Task; received "
                f"{type(task).__name__}. An orbitask Task runs as it is."
            )
        if _own_log_reduction(task) and not isinstance(self, ModelGardenTaskWithLogs):
            # Its aggregate_logs runs on the host. Chosen here, not in __new__, so that a
            # subclass which builds its Model Garden task inside __init__ gets it too.
            self.__class__ = _with_logs(type(self))
        task_kwargs.setdefault("name", type(task).__name__)
        super().__init__(**task_kwargs)
        self.task = task
        self.experiment = experiment
        self.loss = task.loss

    # Builders: eager, once, in the strategy's scope.

    def data_config(self, training: bool = True) -> Any:
        """Returns the task's `DataConfig` for training or validation. Eager.

        Raises:
          ConfigError: when the task's config has none.
        """
        field = "train_data" if training else "validation_data"
        params = getattr(self.task.task_config, field, None)
        if params is None:
            raise ConfigError(
                f"{self.name}.task_config has no {field}: construct the task with its TaskConfig "
                f"as Model Garden does, e.g. {self.name}(params=config.task) (see {GUIDE})."
            )
        return params

    def check_global_batch_size(self, global_batch_size: int) -> None:
        """Checks `run_experiment.global_batch_size` against the training `DataConfig`. Eager,
        before any work; returns None.

        Raises:
          ConfigError: when the DataConfig sets another global batch size.
        """
        theirs = getattr(self.data_config(training=True), "global_batch_size", None)
        if theirs and theirs != global_batch_size:
            raise ConfigError(
                f"run_experiment.global_batch_size is {global_batch_size} but {self.name}'s "
                f"task_config.train_data.global_batch_size is {theirs}; set "
                f"orbitask.run_experiment.global_batch_size = {theirs} (orbitask trains the "
                "batch of its own setting, and the task's DataConfig must agree)."
            )

    def build_inputs(
        self,
        per_replica_batch_size: int,
        input_context: tf.distribute.InputContext | None = None,
        training: bool = True,
    ) -> tf.data.Dataset:
        """Returns `task.build_inputs(data_config, input_context)`. Eager, once per pipeline.

        The `DataConfig`'s `global_batch_size`, when 0, becomes this run's global batch;
        `input_context` is passed when the task's `build_inputs` takes it (Orbit's rule).

        Raises:
          ConfigError: when training batches are not `per_replica_batch_size` long.
        """
        replicas = input_context.num_replicas_in_sync if input_context else 1
        global_batch = per_replica_batch_size * replicas
        params = self.data_config(training)
        if not getattr(params, "global_batch_size", global_batch):
            params = params.replace(global_batch_size=global_batch)
        build = self.task.build_inputs
        takes_context = "input_context" in inspect.signature(build).parameters
        dataset = build(params, input_context=input_context) if takes_context else build(params)
        if training and isinstance(dataset, tf.data.Dataset):
            self._check_batch(dataset, per_replica_batch_size, replicas)
        return dataset

    def _check_batch(self, dataset: tf.data.Dataset, per_replica: int, replicas: int) -> None:
        leaves = [s for s in tf.nest.flatten(dataset.element_spec) if hasattr(s, "shape")]
        shape = leaves[0].shape if leaves else None
        size = shape[0] if shape is not None and shape.rank else None
        if size is not None and size != per_replica:
            raise ConfigError(
                f"{self.name}.build_inputs yields batches of {size} but the per-replica batch is "
                f"{per_replica} ({per_replica * replicas} over {replicas} replicas); batch with "
                "input_context.get_per_replica_batch_size(params.global_batch_size)."
            )

    def build_model(self) -> Any:
        """Returns `task.build_model()`. Eager, in the strategy's scope."""
        return self.task.build_model()

    def build_metrics(self, training: bool = True) -> list:
        """Returns `task.build_metrics(training)`. Eager, in the strategy's scope."""
        return list(self.task.build_metrics(training=training) or [])

    def build_optimizer(self, learning_rate: Any) -> Any:
        """Returns the experiment's optimizer (Model Garden's `create_optimizer`) when an
        `experiment` is given, else the seed's Nadam (epsilon `optimizer_epsilon`) with global-norm
        clipping at `clip_norm` of the all-reduced gradient (tf_keras; a Keras 3 optimizer would
        clip each replica's gradient, so there none). Eager, once, in the strategy's scope."""
        if self.experiment is None:
            flavour = self.keras_flavour or keras_compat.KERAS3
            clip = self.clip_norm if flavour == keras_compat.TF_KERAS else None
            return keras_compat.nadam(learning_rate, self.optimizer_epsilon, flavour, clip)
        trainer = self.experiment.trainer
        return self.task.create_optimizer(trainer.optimizer_config, self.experiment.runtime)

    def build_checkpoint(
        self, directory: str, **trackables: Any
    ) -> tuple[tf.train.Checkpoint, tf.train.CheckpointManager]:
        """Returns `Task.build_checkpoint` of `trackables` plus the same objects under Model
        Garden's names (`model_garden_names`), saved once: Model Garden's eval mode and
        `task.initialize` read orbitask's checkpoints. Eager, once, in strategy scope."""
        names = model_garden_names(trackables)
        return super().build_checkpoint(directory, **trackables, **names)

    def initialize(self, model: Any) -> None:
        """Calls `task.initialize(model)` (e.g. loads its `init_checkpoint`). Eager, once, on a
        fresh run only; returns None."""
        self.task.initialize(model)

    def process_metrics(self, metrics: list, labels: Any, model_outputs: Any, **kwargs) -> None:
        """Calls `task.process_metrics(metrics, labels, model_outputs, **kwargs)`, for a
        subclass's own step. Traced by tf.function, per replica; returns None."""
        self.task.process_metrics(metrics, labels, model_outputs, **kwargs)

    # Steps: Model Garden's own, per replica, inside `strategy.run`, under tf.function.

    def train_step(
        self,
        batch: Any,
        model: Any,
        optimizer: Any,
        metrics: list | None = None,
        *,
        loss_fn: Any,
        lr: tf.Variable,
        global_batch_size: int,
    ) -> dict[str, tf.Tensor]:
        """Runs `task.train_step(batch, model=, optimizer=, metrics=)`, which applies the
        gradients itself. Traced by tf.function, per replica; returns its logs (averaged over
        replicas: `logs[task.loss]` is each replica's mean loss)."""
        del loss_fn, lr, global_batch_size
        logs = self.task.train_step(batch, model=model, optimizer=optimizer, metrics=metrics)
        return dict(logs)

    def validation_step(
        self, batch: Any, model: Any, metrics: list | None = None, *, loss_fn: Any, lr: Any
    ) -> dict[str, tf.Tensor]:
        """Runs `task.validation_step(batch, model=, metrics=)`. Traced by tf.function, per
        replica; returns `{task.loss: the mean loss}`, the one log that base_task's trainer
        reduces (to the mean over replicas and steps), or nothing when it reports none."""
        del loss_fn, lr
        logs = self.task.validation_step(batch, model=model, metrics=metrics)
        if self.loss not in logs:
            return {}
        return {self.loss: tf.reduce_mean(tf.cast(logs[self.loss], tf.float32))}


_TASK, _SUM, _COUNT = "task", "loss_sum", "loss_count"


class ModelGardenTaskWithLogs(ModelGardenTask):
    """A `ModelGardenTask` whose task has its own `aggregate_logs` / `reduce_aggregated_logs`:
    each step's outputs reach them, as in Model Garden. `ModelGardenTask(task)` picks it, and a
    subclass of `ModelGardenTask` gets it behind its own methods."""

    def validation_step(
        self, batch: Any, model: Any, metrics: list | None = None, *, loss_fn: Any, lr: Any
    ) -> dict[str, tf.Tensor]:
        """Runs `task.validation_step`. Traced by tf.function, per replica; returns its logs."""
        del loss_fn, lr
        return dict(self.task.validation_step(batch, model=model, metrics=metrics))

    def aggregate_logs(self, state: Any, step_logs: Mapping[str, Any]) -> dict:
        """Folds one step's per-replica logs into the task's own state (`task.aggregate_logs`,
        which first gets None) and into the running mean of `logs[task.loss]`. Eager; returns
        the new state."""
        state = dict(state) if state else {_TASK: None, _SUM: 0.0, _COUNT: 0}
        for value in step_logs.get(self.loss, ()):
            array = np.asarray(value, dtype=np.float64)
            state[_SUM] += float(array.sum())
            state[_COUNT] += array.size
        state[_TASK] = self.task.aggregate_logs(state[_TASK], step_logs)
        return state

    def reduce_aggregated_logs(self, aggregated_logs: Any, global_step: int | None = None) -> dict:
        """Returns `task.reduce_aggregated_logs(its state)` (when its state is not empty, as Model
        Garden calls it) with `logs[task.loss]` the mean loss over replicas and steps. Eager."""
        state = aggregated_logs or {}
        logs = {}
        if state.get(_TASK):
            reduced = self.task.reduce_aggregated_logs(state[_TASK], global_step=global_step)
            logs.update({k: eval_logs.to_python(v) for k, v in dict(reduced or {}).items()})
        if state.get(_COUNT):
            logs[self.loss] = state[_SUM] / state[_COUNT]
        return logs


@functools.cache
def _with_logs(cls: type) -> type:
    """`cls` (`ModelGardenTask` or a user's subclass) with `ModelGardenTaskWithLogs`'s log
    reduction behind the subclass's own methods: a class of the same name, made once per `cls`
    (the same class each call, so checkpoints and `isinstance` see one class)."""
    if cls is ModelGardenTask or issubclass(cls, ModelGardenTaskWithLogs):
        return ModelGardenTaskWithLogs if cls is ModelGardenTask else cls
    names = {k: getattr(cls, k) for k in ("__module__", "__qualname__", "__doc__")}
    return type(cls.__name__, (cls, ModelGardenTaskWithLogs), names)
