"""TensorBoard writing by value shape: scalars, images and histograms, nested dicts as subdirs.

`write` is the `summary_fn` of the train and eval `orbit.utils.SummaryManager`s, which already
turn nested dicts into sub-directories (Model Garden's behaviour); `histograms` is the callback
behind `run_experiment(histogram_interval=M)` (nabu's histograms of trainable variables).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import orbit
import tensorflow as tf

from orbitask.tasks.scalar_batch import ScalarBatch
from orbitask.trainers.actions.schedule import Periodic
from orbitask.trainers.actions.triggers import Trigger


def write(name: str, value: Any, step: Any = None) -> None:
    """Writes one summary, eagerly: rank 0 -> scalar, images -> image, else histogram.

    Images are `[N, H, W, C]` (or `[H, W, C]`) with C in 1, 3, 4.
    """
    array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    if array.ndim == 0:
        tf.summary.scalar(name, array, step=step)
    elif array.ndim in (3, 4) and array.shape[-1] in (1, 3, 4):
        images = array if array.ndim == 4 else array[None]
        if images.dtype != np.uint8:
            images = np.clip(images.astype(np.float32), 0.0, 1.0)
        tf.summary.image(name, images, step=step, max_outputs=8)
    else:
        tf.summary.histogram(name, array, step=step)


def histograms(task: Any, ctx: Any) -> None:
    """Callback (eager, on the host): a histogram of every trainable variable of the model(s)."""
    del task
    models = ctx.model.values() if isinstance(ctx.model, dict) else [ctx.model]
    for model in models:
        for variable in model.trainable_variables:
            name = getattr(variable, "path", None) or variable.name.split(":")[0]
            tf.summary.histogram(f"weights/{name}", variable, step=ctx.step)


class RecordedScalars(ScalarBatch):
    """The train writer's `ScalarBatch`, which also keeps by step the points that callbacks
    (`print_loss`) add, for the loggers' rows (`LoopSummaryManager.write_summaries`). Eager."""

    def __init__(self, writer: Any):
        super().__init__(writer)
        self.rows: dict[int, dict[str, float]] = {}

    def keep(self, tag: str, points) -> None:
        """Keeps the points for the writer and, by step, for the loggers. Returns None."""
        super().keep(tag, points)
        for step, value in points:
            self.rows.setdefault(int(step), {})[tag] = float(value)

    def keep_own(self, tag: str, points) -> None:
        """Keeps the loop's own points for the writer alone (its row has them). Returns None."""
        super().keep(tag, points)

    def take_rows(self) -> dict[int, dict[str, float]]:
        """Removes and returns the callbacks' points kept since the last call, by step."""
        rows, self.rows = self.rows, {}
        return rows


