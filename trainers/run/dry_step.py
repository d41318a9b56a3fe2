"""The calls before step 1, taken back: the checks' batches, and the step that builds weights.

The checks before step 1 run the task's code on zeros shaped like its batches (`preflight`,
`batch_checks`). A task whose `train_step` is its own calls its model in its own way, so a model
that has no weights until its first call is built by one eager `train_step` on zeros, on every
replica, with the optimizer's updates skipped (`build_weights`). Inside `taken_back`, whatever
these calls changed is put back on exit: the random state of the task, its model and its loss
(Keras 3 `SeedGenerator`s, generators behind tf_keras layers, `tf.random.Generator`s) and every
variable they created, BatchNorm's moving statistics included, which hold their initial values
again. Step 1 then draws and normalises as if it were the first call. (The trainer resets
metrics before each loop.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from orbitask.tasks import step_signature
from orbitask.trainers.run.saved_model import zeros
from orbitask.trainers.state import random_state


class _NoUpdate:
    """Stands in for an optimizer during a dry step: updates are skipped, the rest is its own."""

    def __init__(self, optimizer: Any):
        self._optimizer = optimizer

    def apply_gradients(self, *args, **kwargs) -> None:
        del args, kwargs

    apply = minimize = apply_gradients

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optimizer, name)


def build_weights(task: Any, strategy: Any, spec: Any, batch_size: int, objects: Any) -> None:
    """Builds the model's weights with one dry `train_step` of `task` on zeros shaped as `spec`
    (`batch_size` a replica). Eager, inside `taken_back`; returns None.

    `objects` holds the model, loss, learning rate, optimizer, metrics and global batch size
    (`steps.RunObjects`). An error in the step keeps its traceback, with a note.
    """
    optimizer = objects.optimizer
    stand_in = (
        {k: _NoUpdate(v) for k, v in optimizer.items()}
        if isinstance(optimizer, dict)
        else _NoUpdate(optimizer)
    )

    def dry_step(batch):
        return step_signature.train_step(
            task,
            batch,
            objects.model,
            stand_in,
            objects.train_metrics,
            loss_fn=objects.loss_fn,
            lr=objects.lr,
            global_batch_size=objects.global_batch_size,
        )

    try:
        strategy.run(dry_step, args=(zeros(spec, batch_size),))
    except Exception as e:
        e.add_note(
            "orbitask: raised by one dry train_step on a batch of zeros, which builds the weights "
            "of a model without an Input layer (give it one to skip this)."
        )
        raise


@contextlib.contextmanager
def taken_back(task: Any, model: Any, loss_fn: Any) -> Iterator[None]:
    """While open, the checks before step 1 call the task's code; on exit, the random state
    of `task`, `model` and `loss_fn` is put back where it was, and every variable created
    eagerly inside holds its initial value again (one a traced function creates is left). Eager."""
    roots = {"task": task, "model": model, "loss": loss_fn}
    kept = [(v, tf.identity(v)) for v in _random_variables(roots)]

    def keep_initial(next_creator, **kwargs):
        variable = next_creator(**kwargs)
        if tf.executing_eagerly():
            kept.append((variable, tf.identity(variable)))
        return variable

    with tf.variable_creator_scope(keep_initial):
        yield
    for variable, value in kept:
        variable.assign(value)


def _random_variables(roots: dict[str, Any]) -> list:
    """The variables of the random state under `roots` (`random_state.find`)."""
    saved, _ = random_state.find(roots)
    # a Keras 3 SeedGenerator's state variable, or a tf.random.Generator's
    return [
        state.state if isinstance(state, tf.random.Generator) else state for state in saved.values()
    ]
