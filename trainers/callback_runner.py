"""Runs a Task's `every_steps` / `at_step` callbacks as an Orbit train action, at exact steps.

The Controller calls the action after every device loop; `steps_until_due` is folded into Orbit's
`steps_per_loop` callable so that a loop always ends exactly where a callback is due. Callbacks
marked `tasks.deferred` (the default `print_loss`) do not end loops: the trainer records each
step's scalar logs (`TaskTrainer.loop_history`) and they run after the loop, once per due step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from orbitask.tasks import callbacks as callbacks_lib


class CallbackAction:
    """An Orbit action calling the task's host callbacks after the steps they are due at.

    Args:
      task: the Task whose `every_steps()` / `at_step()` tables are run.
      global_step: the trainer's step variable.
      make_context: `make_context(step, logs) -> tasks.CallbackContext`.
      summary_writer: callbacks run with it as the default writer, the step set, recording on.
      extra_every: `{N: [callbacks]}` the runner adds (e.g. histograms every N steps).
      history: `history() -> (first_step, {name: per-step values})` of the last device loop, or
        None when the trainer records none; then deferred callbacks end loops like the others.
      current_step: `current_step() -> int`, the step the last loop ended at, to save reading
        `global_step` (an eager op, ~30-60 us) after every loop; None reads the variable.
    """

    def __init__(
        self,
        task: Any,
        global_step: tf.Variable,
        make_context: Callable,
        summary_writer,
        extra_every: dict | None = None,
        history: Callable[[], tuple[int, dict]] | None = None,
        current_step: Callable[[], int] | None = None,
    ):
        self.task = task
        self.global_step = global_step
        self.make_context = make_context
        self.summary_writer = summary_writer
        self.history = history
        self.current_step = current_step or (lambda: int(global_step.numpy()))
        self.every = callbacks_lib.as_callback_lists(task.every_steps(), "every_steps")
        for n, fns in (extra_every or {}).items():  # built-in periodic work, after the task's
            self.every[n] = self.every.get(n, []) + list(fns)
        self.at = callbacks_lib.as_callback_lists(task.at_step(), "at_step")

    @property
    def has_deferred(self) -> bool:
        """Whether any callback is `deferred` (then the trainer must record loop histories)."""
        tables = list(self.every.values()) + list(self.at.values())
        return any(callbacks_lib.is_deferred(fn) for fns in tables for fn in fns)

    def trackables(self) -> dict:
        """Stateful callbacks (tf.Module / Trackable ones), by a stable name, to checkpoint."""
        out = {}
        for table, name in ((self.every, "every_steps"), (self.at, "at_step")):
            for n, fns in sorted(table.items()):
                for i, fn in enumerate(fns):
                    if isinstance(fn, tf.__internal__.tracking.Trackable):
                        out[f"{name}_{n}_{i}"] = fn
        return out

    def _ends_loop(self, fn) -> bool:
        return self.history is None or not callbacks_lib.is_deferred(fn)

    def steps_until_due(self, step: int) -> int | None:
        """Steps from `step` to the next step where a loop-ending callback is due, or None."""
        ending = self._ends_loop
        candidates = [n - step % n for n, fns in self.every.items() if any(map(ending, fns))]
        candidates += [n - step for n, fns in self.at.items() if n > step and any(map(ending, fns))]
        return min(candidates) if candidates else None

    def due(self, step: int) -> list:
        """The callbacks due after `step`, every_steps first (by period), then at_step."""
        fns = [fn for n in sorted(self.every) if step % n == 0 for fn in self.every[n]]
        return fns + list(self.at.get(step, []))

    def __call__(self, train_output: dict) -> None:
        step = self.current_step()
        earlier = self._earlier_steps(step)
        fns = self.due(step)
        if not fns and not earlier:
            return
        batches: dict[Any, list] = {}  # batched deferred callback -> its contexts, in step order
        work: list[tuple] = []  # in call order: (fn, step, ctx) one call, or (fn,) a batch
        for past_step, logs in earlier:
            ctx = self.make_context(past_step, logs)
            for fn in filter(callbacks_lib.is_deferred, self.due(past_step)):
                if _batched(fn):
                    batches.setdefault(fn, []).append(ctx)
                else:
                    work.append((fn, past_step, ctx))
        work += [(fn,) for fn in batches if fn not in fns]
        ctx = self.make_context(step, train_output)
        for fn in fns:
            if _batched(fn):
                batches.setdefault(fn, []).append(ctx)
                work.append((fn,))
            else:
                work.append((fn, step, ctx))
        if all(len(item) == 1 for item in work):
            # Only batches (the default `print_loss`): they write through their contexts'
            # writer, so no default-writer context and no flush (~60 us a loop) is needed.
            for (fn,) in work:
                fn.run_batch(self.task, batches[fn])
            return
        with self.summary_writer.as_default(step=step), tf.summary.record_if(True):
            for item in work:
                if len(item) == 1:
                    item[0].run_batch(self.task, batches[item[0]])
                elif item[1] != step:
                    with self.summary_writer.as_default(step=item[1]):
                        item[0](self.task, item[2])
                else:
                    item[0](self.task, item[2])
        # (Leaving `as_default` flushed the writer.)

    def _earlier_steps(self, step: int) -> list[tuple[int, dict]]:
        """`(step, logs)` of the loop's steps before `step` where a deferred callback is due."""
        if self.history is None:
            return []
        first, values = self.history()
        deferred = callbacks_lib.is_deferred
        steps = {n for n, fns in self.at.items() if first <= n < step and any(map(deferred, fns))}
        for n, fns in self.every.items():
            if any(map(deferred, fns)):
                steps.update(range(first + (-first) % n, step, n))  # multiples of n in the loop
        out = []
        for past in sorted(steps):
            i = past - first
            out.append((past, {k: float(v[i]) for k, v in values.items() if i < len(v)}))
        return out


def _batched(fn) -> bool:
    return callbacks_lib.is_deferred(fn) and getattr(fn, "run_batch", None) is not None
