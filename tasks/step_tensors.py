"""A step's tensors for the callbacks that ask for them: outputs, batch and gradients.

A callback marked `with_step_tensors` receives, at each step it is due, that step's
`ctx.outputs`, `ctx.batch`, `ctx.gradients` (all-reduced), `ctx.update_gradients` and
`ctx.display_gradients` (what `update_pre` returned), each as the strategy gives per-replica
values (one device: tensors; several replicas: `PerReplica`, as `strategy.run` returns them, the
seed's callbacks' arguments). Only the steps such a callback is due at are run apart to keep
them (`trainers.engine.kept_step`); other steps, and runs where no callback asks, are unchanged.

The default steps record their tensors with `keep`; a Task's own `train_step` may call it too.
`keep` does nothing except while such a step is traced.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

NAMES = ("outputs", "batch", "gradients", "update_gradients", "display_gradients")
_kept: dict[int, dict[str, Any]] | None = None  # replica -> tensors, while a kept step traces


def with_step_tensors(fn: Callable) -> Callable:
    """Marks callback `fn` as reading `ctx.outputs`, `ctx.batch` and the gradients of the step
    it is due at; returns `fn` (a callable that takes no attributes comes back wrapped). Eager.
    """
    try:
        fn.step_tensors = True
    except AttributeError:

        def call(task: Any, ctx: Any) -> Any:
            return fn(task, ctx)

        call.step_tensors = True
        return call
    return fn


def wants_tensors(fn: Callable) -> bool:
    """Whether callback `fn` was marked `with_step_tensors`."""
    return bool(getattr(fn, "step_tensors", False))


@tf.autograph.experimental.do_not_convert
def keep(**tensors: Any) -> None:
    """Records this replica's `tensors` (names from `NAMES`) for the callbacks of the step being
    traced; nothing otherwise. Traced, per replica; returns None."""
    if _kept is None:
        return
    context = tf.distribute.get_replica_context()
    replica = tf.get_static_value(context.replica_id_in_sync_group) if context else 0
    _kept.setdefault(int(replica or 0), {}).update(tensors)


@contextlib.contextmanager
def keeping() -> Iterator[dict[int, dict[str, Any]]]:
    """While open, `keep` records into the yielded `{replica: {name: tensor}}`. Traced, around
    one step's trace."""
    global _kept
    _kept = {}
    try:
        yield _kept
    finally:
        _kept = None
