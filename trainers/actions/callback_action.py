"""Runs a Task's `every_steps` / `at_step` callbacks after device loops, at exact steps.

The `callbacks` entry of the Controller's schedule (`actions.schedule`): the Controller calls the
action after every device loop, and its `steps_until_due` ends each loop exactly where a callback
is due. Callbacks
marked `tasks.deferred` (the default `print_loss`) do not end loops: the trainer records each
step's scalar logs (`TaskTrainer.loop_history`) and they run after the loop, once per due step
(`Trigger.due_steps`). Every "when" here is a `triggers.Trigger`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from orbitask.tasks import callbacks as callbacks_lib
from orbitask.tasks import step_tensors
from orbitask.trainers.actions import triggers
from orbitask.trainers.actions.triggers import Trigger


class CallbackAction:
    """The `callbacks` entry's action: calls the task's host callbacks after their due steps.

    When each callback is due is a `triggers.Trigger`: one per `every_steps` period, the runner's
    own `triggered` pairs, and the `at_step` table's steps.

    Args:
      task: the Task whose `every_steps()` / `at_step()` tables are run.
      global_step: the trainer's step variable.
      make_context: `make_context(step, logs) -> tasks.CallbackContext`.
      summary_writer: callbacks run with it as the default writer, the step set, recording on.
      history: `history() -> (first_step, {name: per-step values})` of the last device loop, or
        None when the trainer records none; then deferred callbacks end loops like the others.
      current_step: `current_step() -> int`, the step the last loop ended at, to save reading
        `global_step` (an eager op) after every loop; None reads the variable.
      triggered: `[(Trigger, [callbacks])]` the runner adds with a rule of their own (e.g. every
        T seconds, `Trigger(every_secs=T)`): run after the every_steps callbacks and before the
        at_step ones, after the first device loop where the trigger is due; the trigger then
        `fired`. Its step rules end device loops (deferred callbacks: run once per due step).
    """

    def __init__(
        self,
        task: Any,
        global_step: tf.Variable,
        make_context: Callable,
        summary_writer,
        history: Callable[[], tuple[int, dict]] | None = None,
        current_step: Callable[[], int] | None = None,
        *,
        triggered: Sequence[tuple[Trigger, Sequence[Callable]]] = (),
    ):
        self.task = task
        self.global_step = global_step
        self.make_context = make_context
        self.summary_writer = summary_writer
        self.history = history
        self.current_step = current_step or (lambda: int(global_step.numpy()))
        self.every = callbacks_lib.as_callback_lists(task.every_steps(), "every_steps")
        self.at = callbacks_lib.as_callback_lists(task.at_step(), "at_step")
        self.triggered = [(trigger, list(fns)) for trigger, fns in triggered]
        # (trigger, callbacks) in call order; the at_step table follows them.
        self._periodic = [(Trigger(every_steps=n), self.every[n]) for n in sorted(self.every)]
        self._periodic += self.triggered
        # The rules' triggers by kind: those that end device loops, and the deferred ones.
        self._ending = self._triggers(self._ends_loop)
        self._deferred = self._triggers(
            lambda fn: callbacks_lib.is_deferred(fn) and not step_tensors.wants_tensors(fn)
        )

    def _triggers(self, kind: Callable) -> list[Trigger]:
        out = [trigger for trigger, fns in self._periodic if any(map(kind, fns))]
        at_steps = [n for n, fns in self.at.items() if any(map(kind, fns))]
        return out + [Trigger(at_steps=at_steps)] if at_steps else out

    @property
    def has_deferred(self) -> bool:
        """Whether any callback is `deferred` (then the trainer must record loop histories)."""
        tables = [fns for _, fns in self._periodic] + list(self.at.values())
        return any(callbacks_lib.is_deferred(fn) for fns in tables for fn in fns)

    def trackables(self) -> dict:
        """Stateful callbacks (tf.Module / Trackable ones), by a stable name, to checkpoint."""
        out = {}
        tables = [(self.every, "every_steps"), (self.at, "at_step")]
        tables.append((dict(enumerate(fns for _, fns in self.triggered)), "triggered"))
        for table, name in tables:
            for n, fns in sorted(table.items()):
                for i, fn in enumerate(fns):
                    if isinstance(fn, tf.__internal__.tracking.Trackable):
                        out[f"{name}_{n}_{i}"] = fn
        return out

    def _ends_loop(self, fn) -> bool:
        deferred = callbacks_lib.is_deferred(fn) and not step_tensors.wants_tensors(fn)
        return self.history is None or not deferred

    @property
    def asks_step_tensors(self) -> bool:
        """Whether any callback is marked `with_step_tensors`."""
        tables = [fns for _, fns in self._periodic] + list(self.at.values())
        return any(step_tensors.wants_tensors(fn) for fns in tables for fn in fns)

    def tensors_due(self, step: int) -> bool:
        """Whether a `with_step_tensors` callback is due after `step` by its step rule (a
        device loop ends there). Eager host Python."""
        return any(step_tensors.wants_tensors(fn) for fn in self._due_by_step(step))

    def steps_until_due(self, step: int) -> int | None:
        """Steps from `step` to the next step where a loop-ending callback is due.

        Eager host Python (a few integer operations), run before every device loop.

        Returns:
          A positive int, or None when no loop-ending callback is due after `step`.
        """
        return triggers.steps_until_any(self._ending, step)

    def _due_now(self, step: int) -> list[tuple[Trigger, list]]:
        return [rule for rule in self._periodic if rule[0].due(step)]

    def _due_by_step(self, step: int) -> list:
        """The callbacks due after `step` by the step rules only: for a step a device loop ran
        past."""
        fns = [fn for trigger, fns in self._periodic if trigger.step_due(step) for fn in fns]
        return fns + self.at.get(step, [])

    def __call__(self, train_output: dict) -> None:
        step = self.current_step()
        earlier = self._earlier_steps(step)
        rules = self._due_now(step)
        fns = [fn for _, fns in rules for fn in fns] + self.at.get(step, [])
        if not fns and not earlier:
            return
        batches: dict[Any, list] = {}  # batched deferred callback -> its contexts, in step order
        work: list[tuple] = []  # in call order: (fn, step, ctx) one call, or (fn,) a batch
        for past_step, logs in earlier:
            ctx = self.make_context(past_step, logs)
            for fn in filter(callbacks_lib.is_deferred, self._due_by_step(past_step)):
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
        self._run(work, batches, step)
        for trigger, _ in rules:
            trigger.fired(step)  # (restarts the seconds clock of a `triggered` rule)

    def _run(self, work: list[tuple], batches: dict[Any, list], step: int) -> None:
        if all(len(item) == 1 for item in work):
            # Only batches (the default `print_loss`): they write through their contexts'
            # writer, so no default-writer context and no flush is needed.
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
        if self.history is None or not self._deferred:
            return []
        first, values = self.history()
        if len(self._deferred) == 1:
            steps = self._deferred[0].due_steps(first, step - 1)
        else:
            steps = sorted({s for t in self._deferred for s in t.due_steps(first, step - 1)})
        out = []
        for past in steps:
            i = past - first
            out.append((past, {k: float(v[i]) for k, v in values.items() if i < len(v)}))
        return out


def _batched(fn) -> bool:
    return callbacks_lib.is_deferred(fn) and getattr(fn, "run_batch", None) is not None
