"""The default `train_step` and `validation_step` of a Task, composed from its stages.

`DefaultSteps` is a base of `Task` (as Keras' `Trainer` is of `Model`): its methods call the
Task's stages (`input_pre`, `loss_pre`, `grad_pre`, `update_pre`, `process_metrics`) and use its
`loss` key and `added_losses`.

Default `train_step`, per replica, inside `strategy.run` under `tf.function`::

    inputs = input_pre(batch, lr)
    outputs = model(inputs, training=True)
    loss_input = loss_pre(outputs, batch, model, lr)
    loss = loss_fn(loss_input) * example_weights(batch)  # loss_reduction "mean": x examples too
    loss_per_batch, extra_loss, trainable_vars = grad_pre(loss, outputs, batch, model, loss_fn, lr)
    scaled = sum(loss_per_batch) / count + this replica's share of extra_loss
    replica_gradients = d scaled / d trainable_vars
    process_metrics(metrics, labels, outputs)       # labels: gt of an (inputs, gt) batch
    gradients = all_reduce_sum(replica_gradients)
    update_gradients, display_gradients = update_pre(gradients, loss, outputs, batch, model,
                                                     loss_fn, lr, optimizer)
    optimizer.apply_gradients(zip(update_gradients, trainable_vars))   # applied once

`count` is `global_batch_size` for full batches, else the examples the step really has (summed
over replicas), or the sum over replicas of a fourth value `grad_pre` returns (its own count:
tokens, frames). Of `extra_loss` (`tasks.extra_losses`), terms independent of the batch are
divided by the replica count, batch means weighted by this replica's share of the examples, batch
sums taken as they are. Summed over replicas, the gradients are one device's on the whole global
batch. Under mixed_float16, `scaled` is multiplied by the loss scale before differentiation and
the gradients divided back; the loss scale and the NaN guard check the all-reduced gradients are
finite.

With gradient accumulation over K batches, the lines up to `process_metrics` run once per
micro-batch (`count` then the examples of all K, the batch-independent extra losses divided by K
times the replica count) and their gradients are summed before the single all-reduce,
`update_pre` and update.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from orbitask.common import keras_compat
from orbitask.common.errors import ConfigError
from orbitask.tasks import extra_losses, step_tensors
from orbitask.tasks import gradients as gradients_lib


def batch_size(tree: Any) -> tf.Tensor:
    """The leading dimension of the first tensor in a nested structure. Traced or eager."""
    return tf.shape(tf.nest.flatten(tree)[0])[0]


def labels_of(batch: Any) -> Any:
    """Returns a batch's labels: `gt` of an `(inputs, gt)` or `(inputs, gt, weights)` batch, else
    the batch itself (Model Garden's rule in `base_task.Task.train_step`). Eager or traced."""
    if isinstance(batch, (tuple, list)) and len(batch) in (2, 3):
        return batch[1]
    return batch


@tf.autograph.experimental.do_not_convert
def _examples(batch: Any, full: int) -> Any:
    """A replica's examples in `batch`: the Python int `full` when its leading dimension is
    statically that, else a scalar tensor (a batch that may be partial). Traced."""
    first = tf.nest.flatten(batch)[0]
    static = getattr(first, "shape", None)
    if static is not None and static.rank and static[0] == full:
        return full
    return tf.shape(first)[0]


@tf.autograph.experimental.do_not_convert
def _example_counts(parts: Any, per_part: int, context: Any) -> tuple[list, Any]:
    """`(counts, count)`: each micro-batch's examples on this replica (`_examples`) and the
    whole step's (None for full batches, else their sum over replicas). Traced."""
    counts = [_examples(part, per_part) for part in parts]
    if all(isinstance(c, int) for c in counts):
        return counts, None  # full batches: the static global batch size
    # a partial batch: the examples the step really has, on every replica
    count = tf.add_n([tf.cast(c, tf.float32) for c in counts])
    if context.num_replicas_in_sync > 1:
        count = context.all_reduce(tf.distribute.ReduceOp.SUM, count)
    return counts, count


@tf.autograph.experimental.do_not_convert
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


@tf.autograph.experimental.do_not_convert
def _scaled_loss(
    loss_per_batch: Any,
    extra_loss: Any,
    count: Any,
    part_count: Any,
    global_batch_size: int,
    once_share: float,
) -> tf.Tensor:
    """This replica's share of the step's loss, the value differentiated (before any loss
    scale): see `DefaultSteps.compute_gradients`. Traced, inside the gradient tape."""
    divisor = float(global_batch_size) if count is None else count
    if part_count is None:
        share = 1.0 / once_share
    else:
        share = tf.cast(part_count, tf.float32) / divisor
    loss_per_batch = gradients_lib.batch_sum(loss_per_batch)  # per-example or summed
    scaled = tf.cast(loss_per_batch, tf.float32) / divisor
    for term, weight in extra_losses.step_share(extra_loss, once_share, share):
        if not gradients_lib.is_python_zero(term):  # no op for no regularisation
            scaled += tf.cast(term, tf.float32) * weight
    return scaled


@tf.autograph.experimental.do_not_convert
def _update_logs(loss_key: str, scaled_sum: Any, display: list, finite: Any, replicas: int) -> dict:
    """The logs of `compute_update`: the step's loss (one device's) under `loss_key`,
    `grad_norm` of the display gradients and, where checked, `nonfinite_gradients`. Traced."""
    logs = {
        loss_key: scaled_sum * float(replicas) if replicas > 1 else scaled_sum,
        "grad_norm": gradients_lib.global_norm(display),
    }
    if finite is not None:
        logs["nonfinite_gradients"] = 1.0 - tf.cast(finite, tf.float32)
    return logs


class DefaultSteps:
    """The default steps of a `Task`: per replica, inside `strategy.run`, under tf.function."""

    # How the replicas' logs of a task's own `train_step` add up to what one device logs: "mean"
    # when each replica's value is for its own batch (Model Garden's steps, the Keras guides'
    # plain means), "sum" when each is already a share of the global batch's mean (a Keras 3
    # loss object's result, which Keras divides by the replica count under tf.distribute, or
    # `tf.nn.compute_average_loss`), or a dict of those by log key (keys not in it: "mean").
    # None: "mean", with a warning when a run has several replicas. The default step's logs are
    # one device's already, whatever this says.
    replica_logs = None

    @property
    def own_train_step(self) -> bool:
        """Whether this Task's class overrides `train_step`, owning its whole step: then the
        stages, the gradient arithmetic and the features that need `compute_update` (the NaN
        guard, float16 loss scaling, gradient accumulation) are its own. Eager; returns it."""
        return type(self).train_step is not DefaultSteps.train_step

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

        With `loss_scale` (mixed_float16) the loss is scaled up before differentiation and the
        gradients back; with it or `check_finite`, logs carry `nonfinite_gradients` (1.0 for a
        NaN or +-Inf entry of the all-reduced gradient, before `update_pre`).

        Returns `(update_gradients, trainable_vars, logs)` (the NaN guard's `check_finite`: the
        update applies only when all is finite); keeps the step's tensors (`step_tensors.keep`).
        """
        context = tf.distribute.get_replica_context()
        replicas = context.num_replicas_in_sync
        parts = batch if micro_batches > 1 else (batch,)
        per_part = global_batch_size // (replicas * micro_batches)
        counts, count = _example_counts(parts, per_part, context)
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
        step_tensors.keep(outputs=aux["outputs"], batch=batch, gradients=gradients,
                          update_gradients=update, display_gradients=display)  # fmt: skip
        logs = _update_logs(self.loss, scaled_sum, display, finite, replicas)
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
        extra losses (`tasks.extra_losses.ExtraLoss`: batch-independent terms divided by
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
        shares = context.num_replicas_in_sync * micro_batches
        with tf.GradientTape() as tape:
            inputs = self.input_pre(batch, lr)
            outputs = model(inputs, training=True)
            loss_input = self.loss_pre(outputs, batch, model, lr)
            examples = global_batch_size // shares if part_count is None else part_count
            loss = self.batch_sum(self.weighted(loss_fn(loss_input), batch), examples)
            loss_per_batch, extra_loss, trainable_vars, *own = self.grad_pre(
                loss, outputs, batch, model, loss_fn, lr
            )
            if own:  # the stage's own count (tokens, frames)
                part_count, count = _own_count(own[0], micro_batches, context)
            scaled = _scaled_loss(
                loss_per_batch, extra_loss, count, part_count, global_batch_size, float(shares)
            )
            # mixed_float16: differentiate the scaled-up loss so float16 gradients don't underflow
            target = scaled if loss_scale is None else scaled * loss_scale
        gradients = tape.gradient(target, trainable_vars)
        if loss_scale is not None:  # mixed_float16: scale the gradients back down
            gradients = gradients_lib.unscale(gradients, loss_scale)
        self.process_metrics(metrics, labels_of(batch), outputs)
        return gradients, trainable_vars, {"loss": loss, "outputs": outputs, "scaled_loss": scaled}

    def weighted(self, loss: Any, batch: Any) -> Any:
        """Returns the per-example losses times the batch's `example_weights` (None: `loss`
        unchanged). Traced, per replica; the check before step 1 refuses weights on a scalar
        loss."""
        weights = self.example_weights(batch)
        if weights is None:
            return loss
        return loss * tf.cast(tf.reshape(weights, [-1]), loss.dtype)

    def batch_sum(self, loss: Any, examples: Any) -> Any:
        """Returns `loss` as a sum over this replica's `examples`: under `loss_reduction =
        "mean"` a scalar times `examples`; otherwise `loss` unchanged. Traced, per replica."""
        if getattr(self, "loss_reduction", "sum") != "mean" or not tf.is_tensor(loss):
            return loss
        if loss.shape.rank != 0:
            return loss
        return loss * tf.cast(examples, loss.dtype)

    def validation_step(
        self, batch: Any, model: Any, metrics: list | None = None, *, loss_fn: Any, lr: Any
    ) -> dict[str, tf.Tensor]:
        """Forward pass and loss on one replica's batch; updates `metrics`. Traced by tf.function.

        Returns `{"loss": sum over the batch, "num_examples": batch size}`; the default
        `aggregate_logs` sums these over replicas and steps, `reduce_aggregated_logs` divides.
        """
        inputs = self.input_pre(batch, lr)
        outputs = model(inputs, training=False)
        loss = self.weighted(loss_fn(self.loss_pre(outputs, batch, model, lr)), batch)
        loss = self.batch_sum(loss, batch_size(inputs))  # under loss_reduction "mean"
        self.process_metrics(metrics, labels_of(batch), outputs)
        return {
            self.loss: tf.cast(gradients_lib.batch_sum(loss), tf.float32),
            "num_examples": tf.cast(batch_size(inputs), tf.float32),
        }
