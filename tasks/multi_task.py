"""`MultiTask`: several tasks trained together, each with its own data, loss and weight (nabu).

One step's batch is a dict of per-task batches (`tf.data.Dataset.zip` of each task's
`build_inputs`), the model maps a dict of per-task inputs to a dict of per-task outputs, and the
loss is the weighted mean of the task losses. Three ways to share the model (nabu's three
multi-task model types):

- "shared": one model for all tasks (the first task's), only the losses differ;
- "trunk": the first task's model without its last `head_layers` layers is a shared trunk, and
  each task keeps its own last `head_layers` layers as its head (models must be `Sequential`;
  checkpointed as `trunk_<i>` and `head_<task>_<i>`);
- "separate": each task its own model; only the update is shared.

Loss scaling is the default step's: each task's loss is the SUM over its replica batch, so the value
differentiated is `sum_t w_t SUM_t / global_batch_size / sum_t w_t + extra_loss / replicas`, and N
replicas train exactly like one device with N times the batch. Train logs add `loss/<task>` (the
task's mean loss on the global batch) to `loss` and `grad_norm`; eval logs hold `loss/<task>`,
`<metric>/<task>` and `loss`, the weighted mean over the validated tasks.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import gin
import tensorflow as tf

from orbitask.common import keras_compat, setting_rules
from orbitask.common.errors import ConfigError
from orbitask.tasks.base import Task
from orbitask.tasks.default_steps import batch_size, labels_of
from orbitask.tasks.indexed_input import IndexedInput
from orbitask.tasks.model_garden import GUIDE, is_model_garden_task
from orbitask.tasks.multi_task_model import build_multi_model

SHARING = ("shared", "trunk", "separate")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class MultiTaskLoss:
    """The weighted mean of the task losses; each task loss is the SUM over its batch.

    Built eagerly by `MultiTask.build_losses`; called traced, per replica, in the steps.
    """

    def __init__(self, losses: Mapping[str, Any], weights: Mapping[str, float]):
        self.losses = dict(losses)
        self.weights = dict(weights)

    def per_task(self, loss_input: Mapping[str, Any]) -> dict[str, tf.Tensor]:
        """Returns `{task: SUM of that task's loss over its batch}` for the tasks present."""
        return {
            name: tf.cast(self.losses[name](value), tf.float32)
            for name, value in loss_input.items()
        }

    def __call__(self, loss_input: Mapping[str, Any]) -> tf.Tensor:
        """Returns `sum_t w_t loss_t / sum_t w_t` over the tasks present in `loss_input`."""
        per_task = self.per_task(loss_input)
        total = sum(self.weights[name] for name in per_task) or 1.0  # all present weigh 0
        return tf.add_n([self.weights[name] * loss for name, loss in per_task.items()]) / total


@gin.configurable("MultiTask", module="orbitask")
class MultiTask(Task):
    """Trains several tasks at once (nabu's MultiTaskTrainer). See the module docstring.

    Each task contributes its `build_inputs` / `make_batches`, `build_model`, `build_losses`,
    `input_pre`, `loss_pre`, `build_metrics` and `process_metrics`; its own `train_step`,
    `grad_pre`, `update_pre` and callbacks are not used (the MultiTask's are: clipping applies to
    the global gradient of the total loss). Every task gets `per_replica_batch_size` examples per
    replica and step.

    Args:
      tasks: `{name: Task}`; names are identifiers, used in logs and checkpoints.
      weights: `{name: weight}` (non-negative, not all zero); None weighs every task 1.
      sharing: "shared", "trunk" or "separate".
      head_layers: in "trunk" sharing, how many last layers of each task's model are its head.
      exclude_from_validation: names of tasks not validated (nabu's `tasks_excluded_for_val`).

    Raises:
      ConfigError: for a bad setting, with the setting's name.
    """

    def __init__(
        self,
        tasks: Mapping[str, Task],
        weights: Mapping[str, float] | None = None,
        sharing: str = "trunk",
        head_layers: int = 1,
        exclude_from_validation: Sequence[str] = (),
    ):
        super().__init__()
        self.tasks = _named_tasks(tasks)
        self.names = tuple(self.tasks)
        self.weights = _weights(weights, self.names)
        if sharing not in SHARING:
            raise ConfigError(
                f"`MultiTask.sharing` must be one of {', '.join(SHARING)}; received {sharing!r}."
            )
        setting_rules.require(setting_rules.POSITIVE_INT, head_layers, "`MultiTask.head_layers`")
        excluded = tuple(exclude_from_validation or ())
        unknown = [name for name in excluded if name not in self.tasks]
        if unknown:
            raise ConfigError(
                f"`MultiTask.exclude_from_validation` names unknown task(s) {unknown}; the tasks "
                f"are {list(self.names)}."
            )
        self.validation_names = tuple(n for n in self.names if n not in excluded)
        if not self.validation_names:
            raise ConfigError(
                "`MultiTask.exclude_from_validation` excludes every task; keep at least one, or "
                "run with --mode=train."
            )
        self.sharing = sharing
        self.head_layers = head_layers
        self._metric_owner: dict[int, tuple[str, Any]] = {}
        self._step_local = threading.local()

    # ------------------------------------------------------------------------------- builders

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        """Returns a dataset of `{task: batch}`. Eager, once.

        Training zips the tasks' (repeating) datasets (an `IndexedInput` as its `as_dataset`).
        Validation zips the validated tasks' datasets to the longest: a task that has run out
        gives empty batches, so every task's whole validation set is evaluated.
        """
        datasets = {}
        for name in self.names if training else self.validation_names:
            task = self.tasks[name]
            dataset = task.build_inputs(per_replica_batch_size, input_context, training=training)
            if isinstance(dataset, IndexedInput):
                dataset = dataset.as_dataset(input_context)
            datasets[name] = task.make_batches(dataset, per_replica_batch_size)
        if training:
            return tf.data.Dataset.zip(datasets)
        return _zip_longest(datasets)

    def build_model(self):
        """Returns one Keras model mapping `{task: inputs}` to `{task: outputs}`. Eager, in scope.

        Its flavour (Keras 3 or tf_keras) is that of the tasks' models.
        """
        built = self.names[:1] if self.sharing == "shared" else self.names
        models = {name: self.tasks[name].build_model() for name in built}
        return build_multi_model(models, self.names, self.sharing, self.head_layers)

    def build_losses(self) -> MultiTaskLoss:
        """Returns the `MultiTaskLoss` of the tasks' losses and weights. Eager, once, in scope."""
        losses = {name: self.tasks[name].build_losses() for name in self.names}
        return MultiTaskLoss(losses, self.weights)

    def build_metrics(self, training=True) -> list:
        """Returns every (validated) task's metrics, renamed `<metric>/<task>`. Eager, in scope."""
        metrics = []
        for name in self.names if training else self.validation_names:
            for metric in self.tasks[name].build_metrics(training) or []:
                keras_compat.rename_metric(metric, f"{metric.name}/{name}")
                self._metric_owner[id(metric)] = (name, metric)
                metrics.append(metric)
        return metrics

    # --------------------------------------------------------------------------------- stages

    def input_pre(self, batch, lr):
        """Returns `{task: task.input_pre(batch[task], lr)}`. Traced by tf.function, per replica."""
        return {name: self.tasks[name].input_pre(value, lr) for name, value in batch.items()}

    def loss_pre(self, outputs, batch, model, lr):
        """Returns `{task: task.loss_pre(outputs[task], batch[task], model, lr)}`. Traced."""
        return {
            name: self.tasks[name].loss_pre(outputs[name], value, model, lr)
            for name, value in batch.items()
        }

    def process_metrics(self, metrics, labels, model_outputs, **kwargs) -> None:
        """Updates each task's metrics with that task's labels and outputs; returns None. Traced.

        `labels` is the whole `{task: batch}` dict (not a pair: `labels_of` keeps it whole).
        """
        del kwargs
        by_task: dict[str, list] = {}
        for metric in metrics or []:
            owner = self._metric_owner.get(id(metric))
            if owner is not None and owner[1] is metric:
                by_task.setdefault(owner[0], []).append(metric)
        for name, group in by_task.items():
            if name in labels:
                task = self.tasks[name]
                task.process_metrics(group, labels_of(labels[name]), model_outputs[name])

    # ---------------------------------------------------------------------------------- steps

    def compute_gradients(self, batch, model, metrics=None, **kwargs):
        """The base `compute_gradients`, also noting each task's loss SUM. Traced by tf.function.

        Returns `(gradients, trainable_vars, aux)`; aux adds `task_losses`, `{task: SUM}`.
        """
        gradients, variables, aux = super().compute_gradients(batch, model, metrics, **kwargs)
        loss_input = self.loss_pre(aux["outputs"], batch, model, kwargs["lr"])
        aux = dict(aux, task_losses=kwargs["loss_fn"].per_task(loss_input))
        collected = getattr(self._step_local, "task_losses", None)
        if collected is not None:
            collected.append(aux["task_losses"])
        return gradients, variables, aux

    def compute_update(self, batch, model, optimizer, metrics=None, **kwargs):
        """The base `compute_update` plus a `loss/<task>` log per task. Traced by tf.function.

        `loss/<task>` is the task's mean loss on the global batch (without regularisation);
        the trainer's mean over replicas gives the value one device would compute.

        Returns `(update_gradients, trainable_vars, logs)`.
        """
        # The base method calls compute_gradients once per micro-batch; their task losses come
        # back through this replica thread's list (MirroredStrategy runs replicas in threads).
        self._step_local.task_losses = collected = []
        try:
            update, variables, logs = super().compute_update(
                batch, model, optimizer, metrics, **kwargs
            )
        finally:
            self._step_local.task_losses = None
        replicas = float(tf.distribute.get_replica_context().num_replicas_in_sync)
        scale = replicas / float(kwargs["global_batch_size"])
        logs = dict(logs)
        for name in collected[0] if collected else ():
            logs[f"loss/{name}"] = tf.add_n([c[name] for c in collected]) * scale
        return update, variables, logs

    def validation_step(self, batch, model, metrics=None, *, loss_fn, lr):
        """Forward pass of every validated task; updates metrics. Traced by tf.function.

        Returns `{"loss/<task>": SUM over the task's batch, "num_examples/<task>": its size}`.
        """
        outputs = model(self.input_pre(batch, lr), training=False)
        per_task = loss_fn.per_task(self.loss_pre(outputs, batch, model, lr))
        self.process_metrics(metrics, labels_of(batch), outputs)
        logs = {}
        for name, loss in per_task.items():
            logs[f"loss/{name}"] = loss
            logs[f"num_examples/{name}"] = tf.cast(batch_size(batch[name]), tf.float32)
        return logs

    def reduce_aggregated_logs(self, aggregated_logs, global_step=None) -> dict:
        """Returns `loss/<task>` (mean per task) and `loss` (their weighted mean). Eager."""
        del global_step
        state = dict(aggregated_logs or {})
        logs, weighted, weight = {}, 0.0, 0.0
        for name in self.validation_names:
            count = float(state.get(f"num_examples/{name}", 0.0))
            if count:
                logs[f"loss/{name}"] = float(state[f"loss/{name}"]) / count
                weighted += self.weights[name] * logs[f"loss/{name}"]
                weight += self.weights[name]
        if weight:
            logs["loss"] = weighted / weight
        return logs


def _named_tasks(tasks: Any) -> dict[str, Task]:
    if not isinstance(tasks, Mapping) or not tasks:
        raise ConfigError(
            "`MultiTask.tasks` must be a non-empty dict {name: Task}; received "
            f"{tasks!r} of type {type(tasks).__name__}."
        )
    named = dict(tasks)
    for name, task in named.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError(
                f"MultiTask task names must be identifiers (letters, digits, _); received {name!r}."
            )
        if is_model_garden_task(task):
            raise ConfigError(
                f"`MultiTask.tasks[{name!r}]` is a Model Garden task; MultiTask combines the "
                f"stages of orbitask Tasks: port it ({GUIDE}) or train it alone."
            )
        if not isinstance(task, Task):
            raise ConfigError(
                f"`MultiTask.tasks[{name!r}]` must be a tasks.Task; received {task!r} of type "
                f"{type(task).__name__}."
            )
    return named


def _weights(weights: Any, names: tuple) -> dict[str, float]:
    if weights is None:
        return {name: 1.0 for name in names}
    if not isinstance(weights, Mapping) or set(weights) != set(names):
        raise ConfigError(
            f"`MultiTask.weights` must be a dict with one weight per task {list(names)}; "
            f"received {weights!r}."
        )
    values = {name: weights[name] for name in names}
    if any(
        isinstance(w, bool) or not isinstance(w, (int, float)) or w < 0 for w in values.values()
    ) or not sum(values.values()):
        raise ConfigError(
            f"`MultiTask.weights` must be non-negative numbers, not all zero; received {weights!r}."
        )
    return {name: float(w) for name, w in values.items()}


def _zip_longest(datasets: dict[str, tf.data.Dataset]) -> tf.data.Dataset:
    """Zips finite datasets to the longest one; exhausted ones yield empty batches."""
    padded = {}
    for name, dataset in datasets.items():
        # Zipping into 1-tuples makes `map` receive the whole element, whatever its structure.
        empty = tf.data.Dataset.zip((dataset.take(1),)).map(
            lambda element: tf.nest.map_structure(lambda t: t[:0], element)
        )
        padded[name] = dataset.concatenate(empty.repeat())
    return tf.data.Dataset.zip(padded).take_while(
        lambda batch: tf.reduce_any(tf.stack([batch_size(b) > 0 for b in batch.values()]))
    )
