"""The `Task` base class: builders, the seed's step stages and the default train/validation steps.

A Task holds model and data logic only. The trainer (`trainers`) owns the global step, the
learning-rate variable, checkpoints and summaries, and drives a Task only through these methods.

Default `train_step`, per replica, inside `strategy.run` under `tf.function`::

    inputs = input_pre(batch, lr)
    outputs = model(inputs, training=True)
    loss_input = loss_pre(outputs, batch, model, lr)
    loss = loss_fn(loss_input)
    loss_per_batch, extra_loss, trainable_vars = grad_pre(loss, outputs, batch, model, loss_fn, lr)
    scaled = loss_per_batch / global_batch_size + extra_loss / num_replicas
    process_metrics(metrics, labels, outputs)       # labels: gt of an (inputs, gt) batch
    gradients = all_reduce_sum(d scaled / d trainable_vars)
    update_gradients, display_gradients = update_pre(gradients, loss, outputs, batch, model,
                                                     loss_fn, lr, optimizer)
    optimizer.apply_gradients(zip(update_gradients, trainable_vars))   # applied once

With gradient accumulation over K batches, the lines up to `process_metrics` run once per
micro-batch (with `global_batch_size` and the extra-loss divisor both K times larger) and their
gradients are summed before the single all-reduce, `update_pre` and update.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gin
import tensorflow as tf

from orbitask.tasks import callbacks as callbacks_lib
from orbitask.tasks import eval_logs, keras_compat, setting_rules
from orbitask.tasks import gradients as gradients_lib
from orbitask.tasks.errors import ConfigError, MissingBuilder


def _batch_size(tree: Any) -> tf.Tensor:
    """The leading dimension of the first tensor in a nested structure."""
    return tf.shape(tf.nest.flatten(tree)[0])[0]


def _examples(batch: Any, full: int) -> Any:
    """A replica's examples in `batch`: the Python int `full` when its leading dimension is
    statically that, else a scalar tensor (a batch that may be partial). Traced."""
    first = tf.nest.flatten(batch)[0]
    static = getattr(first, "shape", None)
    if static is not None and static.rank and static[0] == full:
        return full
    return tf.shape(first)[0]


def _own_count(count: Any, micro_batches: int, context: Any) -> tuple[Any, Any]:
    """`(this replica's count, the sum over replicas)` of a count that `grad_pre` returned."""
    if micro_batches > 1:
        raise ConfigError(
            "grad_pre returned its own count, which gradient accumulation does not support: "
            "return three values, or set orbitask.run_experiment.gradient_accumulation_steps = 1."
        )
    count = tf.stop_gradient(tf.cast(count, tf.float32))
    if context.num_replicas_in_sync == 1:
        return count, count
    return count, context.all_reduce(tf.distribute.ReduceOp.SUM, count)


def labels_of(batch: Any) -> Any:
    """Returns a batch's labels: `gt` of an `(inputs, gt)` pair, else the batch itself (Model
    Garden's rule in `base_task.Task.train_step`). Eager or traced."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[1]
    return batch


