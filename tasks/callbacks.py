"""Host-side step callbacks: the context they receive and the seed's default callbacks.

`every_steps[N]` callbacks run after every step that is a multiple of N, `at_step[N]` ones once,
after step N. They run eagerly, in Python, between device loops (the trainer ends each device loop
exactly where a callback is due), under the train summary writer with the global step set and
summaries recorded, so a plain `tf.summary.scalar(name, value)` lands in TensorBoard.

A callback is `fn(task, ctx)` where `ctx` is a `CallbackContext`; seed-style callbacks with the
seed's 14 positional arguments are adapted by `tasks.CallbackTask`.

A callback marked `deferred` (the default `print_loss` is) reads only `ctx.step` and `ctx.logs`,
so it does not end device loops: the loop records every step's scalar logs, and after the loop
the callback runs once per step it was due at, in order, with that step's logs (`ctx.model` and
the other objects are then in their state at the end of the loop).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from orbitask.common.errors import ConfigError
from orbitask.common.setting_rules import POSITIVE_INT, require
from orbitask.tasks.scalar_batch import ScalarBatch

Callback = Callable[[Any, "CallbackContext"], None]


@dataclasses.dataclass
class CallbackContext:
    """Everything the seed passes positionally to a callback, by name.

    Attributes:
      step: the global step just completed (Python int).
      logs: the last step's train logs as Python floats (`loss`, `grad_norm`, metrics, ...).
      lr: the learning-rate `tf.Variable` (checkpointed; assigning it changes the optimizer's rate
        from the next device loop on; where a schedule sets the rate, the assignment scales the
        schedule by new / old from then on).
      optimizer, model, loss_fn: the task's built objects.
      checkpoint, manager: the `tf.train.Checkpoint` and `tf.train.CheckpointManager`.
      strategy: the `tf.distribute.Strategy` the step runs under.
      summary_writer: the train summary writer (already the default writer during the call).
      scalars: the train writer's `tasks.scalar_batch.ScalarBatch`, where a deferred
        callback's `batch` keeps scalar points written with the loop outputs; None: none kept.
      checkpoint_path: in `on_checkpoint_saved`, the checkpoint just saved; else None.
      outputs, batch, gradients, update_gradients, display_gradients: the step's model outputs,
        batch, all-reduced gradients and `update_pre`'s two results, per replica (one device:
        tensors), for a callback marked `with_step_tensors` (`tasks.step_tensors`); else None.
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
    scalars: ScalarBatch | None = None
    checkpoint_path: str | None = None
    outputs: Any = None
    batch: Any = None
    gradients: Any = None
    update_gradients: Any = None
    display_gradients: Any = None

    @property
    def loss(self) -> float | None:
        """Returns the last step's loss (global batch mean plus regularisation), eager, or None."""
        return self.logs.get("loss")

    @property
    def losses(self) -> dict[str, float]:
        """Returns every loss among the step's scalar logs (`loss_logs`). Eager."""
        return loss_logs(self.logs)


_LOSS_NAME = re.compile(r"(^|[_/])loss($|[_/])")


def loss_logs(logs: dict) -> dict[str, float]:
    """The scalar logs that are losses: `loss`, `d_loss`, `loss/digit`, ...; `loss` first, then
    by name. Eager; returns `{name: value}`."""
    names = sorted(k for k, v in logs.items() if _LOSS_NAME.search(k) and np.ndim(v) == 0)
    names.sort(key=lambda k: k != "loss")
    return {k: float(logs[k]) for k in names}


def format_losses(losses: dict[str, float]) -> str:
    """`loss 0.1, d_loss 0.6`: the losses of one step for a line of text. Eager; returns it."""
    return ", ".join(f"{name} {value:.6g}" for name, value in losses.items())


def deferred(fn: Callback, batch: Callable | None = None) -> Callback:
    """Marks `fn` as a callback that reads only `ctx.step` and `ctx.logs`; returns `fn`. Eager.

    A deferred callback never ends a device loop (which costs a loop's host work each time it
    is due): it runs after the loop, once per step it was due at, with that step's scalar logs.
    Metrics (`logs` entries computed from Keras metrics) are only there for the loop's last
    step. `batch(task, contexts)`, if given, replaces the per-step calls of one loop (e.g. to
    write all their summaries at once); it may run without a default summary writer, so it
    writes through `contexts[i].summary_writer` or keeps points in `contexts[i].scalars`. Not
    for callbacks that change the model, optimizer or learning rate: those must run at their
    exact step. A callable that takes no attributes (a bound method) comes back wrapped.
    """
    try:
        fn.deferred = True
        fn.run_batch = batch
    except AttributeError:  # a bound method, a builtin: mark a wrapper instead
        fn = _wrapped(fn)
        fn.deferred = True
        fn.run_batch = batch
    return fn


def _wrapped(fn: Callback) -> Callback:
    @functools.wraps(fn)
    def call(task: Any, ctx: CallbackContext) -> Any:
        return fn(task, ctx)

    return call


def is_deferred(fn: Callback) -> bool:
    """Whether `fn` was marked with `deferred`."""
    return bool(getattr(fn, "deferred", False))


def print_loss(task: Any, ctx: CallbackContext) -> None:
    """The seed's `every_steps[10]` default: prints the losses and writes them as summaries.

    Every loss among the step's scalar logs (`loss_logs`: `step 10: loss 0.3`, or for a GAN
    `step 10: d_loss 0.6, g_loss 0.9`). Eager, on the host; `deferred`, so it does not end
    device loops. Returns None.
    """
    del task
    losses = ctx.losses
    if not losses:
        return
    print(f"step {ctx.step}: {format_losses(losses)}", flush=True)
    for name, value in losses.items():
        tf.summary.scalar(name, value, step=ctx.step)


def _print_losses(task: Any, contexts: Sequence[CallbackContext]) -> None:
    """`print_loss` for all the steps of one device loop: one write to stdout; the summary
    points join the train writer's kept scalars (`CallbackContext.scalars`), written with the
    loop outputs."""
    del task
    points = [(c.step, c.losses) for c in contexts]
    points = [(step, losses) for step, losses in points if losses]
    if not points:
        return
    sys.stdout.write("".join(f"step {step}: {format_losses(ls)}\n" for step, ls in points))
    sys.stdout.flush()
    scalars = contexts[0].scalars  # (a worker without summaries drops what it keeps)
    if scalars is not None:
        for name in dict.fromkeys(name for _, losses in points for name in losses):
            scalars.keep(name, [(step, ls[name]) for step, ls in points if name in ls])


deferred(print_loss, batch=_print_losses)


def print_step(task: Any, ctx: CallbackContext) -> None:
    """The seed's `print_step`: prints the step (not a default here: it would end every loop).

    Eager, on the host between device loops; returns None.
    """
    del task
    print(f"step {ctx.step}", flush=True)


def as_callback_lists(table: Mapping[int, Any] | None, name: str) -> dict[int, list[Callback]]:
    """Normalises `{N: fn or [fn, ...]}` and checks that every N is a positive int.

    Raises:
      ConfigError: naming the table and the bad key or value.
    """
    out: dict[int, list[Callback]] = {}
    for key, value in (table or {}).items():
        require(
            POSITIVE_INT,
            key,
            f"`{name}` keys",
            f"Fix the `{name}` table of your Task.",
            must="must be positive integers (steps)",
        )
        fns = list(value) if isinstance(value, (list, tuple)) else [value]
        for fn in fns:
            if not callable(fn):
                raise ConfigError(f"`{name}[{key}]` must be callable; received {fn!r}.")
        if fns:
            out[key] = fns
    return out
