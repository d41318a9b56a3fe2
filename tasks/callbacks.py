"""Host-side step callbacks: the context they receive and the seed's default callbacks.

`every_steps[N]` callbacks run after every step that is a multiple of N, `at_step[N]` ones once,
after step N. They run eagerly, in Python, between device loops (the trainer ends each device loop
exactly where a callback is due), under the train summary writer with the global step set and
summaries recorded, so a plain `tf.summary.scalar(name, value)` lands in TensorBoard.

A callback is `fn(task, ctx)` where `ctx` is a `CallbackContext`; seed-style callbacks with the
seed's 14 positional arguments are adapted by `tasks.CallbackTask`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import tensorflow as tf

Callback = Callable[[Any, "CallbackContext"], None]


@dataclasses.dataclass
class CallbackContext:
    """Everything the seed passes positionally to a callback, by name.

    Attributes:
      step: the global step just completed (Python int).
      logs: the last step's train logs as Python floats (`loss`, `grad_norm`, metrics, ...).
      lr: the learning-rate `tf.Variable` (checkpointed; assigning it changes the optimizer's rate
        from the next device loop on).
      optimizer, model, loss_fn: the task's built objects.
      checkpoint, manager: the `tf.train.Checkpoint` and `tf.train.CheckpointManager`.
      strategy: the `tf.distribute.Strategy` the step runs under.
      summary_writer: the train summary writer (already the default writer during the call).
    """

    step: int
    logs: Mapping[str, float]
    lr: tf.Variable
    optimizer: Any
    model: Any
    loss_fn: Any
    checkpoint: tf.train.Checkpoint
    manager: tf.train.CheckpointManager
    strategy: tf.distribute.Strategy
    summary_writer: Any = None

    @property
    def loss(self) -> float | None:
        """Returns the last step's loss (global batch mean plus regularisation), eager, or None."""
        return self.logs.get("loss")


def print_loss(task: Any, ctx: CallbackContext) -> None:
    """The seed's `every_steps[10]` default: prints the loss and writes it as a scalar summary.

    Eager, on the host between device loops; returns None.
    """
    del task
    if ctx.loss is None:
        return
    print(f"step {ctx.step}: loss {ctx.loss:.6g}", flush=True)
    tf.summary.scalar("loss", ctx.loss, step=ctx.step)


def print_step(task: Any, ctx: CallbackContext) -> None:
    """The seed's `print_step`: prints the step (not a default here: it would end every loop).

    Eager, on the host between device loops; returns None.
    """
    del task
    print(f"step {ctx.step}", flush=True)


def as_callback_lists(table: Mapping[int, Any] | None, name: str) -> dict[int, list[Callback]]:
    """Normalises `{N: fn or [fn, ...]}` and checks that every N is a positive int.

    Raises:
      ValueError: naming the table and the bad key.
    """
    out: dict[int, list[Callback]] = {}
    for key, value in (table or {}).items():
        if isinstance(key, bool) or not isinstance(key, int) or key < 1:
            raise ValueError(
                f"`{name}` keys must be positive integers (steps); received {key!r}. "
                f"Fix the `{name}` table of your Task."
            )
        fns = list(value) if isinstance(value, (list, tuple)) else [value]
        for fn in fns:
            if not callable(fn):
                raise TypeError(f"`{name}[{key}]` must be callable; received {fn!r}.")
        if fns:
            out[key] = fns
    return out
