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
import re
import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorboard.plugins.scalar import metadata as scalar_metadata

from orbitask.tasks.errors import ConfigError

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
    writes through `contexts[i].summary_writer` (e.g. with `keep_scalars`). Not for callbacks
    that change the model, optimizer or learning rate: those must run at their exact step.
    """
    fn.deferred = True
    fn.run_batch = batch
    return fn


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
    points join the writer's kept scalars (`keep_scalars`), written with the loop outputs."""
    del task
    points = [(c.step, c.losses) for c in contexts]
    points = [(step, losses) for step, losses in points if losses]
    if not points:
        return
    sys.stdout.write("".join(f"step {step}: {format_losses(ls)}\n" for step, ls in points))
    sys.stdout.flush()
    writer = contexts[0].summary_writer  # (a worker without summaries drops what it keeps)
    if writer is not None:
        for name in dict.fromkeys(name for _, losses in points for name in losses):
            keep_scalars(writer, name, [(step, ls[name]) for step, ls in points if name in ls])


deferred(print_loss, batch=_print_losses)

_SCALAR_WRITERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # writer -> {tag: [(step, v)]}
_TAKEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # writer -> {tag: last point}
_METADATA: dict[str, bytes] = {}


def keep_scalars(writer: Any, tag: str, points: Sequence[tuple[int, float]]) -> None:
    """Keeps scalar points `(step, value)` of `tag` for `writer` until `write_kept_scalars`.

    Eager; returns None. A traced write costs far more per call than per point, so the
    trainer's summaries and `print_loss` keep their points and write them every few loops.
    A point equal to the tag's last one (the loop's `loss`, kept by both the summaries and
    `print_loss`), kept or already taken for writing, is not kept twice.
    """
    kept = _KEPT.setdefault(writer, {}).setdefault(tag, [])
    last = kept[-1] if kept else _TAKEN.get(writer, {}).get(tag)
    for point in points:
        if point != last:
            kept.append(point)
            last = point


def write_kept_scalars(writer: Any, write: bool = True) -> bool:
    """Writes every point kept for `writer`, all tags in one traced call (or, with
    `write=False`, drops them: a worker that keeps no summaries). Eager.

    Returns whether anything was written.
    """
    kept = take_kept_scalars(writer)
    if not write or kept is None:
        return False
    write_points(writer, *kept)
    return True


def take_kept_scalars(writer: Any) -> tuple[list, list, list] | None:
    """Removes and returns the points kept for `writer` as `(tags, steps, values)`, or None.

    Host only; `write_points` writes them (possibly on another thread).
    """
    kept = _KEPT.pop(writer, {})
    if not kept:
        return None
    taken = _TAKEN.setdefault(writer, {})
    taken.update({tag: points[-1] for tag, points in kept.items() if points})
    tags, steps, values = [], [], []
    for tag, points in sorted(kept.items()):
        for step, value in points:
            tags.append(tag)
            steps.append(step)
            values.append(value)
    return tags, steps, values


def write_scalars(writer: Any, tag: str, steps: Sequence[int], values: Sequence[float]) -> None:
    """Writes `values[i]` at `steps[i]` as scalar summaries `tag` into `writer`. Eager.

    One traced call for all points, traced once per writer: tags, their metadata and the number
    of points are inputs, so it is much cheaper than one eager `tf.summary.scalar` a point.
    Zero points write nothing, which makes a call with none a warm-up. Returns None.
    """
    write_points(writer, [tag] * len(steps), steps, values)


def write_points(
    writer: Any, tags: Sequence[str], steps: Sequence[int], values: Sequence[float]
) -> None:
    """Writes scalar `values[i]` of `tags[i]` at `steps[i]` into `writer`: one traced call.

    Eager; returns None. Safe on a thread other than the training loop's (the writer resource
    serializes its writes); the first call for a writer traces, so make it on one thread.
    """
    fn = _SCALAR_WRITERS.get(writer)
    if fn is None:

        @tf.function(
            input_signature=[
                tf.TensorSpec([None], tf.string),
                tf.TensorSpec([None], tf.int64),
                tf.TensorSpec([None], tf.float32),
                tf.TensorSpec([None], tf.string),
            ]
        )
        def fn(tags, steps, values, metadata):
            # `tf.summary.write`, not `scalar`: the loop's name scope would prefix the tag.
            with writer.as_default(), tf.summary.record_if(True):
                for i in tf.range(tf.size(steps)):
                    tf.summary.write(tags[i], values[i], step=steps[i], metadata=metadata[i])

        _SCALAR_WRITERS[writer] = fn
    n = len(tags)
    fn(
        tf.constant(list(tags), tf.string, shape=[n]),
        tf.constant(steps, tf.int64, shape=[n]),
        tf.constant(values, tf.float32, shape=[n]),
        tf.constant([_scalar_metadata(tag) for tag in tags], tf.string, shape=[n]),
    )


def _scalar_metadata(tag: str) -> bytes:
    """The serialized TensorBoard scalar-plugin metadata of `tag` (made once per tag)."""
    metadata = _METADATA.get(tag)
    if metadata is None:
        metadata = scalar_metadata.create_summary_metadata(display_name=tag, description="")
        metadata = _METADATA[tag] = metadata.SerializeToString()
    return metadata


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
            raise ConfigError(
                f"`{name}` keys must be positive integers (steps); received {key!r}. "
                f"Fix the `{name}` table of your Task."
            )
        fns = list(value) if isinstance(value, (list, tuple)) else [value]
        for fn in fns:
            if not callable(fn):
                raise ConfigError(f"`{name}[{key}]` must be callable; received {fn!r}.")
        if fns:
            out[key] = fns
    return out
