"""The training input and its position, saved with every checkpoint.

A `TrainInput` is a `tf.train.experimental.PythonState` in the run's checkpoint: each save (every
path: the interval, SIGTERM, the final save, a best export) calls `serialize`, each restore (a
resume, a NaN rollback) calls `deserialize`, on every worker. An async save
(`run_experiment.async_checkpoints`) takes the record, and writes the iterator file, on the
training thread while it copies the values to write, so the position is the saved step's. Its
saved value is a small JSON record; what it points to depends on the input:

- `IteratorInput`, a `tf.data` pipeline: each worker writes its own iterator (buffers included) to
  `<model_dir>/input/ckpt-<step>/worker-<i>-of-<n>` and keeps only the newest `keep` steps, so the
  model directory holds at most `keep` input positions per worker whatever `max_to_keep` is. A
  pipeline with a reshuffling `shuffle` also writes its seed generators' position beside it
  (`trainers.state.shuffle_seeds`). Restoring a checkpoint whose position was not kept, or one saved
  by another number of workers, restarts the input from its beginning and says so. With `keep` 0, or
  a pipeline whose position no checkpoint can hold (a Python generator: `leave_unsaved`), no
  position is written and every restore restarts the input.
- `IndexedInput` (`tasks.indexed_input`): the record is the count of global examples taken. A
  restore rebuilds the pipeline from there, on any number of workers or replicas.
- Parameter-server `tf.data` input: per-worker iterators cannot be saved; a restore restarts the
  input and says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fractions
import json
import math
import os
import re
import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from absl import logging

from orbitask.common import files
from orbitask.trainers import compat
from orbitask.trainers.state.shuffle_seeds import SEEDS, ShuffleSeeds

STEP_DIR = re.compile(r"^ckpt-(\d+)$")


def _say(message: str) -> None:
    logging.info(message)
    print(f"orbitask: {message}", flush=True)


@dataclasses.dataclass(frozen=True)
class EpochLength:
    """One epoch of this worker's training input, in steps (`run_experiment.train_epochs`).

    Attributes:
      steps: steps per epoch: whole where each epoch ends with a step (`trainers.engine.inputs`), a
        fraction where steps run on across epochs (an `IndexedInput`, a dataset of full
        batches on several replica slots).
      round_up: N epochs are `ceil(N * steps)` steps (an `IndexedInput`: every example of the
        N epochs is trained, the last step taking a few of the next epoch's), else
        `floor(N * steps)` (none of the next epoch's).
    """

    steps: fractions.Fraction
    round_up: bool = False

    def steps_for(self, epochs: int) -> int:
        """The steps of `epochs` epochs. Eager."""
        total = self.steps * epochs
        return math.ceil(total) if self.round_up else math.floor(total)


class UnreadablePosition(Exception):
    """A restore under `TrainInput.strict_reads` found a saved input position that is there
    but does not read back (e.g. a truncated file); the message names it."""


class TrainInput(compat.FrozenAtAsyncSave):
    """The run's training iterator and its saved position (see the module docstring).

    Args:
      iterator: the first iterator (eager, not yet read).
      global_step: the step variable, read at each save.
      examples_per_step: global examples one step takes (global batch x accumulation).
      epoch_length: the `EpochLength` of an input of known size whose epochs are counted
        (`run_experiment.train_epochs`), else None.
    """

    style = "none"

    def __init__(
        self,
        iterator: Any,
        global_step: tf.Variable,
        examples_per_step: int,
        epoch_length: EpochLength | None = None,
    ):
        self.iterator = iterator
        self.global_step = global_step
        self.examples_per_step = examples_per_step
        self.epoch_length = epoch_length
        self.on_new_iterator: Callable[[Any], None] | None = None
        self._base = (0, 0)  # (step, examples taken at that step)
        self._strict = False

    @contextlib.contextmanager
    def strict_reads(self):
        """Within: a restore whose saved position is there but unreadable raises
        `UnreadablePosition` instead of restarting the input (the caller tries an older
        checkpoint)."""
        self._strict = True
        try:
            yield
        finally:
            self._strict = False

    @property
    def element_spec(self) -> Any:
        return self.iterator.element_spec

    def examples_at(self, step: int) -> int:
        """Global examples taken once `step` steps are done."""
        base_step, base_examples = self._base
        return base_examples + (step - base_step) * self.examples_per_step

    def record(self, step: int) -> dict:
        return {"style": self.style, "step": step, "examples": self.examples_at(step)}

    def serialize(self) -> str:
        """Called at each save (eager): the position's JSON record."""
        return json.dumps(self.record(int(self.global_step.numpy())))

    def frozen_copy(self) -> tf.train.experimental.PythonState:
        """Called by an async save on the training thread (eager): returns the position now,
        frozen for the background write (`compat.FrozenAtAsyncSave`)."""
        return _SavedPosition(self.serialize())

    def deserialize(self, string_value) -> None:
        """Called at each restore (eager), with what `serialize` returned."""
        record = json.loads(_text(string_value))
        self._base = (int(record["step"]), int(record["examples"]))
        self.restore(record)

    def restore(self, record: dict) -> None:
        _say(
            f"the training input restarts from its beginning at step {record['step']} (a "
            "parameter-server tf.data input has no saved position; see IndexedInput)."
        )

    def replace(self, iterator: Any) -> None:
        self.iterator = iterator
        if self.on_new_iterator is not None:
            self.on_new_iterator(iterator)


class _SavedPosition(tf.train.experimental.PythonState):
    """A position record taken at an async save, written as it was taken."""

    def __init__(self, record: str):
        self.record = record

    def serialize(self) -> str:
        return self.record

    def deserialize(self, string_value) -> None:
        raise NotImplementedError("a saved position is only written")


class IteratorInput(TrainInput):
    """A `tf.data` iterator whose state each worker saves into its own file, newest `keep` kept.

    Args:
      rebuild: returns a fresh iterator over the same pipeline (a restart from its beginning).
      model_dir: the run's model directory (shared by every worker).
      worker, workers: this worker's input pipeline index and the number of pipelines.
      keep: input positions kept (newest steps); 0: none (a restore restarts the input).
    """

    style = "iterator"

    def __init__(
        self,
        iterator,
        global_step,
        examples_per_step,
        rebuild: Callable[[], Any],
        model_dir: str,
        worker: int = 0,
        workers: int = 1,
        keep: int = 3,
        epoch_length: EpochLength | None = None,
    ):
        super().__init__(iterator, global_step, examples_per_step, epoch_length)
        self.rebuild = rebuild
        self.directory = os.path.join(model_dir, "input")
        self.worker, self.workers, self.keep = worker, workers, keep
        self._written: str | None = None
        # Why no position is written (`keep` 0), said when a restore restarts the input.
        self.unsaved = "run_experiment.keep_input_positions is 0" if keep == 0 else None

    def leave_unsaved(self, reason: str) -> None:
        """From now on no position is written, and a restore restarts the input, saying
        `reason` (why the pipeline's position cannot be saved). Eager."""
        self.keep, self.unsaved = 0, reason

    def path(self, step: int, worker: int | None = None, workers: int | None = None) -> str:
        worker = self.worker if worker is None else worker
        workers = self.workers if workers is None else workers
        return os.path.join(self.directory, f"ckpt-{step}", f"worker-{worker}-of-{workers}")

    def record(self, step: int) -> dict:
        record = super().record(step)
        path = self.path(step)
        if self.keep == 0:
            self._prune()  # positions an earlier start kept
        elif path != self._written:  # a best export saves the same step again
            start = time.perf_counter()
            try:
                seeds = ShuffleSeeds.of(self.iterator)
                if seeds is None:
                    tf.train.Checkpoint(iterator=self.iterator).write(path)
                else:
                    seeds.write(path + SEEDS, self.iterator, path, step)
            except (tf.errors.OpError, OSError):
                for partial in tf.io.gfile.glob(path + "*"):  # e.g. a full device
                    if tf.io.gfile.isdir(partial):
                        tf.io.gfile.rmtree(partial)
                    else:
                        tf.io.gfile.remove(partial)
                folder = os.path.dirname(path)  # unless another worker's position is in it
                if not files.listdir(folder):
                    files.rmtree(folder)
                raise
            seconds = time.perf_counter() - start
            size = _bytes(path)
            self._written = path
            logging.info("input position %s: %.1f MiB in %.2f s", path, size / 2**20, seconds)
            self._prune()
        record["workers"] = self.workers
        return record

    def _prune(self) -> None:
        """Removes this worker's positions older than the newest `keep` steps (the chief also
        removes those folders, whoever wrote them)."""
        steps = sorted(steps_with_positions(self.directory), reverse=True)
        for step in steps[self.keep :]:
            folder = os.path.join(self.directory, f"ckpt-{step}")
            if self.worker == 0:
                files.rmtree(folder)
                continue
            for name in tf.io.gfile.glob(self.path(step) + ".*"):
                try:
                    tf.io.gfile.remove(name)
                except tf.errors.NotFoundError:  # the chief removed the folder first
                    pass

    def restore(self, record: dict) -> None:
        step = int(record["step"])
        path = self.path(step)
        if self.unsaved is not None:
            self._restart(step, f"{self.unsaved}, so no input position is saved")
            return
        if record.get("style") != self.style:
            reason = "it was saved for another kind of input"
        elif int(record.get("workers", 1)) != self.workers:
            reason = (
                f"it was saved by {record.get('workers')} input pipelines (workers) and this "
                f"job has {self.workers}; IndexedInput resumes on any number"
            )
        elif not tf.io.gfile.exists(path + ".index"):
            reason = f"only the newest {self.keep} input positions are kept ({path} is gone)"
        else:
            try:
                tf.train.Checkpoint(iterator=self.iterator).read(path).assert_consumed()
                seeds = ShuffleSeeds.of(self.iterator)
                if seeds is not None:
                    seeds.read(path + SEEDS)
                self._written = path
                return
            except (tf.errors.OpError, ValueError, AssertionError, IndexError) as e:
                reason = f"{path} is unreadable ({type(e).__name__})"
                if self._strict:
                    raise UnreadablePosition(reason) from e
        self._restart(
            step, f"{reason} (run_experiment.keep_input_positions sets how many are kept)"
        )

    def _restart(self, step: int, reason: str) -> None:
        """A fresh iterator from the pipeline's beginning, at `step`, said with `reason`."""
        self.replace(self.rebuild())
        _say(f"the training input restarts from its beginning at step {step}: {reason}.")


class IndexedTrainInput(TrainInput):
    """An `IndexedInput`: the position is the count of global examples taken.

    Its epoch is `source.size` global examples, `size / examples_per_step` steps (rounded up
    for N epochs: `EpochLength`).

    Args:
      build: `start -> iterator` reading the global example stream from example `start`.
    """

    style = "indexed"

    def __init__(self, global_step, examples_per_step, build: Callable[[int], Any], source):
        length = EpochLength(fractions.Fraction(source.size, examples_per_step), round_up=True)
        super().__init__(build(0), global_step, examples_per_step, length)
        self.build = build
        self.source = source

    def record(self, step: int) -> dict:
        record = super().record(step)
        record.update({k: getattr(self.source, k) for k in ("size", "seed", "shuffle")})
        return record

    def restore(self, record: dict) -> None:
        examples = int(record["examples"])
        if record.get("style") != self.style:
            _say(f"the training input restarts from its beginning at step {record['step']}.")
            examples = 0
        else:
            now = {k: getattr(self.source, k) for k in ("size", "seed", "shuffle")}
            was = {k: record.get(k) for k in now}
            if was != now:
                _say(
                    f"the training input changed since step {record['step']} ({was} -> {now}); "
                    f"it goes on from global example {examples} of the new order."
                )
        self._base = (int(record["step"]), examples)
        self.replace(self.build(examples))


def steps_with_positions(directory: str) -> list[int]:
    """The steps that have an input-position folder in `directory`."""
    if not tf.io.gfile.isdir(directory):
        return []
    found = (STEP_DIR.match(name.rstrip("/")) for name in tf.io.gfile.listdir(directory))
    return [int(m.group(1)) for m in found if m]


def _bytes(prefix: str) -> int:
    return sum(tf.io.gfile.stat(p).length for p in tf.io.gfile.glob(prefix + "*"))


def _text(value) -> str:
    if hasattr(value, "numpy"):
        value = value.numpy()
    return value.decode() if isinstance(value, bytes) else str(value)
