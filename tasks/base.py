"""The `Task` base class: builders, the seed's step stages and the host hooks.

A Task holds model and data logic only. The trainer (`trainers`) owns the global step, the
learning-rate variable, checkpoints and summaries, and drives a Task only through these methods.
Its default `train_step` and `validation_step`, composed from the stages, come from
`tasks.default_steps.DefaultSteps` (whose docstring shows the default train step as pseudo-code).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gin
import tensorflow as tf

from orbitask.common import keras_compat, setting_rules
from orbitask.common.errors import ConfigError, MissingBuilder
from orbitask.tasks import callbacks as callbacks_lib
from orbitask.tasks import eval_logs, extra_losses
from orbitask.tasks import gradients as gradients_lib
from orbitask.tasks.default_steps import DefaultSteps


@gin.configurable("Task", module="orbitask")
class Task(DefaultSteps):
    """Base class of every orbitask task. Subclass it and override what is unusual.

    Required: `build_inputs`, `build_model`, `build_losses`. Everything else has the seed's default.
    `loss` (class attribute, "loss" as in Model Garden) is the key of the loss in the step logs.

    Args:
      clip_norm: global-norm clipping of the all-reduced gradient in the default `update_pre`
        (None disables clipping). Seed default 10.
      optimizer_epsilon: epsilon of the default Nadam optimizer. Seed default 1e-3.
      keras_flavour: "keras" (Keras 3, `tf.keras`) or "tf_keras"; None follows the built model.
      class_weight: `{class: weight}`: each example's loss is weighted by its label's class, as
        Keras `fit(class_weight=...)` does on arrays (integer labels, or one-hot; a class not
        named weighs 1.0); None: the class attribute `class_weight` (a subclass may set it, as
        `loss_reduction`), unweighted when that is None too.
      save_layer_draws: tf_keras dropout and noise layers draw from generators the checkpoint
        saves, seeded apart from the initial weights (a resumed run draws the uninterrupted
        run's masks); False keeps tf_keras' own stateful draws, which no checkpoint holds.
      name: a name for logs.

    How many checkpoints are kept and how much training input is prefetched are the run's
    settings (`run_experiment.max_to_keep`, `train_prefetch`, `train_prefetch_bytes`), not the
    Task's.
    """

    loss = "loss"  # the loss's key in train and validation logs (Model Garden's `Task.loss`)

    # How a term that a layer adds with `add_loss` in `call` (not an activity regulariser, not
    # a weight regulariser) depends on the replica's batch, so N replicas count it as one device
    # with the whole batch: "batch_sum" (a sum over the batch, as the Keras guides' layers add),
    # "batch_mean" (a mean over the batch) or "once" (independent of the batch).
    added_losses = "batch_sum"

    # What a scalar that `loss_fn` returns is over the replica's batch: "sum" (per-example losses
    # summed; the default step divides by the global batch size) or "mean" (their mean, which
    # the default steps multiply by the replica's examples first, so it trains as the sum would).
    # A Keras 3 loss object's mean is a mean. The check before the first step refuses a mean
    # under "sum" (it would train with a 1/batch gradient), and measures whether the loss is
    # already divided by the replica count (Keras 3 loss objects, `tf.nn.compute_average_loss`):
    # the default steps then get it multiplied back (`trainers.run.loss_share`).
    loss_reduction = "sum"

    # `{class: weight}`, the default of the constructor's `class_weight` (None: unweighted).
    class_weight: dict | None = None

    def __init__(
        self,
        clip_norm: float | None = 10.0,
        optimizer_epsilon: float = 1e-3,
        keras_flavour: str | None = None,
        name: str | None = None,
        save_layer_draws: bool = True,
        class_weight: dict | None = None,
    ):
        setting_rules.check(
            "Task",
            dict(
                clip_norm=clip_norm,
                optimizer_epsilon=optimizer_epsilon,
                save_layer_draws=save_layer_draws,
            ),
        )
        if keras_flavour not in (None, *keras_compat.FLAVOURS):
            raise ConfigError(
                f"`keras_flavour` must be None, 'keras' or 'tf_keras'; received {keras_flavour!r}."
            )
        self.clip_norm = clip_norm
        self.optimizer_epsilon = optimizer_epsilon
        self.keras_flavour = keras_flavour
        self.save_layer_draws = save_layer_draws
        where = "orbitask.Task.class_weight (the constructor's argument)"
        if class_weight is None:
            class_weight, where = type(self).class_weight, f"{type(self).__name__}.class_weight"
        self.class_weight = _class_weights(class_weight, where)
        self.name = name or type(self).__name__

    # Builders: eager, called once by the runner inside `strategy.scope()`.

    def build_inputs(
        self,
        per_replica_batch_size: int,
        input_context: tf.distribute.InputContext | None = None,
        training: bool = True,
    ) -> tf.data.Dataset:
        """Returns the dataset of one input pipeline, batched per replica. Runs eagerly.

        Shard by `input_context.input_pipeline_id` when several pipelines exist (multi-worker).
        A training dataset should repeat; a validation dataset should be finite. With
        `training=False` it may instead return a dict `{name: dataset}` of one or more
        validation sets (names without "/"): each is evaluated, its metrics and aggregated logs
        started afresh, and its logs are `<name>/<key>` (e.g. `valid/loss`), its summaries
        under `eval/<name>/` (not under `parameter_server`).
        """
        raise MissingBuilder(f"{type(self).__name__} must implement build_inputs().")

    def build_predict_inputs(
        self, per_replica_batch_size: int, input_context: tf.distribute.InputContext | None = None
    ) -> Any:
        """Returns the finite dataset `--mode=predict` runs the model over, batched per replica,
        in a fixed order (a rerun resumes by counting its batches). Runs eagerly, once per
        input pipeline. Default: the validation input; of several validation sets, the first."""
        value = self.build_inputs(per_replica_batch_size, input_context, training=False)
        return next(iter(value.values())) if isinstance(value, dict) else value

    def make_batches(self, dataset: tf.data.Dataset, per_replica_batch_size: int):
        """Returns the dataset with custom batching (seed default: unchanged). Eager, once."""
        del per_replica_batch_size
        return dataset

    def build_model(self) -> Any:
        """Returns the model (a Keras model, or a dict of them). Eager, in strategy scope."""
        raise MissingBuilder(f"{type(self).__name__} must implement build_model().")

    def build_losses(self) -> Any:
        """Returns `loss_fn`; `loss_fn(loss_input)` gives per-example losses or their sum.

        Eager, once, in strategy scope; `loss_fn` itself is traced by tf.function in each step.
        """
        raise MissingBuilder(f"{type(self).__name__} must implement build_losses().")

    def build_optimizer(self, learning_rate: Any) -> Any:
        """Returns the optimizer: `Nadam(learning_rate, epsilon=1e-3)` of the model's flavour.

        Eager, once, in strategy scope. The runner keeps the optimizer's rate equal to its
        checkpointed learning-rate variable.
        """
        return keras_compat.nadam(
            learning_rate, self.optimizer_epsilon, self.keras_flavour or keras_compat.KERAS3
        )

    def build_checkpoint(
        self, directory: str, **trackables: Any
    ) -> tuple[tf.train.Checkpoint, tf.train.CheckpointManager]:
        """Returns `(checkpoint, manager)` saving every trackable given, keeping the 50
        newest, as the seed's builder does (`run_experiment.max_to_keep`, when set, overrides
        the number of any Task's manager).

        Eager, once, in strategy scope.
        """
        kept = {k: v for k, v in trackables.items() if _is_trackable(v)}
        checkpoint = tf.train.Checkpoint(**kept)
        manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=50)
        return checkpoint, manager

    def build_metrics(self, training: bool = True) -> list:
        """Returns Keras metrics updated by `process_metrics` (default none). Eager, in scope."""
        del training
        return []

    def initialize(self, model: Any) -> None:
        """Prepares the built model of a fresh run, e.g. loads pretrained weights (Model Garden's
        `initialize`); not called on a resumed run. Eager, once, after the checkpoint is built and
        before `run_experiment.warm_start`; returns None. Default: nothing."""
        del model

    # Step stages: traced by tf.function, run per replica inside `strategy.run`.

    def input_pre(self, batch: Any, lr: Any) -> Any:
        """Returns the model input (seed default: the first of an `(inputs, gt)` batch, or of an
        `(inputs, gt, weights)` one).

        Traced by tf.function, per replica (train and validation steps).
        """
        del lr
        return batch[0]

    def predict_step(self, batch: Any, model: Any) -> Any:
        """Returns what `--mode=predict` keeps of one replica's batch: any nest of tensors with
        the batch's examples as their leading dimension. Default: `model(input_pre(batch, None),
        training=False)`. Traced by tf.function, per replica."""
        return model(self.input_pre(batch, None), training=False)

    def loss_pre(self, outputs: Any, batch: Any, model: Any, lr: Any) -> Any:
        """Returns the loss input (seed default: `(outputs, gt)`). Traced by tf.function."""
        del model, lr
        return outputs, batch[1]

    def example_weights(self, batch: Any) -> Any:
        """Returns the weight of each example's loss (shape `[batch]`), or None: unweighted.

        Default: the third item of an `(inputs, gt, weights)` batch, as Keras `fit`'s
        `sample_weight`, times `class_weight[gt]` when set. The default steps multiply the
        per-example losses by it; a step is still divided by its examples, not by the weights'
        sum (Keras' "sum_over_batch_size"). A task that overrides `input_pre` or `loss_pre` owns
        its batch: none. Traced by tf.function, per replica (train and validation steps).
        """
        kind = type(self)
        if kind.input_pre is not Task.input_pre or kind.loss_pre is not Task.loss_pre:
            return None
        weights = batch[2] if isinstance(batch, (tuple, list)) and len(batch) == 3 else None
        if self.class_weight is not None:
            by_class = _weight_of_class(self.class_weight, _class_ids(batch[1]))
            weights = by_class if weights is None else tf.cast(weights, by_class.dtype) * by_class
        return weights

    def grad_pre(self, loss, outputs, batch, model, loss_fn, lr):
        """Returns `(loss_per_batch, extra_loss, trainable_vars)` (seed default: model.losses).

        Traced by tf.function, per replica, inside the gradient tape. The default `extra_loss`
        is a `tasks.extra_losses.ExtraLoss`: `model.losses` sorted by how they depend on the
        batch (weight regularisers once, activity regularisers as means, other `add_loss`
        terms as `added_losses` says), so that N replicas count them as one device does. A
        plain tensor or number counts once per step. An override may return a fourth value:
        the count this replica's loss is normalised by (tokens, frames; default its examples).
        """
        del outputs, batch, loss_fn, lr
        extra_loss = extra_losses.extra_losses(model, self.added_losses)
        return loss, extra_loss, model.trainable_variables

    def update_pre(self, gradients, loss, outputs, batch, model, loss_fn, lr, optimizer):
        """Returns `(update_gradients, display_gradients)`: NaN/Inf -> 0, then global-norm clip.

        Traced by tf.function, per replica. Receives the gradient already summed over replicas,
        so clipping sees the global norm. The display list is a `tasks.gradients.Gradients`
        carrying its global norm, which the `grad_norm` log reuses (an override may return
        plain lists). See `tasks.gradients.zero_nans_and_clip`.
        """
        del loss, outputs, batch, model, loss_fn, lr, optimizer
        return gradients_lib.zero_nans_and_clip(gradients, self.clip_norm)

    def process_metrics(self, metrics: list, labels: Any, model_outputs: Any, **kwargs) -> None:
        """Updates each metric with `(labels, model_outputs)`; returns None (Model Garden's
        signature: a ported `train_step` may call `self.process_metrics(metrics, labels, outputs)`).

        Traced by tf.function, per replica. The default steps pass `labels_of(batch)`: the `gt`
        that the default `loss_pre` takes from an `(inputs, gt)` batch.
        """
        del kwargs
        for metric in metrics or []:
            metric.update_state(labels, model_outputs)

    # Python-side metrics (Model Garden): eager, once per eval step / once per evaluation.

    def aggregate_logs(self, state: Any, step_logs: Mapping[str, Any]) -> Any:
        """Folds one eval step's logs into `state`. Eager; returns the new state.

        `step_logs` maps each key of `validation_step`'s logs to a tuple with one value per
        replica. Default: `tasks.eval_logs.aggregate` (sums, and counts the values).
        """
        return eval_logs.aggregate(state, step_logs)

    def reduce_aggregated_logs(self, aggregated_logs: Any, global_step: int | None = None) -> dict:
        """Turns the aggregated state into final eval logs. Eager; returns `{name: value}`.

        Default (`tasks.eval_logs`): with `num_examples` in the logs, every key divided by it (so
        the default `loss` is the mean loss per example); without it, the mean of each key's
        per-replica, per-step values (a step returning its batch's mean loss reports the mean).
        """
        del global_step
        return eval_logs.reduce(aggregated_logs)

    # Host callbacks.

    def every_steps(self) -> dict[int, Any]:
        """Returns `{N: callback or [callbacks]}` run after every N-th step. Eager, once.

        Default `{10: print_loss}`. The callbacks themselves run eagerly, between device loops.
        """
        return {10: callbacks_lib.print_loss}

    def at_step(self) -> dict[int, Any]:
        """Returns `{N: callback or [callbacks]}` run once, after step N. Eager; default `{}`."""
        return {}

    # Hooks: eager, on every worker, each with a `CallbackContext` (the order: docs/reference.md).

    def on_train_begin(self, ctx: Any) -> None:
        """Eager, before the first device loop of a training run (each start, resumed or not),
        at the step it starts from; `ctx.logs` is empty. Returns None; the default does
        nothing."""

    def on_train_end(self, ctx: Any) -> None:
        """Eager, after training reached its last step (not after an error or a stop):
        `ctx.logs` is the last loop's train logs. Returns None; the default does nothing."""

    def on_evaluation_end(self, ctx: Any) -> None:
        """Eager, after every evaluation in every mode: `ctx.logs` holds its logs
        (`<set>/<name>` for several validation sets), `ctx.step` its step. Returns None; the
        default does nothing."""

    def on_checkpoint_saved(self, ctx: Any) -> None:
        """Eager, after each checkpoint save: `ctx.checkpoint_path` is its path (written, or
        being written with async checkpoints). Returns None; the default does nothing."""


def _is_trackable(value: Any) -> bool:
    if isinstance(value, dict):  # several models or optimizers: checkpointed under their keys
        return bool(value) and all(_is_trackable(v) for v in value.values())
    return isinstance(value, tf.__internal__.tracking.Trackable)


def _class_weights(class_weight: dict | None, where: str) -> tf.Tensor | None:
    """`{class: weight}` as a float32 table indexed by class, up to the largest class given
    (those below it not given: 1.0); a mistake names `where` it was set."""
    if class_weight is None:
        return None
    if not isinstance(class_weight, dict) or not all(
        isinstance(k, int) and k >= 0 and isinstance(v, (int, float))
        for k, v in class_weight.items()
    ):
        raise ConfigError(
            "`class_weight` must be a dict {class index (int >= 0): weight (number)}; received "
            f"{class_weight!r}. Fix {where}."
        )
    table = [1.0] * (max(class_weight, default=0) + 1)
    for k, v in class_weight.items():
        table[k] = float(v)
    return tf.constant(table, tf.float32)


def _weight_of_class(table: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
    """The weight of each class in `ids` (`[batch]`) from `table` (`_class_weights`); a class
    past its end, or negative, weighs 1.0, as in Keras' `class_weight_to_sample_weights`. Traced."""
    inside = (ids >= 0) & (ids < tf.shape(table)[0])
    found = tf.gather(table, tf.clip_by_value(ids, 0, tf.shape(table)[0] - 1))
    return tf.where(inside, found, tf.ones_like(found))


def _class_ids(labels: Any) -> tf.Tensor:
    """Integer class ids of `labels`: one-hot rows (last dimension > 1) by argmax, else as
    they are, flattened to `[batch]`. Traced."""
    labels = tf.convert_to_tensor(labels)
    if labels.shape.rank is not None and labels.shape.rank >= 2 and labels.shape[-1] != 1:
        labels = tf.argmax(labels, axis=-1)
    return tf.reshape(tf.cast(labels, tf.int32), [-1])
