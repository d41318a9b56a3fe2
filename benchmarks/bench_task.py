"""`BenchTask`: a benchmark workload as an orbitask `Task`; the harness's gate is a callback."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from benchmarks import workloads
from orbitask.tasks import Task


class BenchTask(Task):
    """Trains a `benchmarks.workloads` workload with every orbitask default.

    Args:
      name: the workload ("mlp", "cnn" or "input").
      gate: called (on the host) after each step in `boundaries`; blocks until the next window.
      boundaries: the steps that end the warm-up and each timed window (multiples of 100, where
        the default configuration ends a device loop anyway, so the gate adds no loop).
      callbacks: keep the default `every_steps` (`{10: print_loss}`); False removes them.
      prefetch: batches prefetched (None: the workload's default).
      **task_kwargs: `tasks.Task` arguments (e.g. `clip_norm`).
    """

    def __init__(
        self,
        name: str,
        gate: Callable[[], None],
        boundaries: Sequence[int],
        callbacks: bool = True,
        prefetch: int | None = None,
        **task_kwargs,
    ):
        super().__init__(**task_kwargs)
        self.workload = name
        self.gate = gate
        self.boundaries = list(boundaries)
        self.callbacks = callbacks
        self.prefetch = prefetch

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        return workloads.dataset(
            self.workload, per_replica_batch_size, input_context, prefetch=self.prefetch
        )

    def build_model(self):
        return workloads.build_model(self.workload)

    def build_losses(self):
        def loss_fn(loss_input):
            logits, labels = loss_input
            return workloads.sum_cross_entropy(labels, logits)

        return loss_fn

    def every_steps(self):
        return super().every_steps() if self.callbacks else {}

    def at_step(self):
        return {step: lambda task, ctx: self.gate() for step in self.boundaries}
