"""Runs a Task's `every_steps` / `at_step` callbacks as an Orbit train action, at exact steps.

The Controller calls the action after every device loop; `steps_until_due` is folded into Orbit's
`steps_per_loop` callable so that a loop always ends exactly where a callback is due.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tasks import callbacks as callbacks_lib


class CallbackAction:
    """An Orbit action calling the task's host callbacks after the steps they are due at.

    Args:
      task: the Task whose `every_steps()` / `at_step()` tables are run.
      global_step: the trainer's step variable.
      make_context: `make_context(step, logs) -> tasks.CallbackContext`.
      summary_writer: callbacks run with it as the default writer, the step set, recording on.
      extra_every: `{N: [callbacks]}` the runner adds (e.g. histograms every N steps).
    """

    def __init__(
        self,
        task: Any,
        global_step: tf.Variable,
        make_context: Callable,
        summary_writer,
        extra_every: dict | None = None,
    ):
        self.task = task
        self.global_step = global_step
        self.make_context = make_context
        self.summary_writer = summary_writer
        self.every = callbacks_lib.as_callback_lists(task.every_steps(), "every_steps")
        for n, fns in (extra_every or {}).items():  # built-in periodic work, after the task's
            self.every[n] = self.every.get(n, []) + list(fns)
        self.at = callbacks_lib.as_callback_lists(task.at_step(), "at_step")

    def trackables(self) -> dict:
        """Stateful callbacks (tf.Module / Trackable ones), by a stable name, to checkpoint."""
        out = {}
        for table, name in ((self.every, "every_steps"), (self.at, "at_step")):
            for n, fns in sorted(table.items()):
                for i, fn in enumerate(fns):
                    if isinstance(fn, tf.__internal__.tracking.Trackable):
                        out[f"{name}_{n}_{i}"] = fn
        return out

    def steps_until_due(self, step: int) -> int | None:
        """Steps from `step` to the next step where a callback is due (None if never)."""
        candidates = [n - step % n for n in self.every]
        candidates += [n - step for n in self.at if n > step]
        return min(candidates) if candidates else None

    def due(self, step: int) -> list:
        """The callbacks due after `step`, every_steps first (by period), then at_step."""
        fns = [fn for n in sorted(self.every) if step % n == 0 for fn in self.every[n]]
        return fns + list(self.at.get(step, []))

    def __call__(self, train_output: dict) -> None:
        step = int(self.global_step.numpy())
        fns = self.due(step)
        if not fns:
            return
        ctx = self.make_context(step, train_output)
        with self.summary_writer.as_default(step=step), tf.summary.record_if(True):
            for fn in fns:
                fn(self.task, ctx)
        self.summary_writer.flush()
