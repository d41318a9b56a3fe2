"""Checks that run batches through the task's stages before the first step: the first batch
of each validation set through `validation_step`, and whether a scalar loss is a mean or a sum;
and the one line a TensorFlow error becomes in their messages.

Each failure is a one-line `ConfigError` naming the Task method to fix, raised before any
training; an error of the user's own code keeps its traceback, with a note.
"""

from __future__ import annotations

import re
from typing import Any

import tensorflow as tf

from orbitask.common.errors import one_line
from orbitask.tasks import step_signature
from orbitask.tasks.base import Task
from orbitask.trainers.distribution import cluster
from orbitask.trainers.engine import user_code
from orbitask.trainers.errors import ConfigError
from orbitask.trainers.run import dry_step


def describe(spec: Any) -> str:
    """Returns a structure of tensor specs as text, each leaf `dtype[shape]`, e.g.
    `(float32[8, 6], int32[8])`. Eager."""

    def one(s):
        return f"{s.dtype.name}{list(s.shape)}" if hasattr(s, "shape") else type(s).__name__

    return str(tf.nest.map_structure(one, spec)).replace("'", "")


def check_first_eval_batches(task: Any, strategy: Any, datasets: Any, objects: Any) -> None:
    """The first batch of each validation set, read for real, through the default
    `validation_step` (input_pre, the model, loss_pre, the loss and the metrics) on every replica,
    once, before the first training step. Eager; returns None, the metrics reset.

    A task whose `validation_step` is its own owns its batch, and `parameter_server` evaluates
    on the coordinator: nothing is checked there. A wrong shape or a label out of range is then
    found before any training, not at the first evaluation.

    Raises:
      ConfigError: naming `build_inputs(training=False)` (and the set) when its batch does not
        fit; an error of the user's own code keeps its traceback, with a note.
    """
    kind = type(task)
    if kind.validation_step is not Task.validation_step or cluster.is_parameter_server(strategy):
        return
    sets = datasets.items() if isinstance(datasets, dict) else [(None, datasets)]
    metrics = objects.eval_metrics

    @tf.function
    def first_step(batch):
        def replica_step(batch):
            return step_signature.validation_step(
                task, batch, objects.model, metrics, loss_fn=objects.loss_fn, lr=objects.lr
            )

        return strategy.run(replica_step, args=(batch,))

    for name, dataset in sets:
        where = f"{kind.__name__}.build_inputs(training=False)"
        if name is not None:
            where += f"'s validation set {name!r}"
        iterator = iter(dataset)
        try:
            batch = next(iterator)
        except (StopIteration, tf.errors.OutOfRangeError):
            continue  # an empty set: refused by the first evaluation, in one line
        try:
            with dry_step.taken_back(task, objects.model, objects.loss_fn):
                first_step(batch)
        except Exception as e:  # noqa: BLE001 -- one raised inside TF/Keras is a data mismatch
            if user_code.raised_by_users_code(e):
                e.add_note(
                    f"orbitask: raised by the check before the first step, which runs the first "
                    f"batch of {where} through validation_step."
                )
                raise
            local = tf.nest.map_structure(
                lambda v: strategy.experimental_local_results(v)[0], batch
            )  # one replica's share
            shown = f" ({describe(tf.nest.map_structure(tf.type_spec_from_value, local))})"
            raise ConfigError(
                f"the first batch of {where}{shown} does not fit the model, loss and metrics: "
                f"{type(e).__name__}: {reason(e)}"
            ) from e
        finally:
            for metric in metrics:
                metric.reset_state()


_ROOT = re.compile(r"^\s*\(\d+\) [A-Z_]+:\s*(.+)$")  # TensorFlow's "(0) INVALID_ARGUMENT: ..."
_RAISED = re.compile(r"^\s*[\w.]*(?:Error|Exception): (.+)$")
_STACK = ("Graph execution error", "Detected at node", "Traceback", "in user code", "[[", "File ")


def without_values(text: str) -> str:
    """`text` with the values of the eager tensors it prints left out (`<tf.Tensor: shape=...,
    dtype=...>`), which can fill a screen."""
    return re.sub(r",\s*numpy=[^>]*>", ">", text)