@gin.configurable("Task", module="orbitask")
class Task:
    """Base class of every orbitask task. Subclass it and override what is unusual.

    Required: `build_inputs`, `build_model`, `build_losses`. Everything else has the seed's default.
    `loss` (class attribute, "loss" as in Model Garden) is the key of the loss in the step logs.

    Args:
      clip_norm: global-norm clipping of the all-reduced gradient in the default `update_pre`
        (None disables clipping). Seed default 10.
      optimizer_epsilon: epsilon of the default Nadam optimizer. Seed default 1e-3.
      max_to_keep: checkpoints kept by the default `build_checkpoint`. Seed default 50.
      keras_flavour: "keras" (Keras 3, `tf.keras`) or "tf_keras"; None follows the built model.
      train_prefetch: steps of training input prefetched (each step's elements: one per replica,
        times the gradient accumulation) where `build_inputs` (or `make_batches`) ends it with
        `prefetch(tf.data.AUTOTUNE)`: every checkpoint saves that buffer, and an autotuned one
        grows without bound. Default 4; None keeps the autotuned buffer.
      train_prefetch_bytes: at most this many bytes of prefetched elements, but at least one
        step's. Default 64 MiB; None: no byte bound. Sizes come from the element spec (unknown
        sizes: no bound).
      name: a name for logs.
    """

    loss = "loss"  # the loss's key in train and validation logs (Model Garden's `Task.loss`)

    # How a term that a layer adds with `add_loss` in `call` (not an activity regulariser, not
    # a weight regulariser) depends on the replica's batch, so N replicas count it as one device
    # with the whole batch: "batch_sum" (a sum over the batch, as the Keras guides' layers add),
    # "batch_mean" (a mean over the batch) or "once" (independent of the batch).
    added_losses = "batch_sum"

    def __init__(
        self,
        clip_norm: float | None = 10.0,
        optimizer_epsilon: float = 1e-3,
        max_to_keep: int = 50,
        keras_flavour: str | None = None,
        train_prefetch: int | None = 4,
        train_prefetch_bytes: int | None = 64 * 2**20,
        name: str | None = None,
    ):
        setting_rules.check(
            "Task",
            dict(
                clip_norm=clip_norm,
                optimizer_epsilon=optimizer_epsilon,
                max_to_keep=max_to_keep,
                train_prefetch=train_prefetch,
                train_prefetch_bytes=train_prefetch_bytes,
            ),
        )
        if keras_flavour not in (None, *keras_compat.FLAVOURS):
            raise ConfigError(
                f"`keras_flavour` must be None, 'keras' or 'tf_keras'; received {keras_flavour!r}."
            )
        self.clip_norm = clip_norm
        self.optimizer_epsilon = optimizer_epsilon
        self.max_to_keep = max_to_keep
        self.keras_flavour = keras_flavour
        self.train_prefetch = train_prefetch
        self.train_prefetch_bytes = train_prefetch_bytes
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
        """Returns `(checkpoint, manager)` saving every trackable given, keeping `max_to_keep`.

        Eager, once, in strategy scope.
        """
        kept = {k: v for k, v in trackables.items() if _is_trackable(v)}
        checkpoint = tf.train.Checkpoint(**kept)
        manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=self.max_to_keep)
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
        """Returns the model input (seed default: the first of an `(inputs, gt)` batch).

        Traced by tf.function, per replica (train and validation steps).
        """
        del lr
        inputs, _ = batch
        return inputs

    def loss_pre(self, outputs: Any, batch: Any, model: Any, lr: Any) -> Any:
        """Returns the loss input (seed default: `(outputs, gt)`). Traced by tf.function."""
        del model, lr
        _, gt = batch
        return outputs, gt

    def grad_pre(self, loss, outputs, batch, model, loss_fn, lr):
        """Returns `(loss_per_batch, extra_loss, trainable_vars)` (seed default: model.losses).

        Traced by tf.function, per replica, inside the gradient tape. The default `extra_loss`
        is a `tasks.keras_compat.ExtraLoss`: `model.losses` sorted by how they depend on the
        batch (weight regularisers once, activity regularisers as means, other `add_loss`
        terms as `added_losses` says), so that N replicas count them as one device does. A
        plain tensor or number counts once per step. An override may return a fourth value:
        the count this replica's loss is normalised by (tokens, frames; default its examples).
        """
        del outputs, batch, loss_fn, lr
        extra_loss = keras_compat.extra_losses(model, self.added_losses)
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

    # Steps: per replica, inside `strategy.run`, under tf.function.

    # How the replicas' `train_step` logs combine into the step's logs, so that N replicas report
    # what one device reports: "mean" when each replica's value is for its own batch (Model
    # Garden steps, the default step), "sum" when each is already a share of the global batch's
    # mean (TensorFlow's custom-training tutorial: `tf.nn.compute_average_loss`). None (the
    # default): "mean" for the default step; for a task's own `train_step`, the logs computed
    # from a Keras 3 loss object's result (which Keras divides by the replica count under
    # tf.distribute) or from `tf.nn.compute_average_loss` are summed, the others averaged.
    replica_logs = None

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
        """One optimizer update composed from the stages (see the module docstring).

        Traced by tf.function, per replica, inside `strategy.run`.

        Returns logs whose values the trainer averages over replicas: `loss` (the global batch's
        mean loss plus regularisation, as one device would compute it) and `grad_norm` (global norm
        of the display gradients).
        """
        update, trainable_vars, logs = self.compute_update(
            batch,
            model,
            optimizer,
            metrics,
            loss_fn=loss_fn,
            lr=lr,
            global_batch_size=global_batch_size,
        )
        keras_compat.apply_gradients(optimizer, update, trainable_vars)
        return logs

    def compute_update(
        self,
        batch: Any,
        model: Any,
        optimizer: Any,
        metrics: list | None = None,
        *,
        loss_fn: Any,
        lr: tf.Variable,
        global_batch_size: int,
        micro_batches: int = 1,
        loss_scale: Any = None,
        check_finite: bool = False,
    ) -> tuple[list, list, dict[str, tf.Tensor]]:
        """The default train step up to, not including, `apply_gradients`. Traced by tf.function.

        With `micro_batches` K > 1, `batch` is a tuple of K per-replica batches whose gradients
        are summed before the all-reduce (gradient accumulation: one update per K batches, equal
        to one batch K times larger); `global_batch_size` is then the examples of all K.

        With `loss_scale` (mixed_float16), the loss is scaled up before differentiation and the
        gradients scaled back. With `loss_scale` or `check_finite`, logs carry
        `nonfinite_gradients` (1.0 when an entry is NaN or +-Inf), checked on the all-reduced
        gradient before `update_pre`.

        Returns `(update_gradients, trainable_vars, logs)`. The trainer's NaN guard calls this
        with `check_finite=True` and applies the update only when every replica's loss and the
        all-reduced gradient are finite.
        """
        context = tf.distribute.get_replica_context()
        replicas = context.num_replicas_in_sync
        parts = batch if micro_batches > 1 else (batch,)
        per_part = global_batch_size // (replicas * micro_batches)
        counts = [_examples(part, per_part) for part in parts]
        if all(isinstance(c, int) for c in counts):
            count = None  # full batches: the static global batch size
        else:  # a partial batch: the examples the step really has, on every replica
            count = tf.add_n([tf.cast(c, tf.float32) for c in counts])
            if replicas > 1:
                count = context.all_reduce(tf.distribute.ReduceOp.SUM, count)
        total, scaled_sum = None, None
        for part, part_count in zip(parts, counts, strict=True):  # unrolled: K is small
            gradients, trainable_vars, aux = self.compute_gradients(
                part,
                model,
                metrics,
                loss_fn=loss_fn,
                lr=lr,
                global_batch_size=global_batch_size,
                micro_batches=micro_batches,
                loss_scale=loss_scale,
                count=count,
                part_count=part_count,
            )
            scaled = aux["scaled_loss"]
            scaled_sum = scaled if scaled_sum is None else scaled_sum + scaled
            total = gradients_lib.add(total, gradients)
        gradients = gradients_lib.all_reduce_sum(total)
        # A non-finite entry: the NaN guard skips the update; float16 overflow lowers the scale
        check = loss_scale is not None or check_finite
        finite = gradients_lib.all_finite(gradients) if check else None
        update, display = self.update_pre(
            gradients, aux["loss"], aux["outputs"], part, model, loss_fn, lr, optimizer
        )
        logs = {
            self.loss: scaled_sum * float(replicas) if replicas > 1 else scaled_sum,
            "grad_norm": gradients_lib.global_norm(display),
        }
        if finite is not None:
            logs["nonfinite_gradients"] = 1.0 - tf.cast(finite, tf.float32)
        return update, trainable_vars, logs

    def compute_gradients(
        self,
        batch: Any,
        model: Any,
        metrics: list | None = None,
        *,
        loss_fn: Any,
        lr: tf.Variable,
        global_batch_size: int,
        micro_batches: int = 1,
        loss_scale: Any = None,
        count: Any = None,
        part_count: Any = None,
    ) -> tuple[list, list, dict[str, Any]]:
        """This replica's gradients of its share of the loss, before any all-reduce.

        Traced by tf.function, per replica.

        The differentiated value is `loss_per_batch / count` plus this replica's share of the
        extra losses (`tasks.keras_compat.ExtraLoss`: batch-independent terms divided by
        `num_replicas * micro_batches`, batch means weighted by `part_count / count`, batch sums
        as they are; a plain `extra_loss` counts once), so summing over replicas and
        micro-batches gives the gradient one device would compute on the whole global batch.
        `count` is the examples of the whole step (all replicas and micro-batches; None: the
        `global_batch_size` of full batches), `part_count` this batch's (None: a full one's).
        A `grad_pre` that returns a fourth value, its own count, is normalised by the sum of
        those over replicas instead.

        Returns `(gradients, trainable_vars, aux)`, aux holding `loss`, `outputs` and
        `scaled_loss`. Updates `metrics`.
        """
        context = tf.distribute.get_replica_context()
        replicas = context.num_replicas_in_sync
        once_share = float(replicas * micro_batches)
        with tf.GradientTape() as tape:
            inputs = self.input_pre(batch, lr)
            outputs = model(inputs, training=True)
            loss_input = self.loss_pre(outputs, batch, model, lr)
            loss = loss_fn(loss_input)
            if keras_compat.is_global_share(loss):  # a Keras 3 mean: the replica's mean / replicas
                full = global_batch_size // (replicas * micro_batches)
                examples = full if part_count is None else part_count
                loss = loss * tf.cast(replicas * examples, loss.dtype)
            loss_per_batch, extra_loss, trainable_vars, *own = self.grad_pre(
                loss, outputs, batch, model, loss_fn, lr
            )
            if own:  # the stage's own count (tokens, frames)
                part_count, count = _own_count(own[0], micro_batches, context)
            divisor = float(global_batch_size) if count is None else count
            if part_count is None:
                share = 1.0 / once_share
            else:
                share = tf.cast(part_count, tf.float32) / divisor
            loss_per_batch = gradients_lib.batch_sum(loss_per_batch)  # per-example or summed
            scaled = tf.cast(loss_per_batch, tf.float32) / divisor
            if isinstance(extra_loss, keras_compat.ExtraLoss):
                terms = (
                    (extra_loss.once, 1.0 / once_share),
                    (extra_loss.batch_mean, share),
                    (extra_loss.batch_sum, 1.0),
                )
            else:
                terms = ((extra_loss, 1.0 / once_share),)
            for term, weight in terms:
                if not gradients_lib.is_python_zero(term):  # no op for no regularisation
                    scaled += tf.cast(term, tf.float32) * weight
            # mixed_float16: differentiate the scaled-up loss so float16 gradients don't underflow
            target = scaled if loss_scale is None else scaled * loss_scale
        gradients = tape.gradient(target, trainable_vars)
        if loss_scale is not None:  # mixed_float16: scale the gradients back down
            gradients = gradients_lib.unscale(gradients, loss_scale)
        self.process_metrics(metrics, labels_of(batch), outputs)
        return gradients, trainable_vars, {"loss": loss, "outputs": outputs, "scaled_loss": scaled}

    def validation_step(
        self, batch: Any, model: Any, metrics: list | None = None, *, loss_fn: Any, lr: Any
    ) -> dict[str, tf.Tensor]:
        """Forward pass and loss on one replica's batch; updates `metrics`. Traced by tf.function.

        Returns `{"loss": sum over the batch, "num_examples": batch size}`; the default
        `aggregate_logs` sums these over replicas and steps, `reduce_aggregated_logs` divides.
        """
        inputs = self.input_pre(batch, lr)
        outputs = model(inputs, training=False)
        loss = loss_fn(self.loss_pre(outputs, batch, model, lr))
        if keras_compat.is_global_share(loss):  # a Keras 3 mean: the replica's mean / replicas
            replicas = tf.distribute.get_replica_context().num_replicas_in_sync
            loss = loss * tf.cast(replicas * _batch_size(inputs), loss.dtype)
        self.process_metrics(metrics, labels_of(batch), outputs)
        return {
            self.loss: tf.cast(gradients_lib.batch_sum(loss), tf.float32),
            "num_examples": tf.cast(_batch_size(inputs), tf.float32),
        }

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


def _is_trackable(value: Any) -> bool:
    if isinstance(value, dict):  # several models or optimizers: checkpointed under their keys
        return bool(value) and all(_is_trackable(v) for v in value.values())
    return isinstance(value, tf.__internal__.tracking.Trackable)