class LoopSummaryManager(orbit.utils.SummaryManager):
    """The train `SummaryManager`: keeps each device loop's scalars, writes them in batches.

    The Controller hands it every loop's output and flushes after every loop; eager scalar writes
    after every loop would slow quick models, so scalars are kept on the host, one point per loop at
    the loop's last step (in `scalars`, the writer's `tasks.scalar_batch.ScalarBatch`, where
    `print_loss` keeps its points too), and written with one traced call for all tags by the
    `summary_writes` entry of the schedule (`entry`): after the first loop, then whenever a loop
    reached or passed a multiple of `interval`, or `max_seconds` passed since the last write
    (its `trigger`; loops do not end for it). The loggers (`metrics`) get a row at the loop's
    last step, and before it a row at each step where a callback kept points (`print_loss`'s,
    every 10 steps): the train points TensorBoard gets. Those writes (and their flush) run on a
    background thread, overlapping the next device loop; `write_pending` writes the rest and
    waits for them (the runner calls it at the end, also on SIGTERM and errors).
    `current_step() -> int` gives the step after a loop without reading `global_step` (an eager
    op); None reads it. `clock` is the trigger's `time.monotonic`-like clock (injectable for
    tests). Other values (images, nested dicts) are written at once, as Orbit does.
    """

    def __init__(
        self,
        summary_dir,
        summary_fn,
        global_step,
        interval: int,
        max_seconds: float | None = 30.0,
        current_step=None,
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__(summary_dir, summary_fn, global_step)
        self.enabled = summary_dir is not None  # as Orbit decides: no directory, no summaries
        self.current_step = current_step or (lambda: int(global_step.numpy()))
        self.trigger = Trigger(
            every_steps=interval, every_secs=max_seconds, clock=clock, first=True
        )
        self._unflushed = False
        self._thread: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self.scalars = RecordedScalars(self.summary_writer())
        self.metrics: Any = None  # the run's loggers (`loggers.Records`): the train points
        if self.enabled:  # trace the writer now, in setup, not in the first loop's host work
            self.scalars.write((), (), ())

    def entry(self) -> Periodic:
        """The `summary_writes` entry: writes the kept scalars when `trigger` is due (this
        process's clock). Eager; returns the `Periodic`."""
        return Periodic("summary_writes", self.write_batch, when=self.trigger, local=True)

    def write_summaries(self, summary_dict) -> None:
        """Keeps the scalars of `summary_dict`, writes other values (eager). Returns None."""
        kept = self.scalars.take_rows()
        if not self.enabled:
            # No summaries here (a non-chief worker): drop what callbacks kept for the writer.
            self.scalars.write_kept(write=False)
            return
        step = self.current_step()
        if self.metrics is not None:
            for at in sorted(s for s in kept if s < step):
                self.metrics.write(at, "train", kept[at])
            self.metrics.write(step, "train", {**kept.get(step, {}), **summary_dict})
        others = {}
        for name, value in summary_dict.items():
            if isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(
                value, bool
            ):
                self.scalars.keep_own(name, [(step, float(value))])
            else:
                others[name] = value
        if others:
            super().write_summaries(others)
            self._unflushed = True

    def write_batch(self, output: dict | None = None) -> None:
        """The `summary_writes` action: writes the kept scalars on a background thread (eager;
        `output` unused). Returns None."""
        del output
        if not self.enabled:
            return
        for done in [f for f in self._pending if f.done()]:
            self._pending.remove(done)
            done.result()  # a failed write (e.g. a full disk) raises here
        kept = self.scalars.take()
        if kept is None:
            return
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="orbitask-summaries")
        self._pending.append(self._thread.submit(self._write_and_flush, kept))

    def _write_and_flush(self, kept) -> None:
        self.scalars.write(*kept)
        self.scalars.writer.flush()

    def write_pending(self) -> None:
        """Waits for the background writes, then writes every kept scalar point now (eager).

        Returns None.
        """
        if not self.enabled:
            return
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None
            pending, self._pending = self._pending, []
            for future in pending:
                future.result()  # raises what a background write raised
        if self.scalars.write_kept():
            self._unflushed = True
        self.trigger.fired()  # everything is written: the seconds rule starts again

    def flush(self) -> None:
        """Flushes the writers if anything was written since the last flush (eager)."""
        if self._unflushed:
            super().flush()
            self._unflushed = False


class EvalSummaryManager(orbit.utils.SummaryManager):
    """Orbit's `SummaryManager` for `eval/`, whose `metrics` (a `MetricsFile`, or None) also
    gets each evaluation's scalars."""

    metrics: Any = None

    def write_summaries(self, summary_dict) -> None:
        super().write_summaries(summary_dict)
        if self.metrics is not None:
            self.metrics.write_eval(int(self._global_step.numpy()), summary_dict)


def reopen(manager: orbit.utils.SummaryManager) -> None:
    """Drops `manager`'s file writers (their files were deleted with their folder); the next
    `summary_writer()` makes new files, and a `LoopSummaryManager`'s kept scalars go there.
    Eager; returns None."""
    if isinstance(manager, LoopSummaryManager) and manager._thread is not None:  # noqa: SLF001
        manager._thread.shutdown(wait=True)  # noqa: SLF001 -- writes to the lost files end
        manager._thread, manager._pending = None, []  # noqa: SLF001
    manager._summary_writers.clear()  # noqa: SLF001 -- Orbit keeps its writers there
    if isinstance(manager, LoopSummaryManager) and manager.enabled:
        manager.scalars.writer = manager.summary_writer()
        manager.scalars._write_fn = None  # noqa: SLF001 -- traced again with the new writer