def outputs_for_the_loss(task: Any, outputs: Any, error: BaseException, where: str) -> None:
    """After the loss failed on the model's `outputs`: several outputs (a dict, a list) under the
    default `loss_pre`, which hands them to the loss as they are, are named as the cause.

    Raises:
      ConfigError: naming `loss_pre`, when that is so; else returns None.
    """
    if tf.is_tensor(outputs) or type(task).loss_pre is not Task.loss_pre:
        return
    name = type(task).__name__
    raise ConfigError(
        f"{name}'s model returns {describe(outputs)}, and the default loss_pre hands the outputs "
        f"to the loss as they are, which cannot take them ({type(error).__name__} on a batch "
        f"from {name}.{where}): override loss_pre to return what the loss takes, e.g. "
        "`return outputs['logits'], batch[1]`."
    ) from error


def reason(error: BaseException, limit: int = 300) -> str:
    """What `error` says went wrong, without the stack TensorFlow's and autograph's messages
    carry: its first root error (several replicas), else the last `...Error: text` line inside
    it, else its last line that is not part of a stack. Eager; returns one line."""
    lines = str(error).splitlines()
    roots = [m.group(1) for line in lines if (m := _ROOT.match(line))]
    if roots:
        return one_line(roots[0], limit)
    raised = [i for i, line in enumerate(lines) if _RAISED.match(line)]
    if raised:
        text = _RAISED.match(lines[raised[-1]]).group(1)
        if text.startswith("Exception encountered when calling"):  # Keras: the cause follows
            after = [x for x in lines[raised[-1] + 1 :] if x.strip()]
            text = after[0] if after else text
        return one_line(text, limit)
    plain = [x for x in lines if x.strip() and not x[0].isspace() and not x.startswith(_STACK)]
    return one_line(plain[-1] if plain else error, limit)


def check_not_a_mean(task: Any, objects: Any, outputs: Any, batch: Any, where: str) -> None:
    """Refuses a scalar loss that is a plain mean over the batch under `loss_reduction` "sum"
    (`objects`: a `steps.RunObjects`). The loss of the batch and that of the batch
    (outputs and labels) twice over agree for a mean, where a sum doubles (a Keras 3 loss
    object's mean is a mean). Eager (one
    tf.function); returns None; a loss that cannot take the doubled batch, or is 0, is not
    judged."""
    name = type(task).__name__
    reduction = getattr(task, "loss_reduction", "sum")
    if reduction not in ("sum", "mean"):
        raise ConfigError(f"{name}.loss_reduction must be 'sum' or 'mean'; received {reduction!r}.")
    if reduction == "mean":
        return
    model, loss_fn, lr = objects.model, objects.loss_fn, objects.lr
    twice = tf.nest.map_structure(lambda t: tf.concat([t, t], 0), (outputs, batch))

    @tf.function
    def losses():
        def replica(outputs, batch, twice):
            once = loss_fn(task.loss_pre(outputs, batch, model, lr))
            doubled = loss_fn(task.loss_pre(*twice, model, lr))
            return tf.cast(once, tf.float64), tf.cast(doubled, tf.float64)

        strategy = tf.distribute.get_strategy()
        results = strategy.run(replica, args=(outputs, batch, twice))
        return tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0], results)

    try:
        once, doubled = (float(v) for v in losses())
    except Exception:  # noqa: BLE001 -- a loss that cannot take the doubled batch is not judged
        return
    if once == 0.0 or abs(doubled - once) > 1e-6 * abs(once):
        return
    size = objects.global_batch_size
    raise ConfigError(
        f"{name}'s loss is a mean over the batch (it gives the same value for a batch from "
        f"{name}.{where} and for that batch twice over); the default step divides the loss by "
        f"global_batch_size, so a mean would train with a 1/{size} gradient. Return per-example "
        f"losses (a Keras loss with reduction='none') or their sum from build_losses, or set "
        f"loss_reduction = 'mean' on {name}."
    )
