"""The device loops whose last step a `with_step_tensors` callback is due at.

Callbacks that do not end device loops are deferred; the others end a loop exactly at their step,
so the step a callback asks tensors of is always its loop's last. Such a loop runs its first
`num_steps - 1` steps as the loop function does, then the last step alone, in a function traced
with `tasks.step_tensors.keeping` that also returns the step's outputs, batch and gradients
(`tasks.step_tensors`). Loops that end elsewhere, and runs without such a callback (the trainer
then has no `KeptStep`), run as they do without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from orbitask.tasks import step_tensors


class KeptStep:
    """Runs a device loop keeping its last step's tensors (module docstring).

    Args:
      trainer: the `TaskTrainer` whose step and loop outputs it uses.
      due: `due(step) -> bool`, whether a callback asking for tensors is due after `step`.
    """

    def __init__(self, trainer: Any, due: Callable[[int], bool]):
        self.trainer = trainer
        self.due = due
        self.tensors: tuple[int, dict] | None = None  # (step, {name: per-replica value})
        self._fn = None

    def run(self, loop_fn: Callable, iterator: Any, num_steps: tf.Tensor) -> dict:
        """The loop of `num_steps` steps, its last run apart (`tensors` then holds its
        tensors); returns what the loop function would. Eager."""
        steps = int(num_steps)
        before = None
        if steps > 1:
            before = loop_fn(iterator, tf.constant(steps - 1, dtype=num_steps.dtype))
            guard = self.trainer.nan_guard
            if guard is not None and bool(guard.tripped()):
                return before  # the loop ended early: the host handles the guard first
        if self._fn is None:
            self._fn = self._traced()
        out, local = self._fn(iterator)
        if before is not None and "history" in out:
            out["history"] = tf.concat([before["history"], out["history"]], 0)
        self.tensors = (int(out["step"]), self._distributed(local))
        return out

    def reset(self) -> None:
        """Drops the traced step, so the next `run` traces it again (after the trainable set
        changed). Eager; returns None."""
        self._fn = None

    def at(self, step: int) -> dict:
        """The kept tensors of `step` by name (`ctx.outputs`, ...), or {} when none. Eager."""
        if self.tensors is None or self.tensors[0] != step:
            return {}
        return self.tensors[1]

    def _traced(self):
        trainer = self.trainer
        step = trainer.step
        record = trainer._history_row if trainer.record_history else None

        @tf.function
        def kept(iterator):
            trainer._rate_into_optimizer()
            with step_tensors.keeping() as box:
                logs = step(iterator)
            history = tf.stack([record(logs)]) if record else None
            return trainer._loop_output(logs, history), {str(r): box[r] for r in sorted(box)}

        return kept

    def _distributed(self, local: dict) -> dict:
        """`{name: value}`: one replica's nest, or the replicas' as one nest of `PerReplica`
        leaves, as `strategy.run` returns them."""
        strategy = self.trainer.strategy
        replicas = [local[k] for k in sorted(local, key=int)]
        if len(replicas) <= 1:
            return dict(replicas[0]) if replicas else {}
        first = min(map(int, local))

        def joined(*leaves):
            if leaves[0] is None:
                return None
            return strategy.experimental_distribute_values_from_function(
                lambda context: leaves[context.replica_id_in_sync_group - first]
            )

        return {
            name: tf.nest.map_structure(joined, *(r[name] for r in replicas))
            for name in replicas[0]
        }
