"""`<model_dir>/metrics.jsonl`: every scalar the run sends to TensorBoard, one JSON object a line.

    {"step": 190, "split": "train", "loss": 0.33}
    {"step": 200, "split": "train", "loss": 0.31, "learning_rate": 0.001, "steps_per_second": 840.2}
    {"step": 200, "split": "eval", "accuracy": 0.95, "loss": 0.17}
    {"step": 200, "split": "eval/clean", "accuracy": 0.97, "loss": 0.11}

A line per device loop of training (its last step's logs, the learning rate and steps/s, the
progress line's figure: `actions.step_rate`), per step inside the loop where a callback wrote
train points (`print_loss`'s losses every 10 steps, as TensorBoard gets them) and per
evaluation (`"eval/<name>"` for each of several validation sets), keyed `"step"` and `"split"`,
then the scalars by name (a non-finite value is written as JavaScript's `NaN` / `Infinity`, as
Python's `json` and pandas read them). `pandas.DataFrame(metrics_file.read(path))` reads it,
anywhere; on the local disk `pandas.read_json(path, lines=True)` too. On object storage
(`gs://`), which has no append, the lines of each checkpoint interval are one more object
(`metrics.part-000001.jsonl`, ...; `files.Appender`), and `read` reads them all as one file.

A training run resumed from a checkpoint first drops the lines past it: train lines past the
checkpoint's step, evaluation lines past the last evaluation it records, so that after a kill -9
and a resume the file is an uninterrupted run's (each split and step once, steps rising). An
evaluation mode (which writes nothing outside `eval/`) appends to `eval/metrics.jsonl` of its
output folder.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from orbitask.common import files

NAME = "metrics.jsonl"


def scalars(logs: Mapping[str, Any]) -> dict[str, float]:
    """The scalar entries of `logs` as floats (numbers, 0-d arrays and tensors), by name."""
    found = {}
    for name, value in logs.items():
        if isinstance(value, bool) or isinstance(value, Mapping):
            continue
        array = np.asarray(value) if not hasattr(value, "numpy") else np.asarray(value.numpy())
        if array.size == 1 and array.dtype.kind in "fiu":
            found[str(name)] = float(array.reshape(()))
    return found


class MetricsFile:
    """Appends a run's scalar logs to `folder/metrics.jsonl`. Eager; the chief only.

    Args:
      folder: the model directory (training) or the evaluation's output folder.
      buffered: on object storage, whether lines wait for the next checkpoint save to be
        written as one segment (`files.Appender`); False writes a segment per line.
    """

    def __init__(self, folder: str, buffered: bool = True):
        self.path = os.path.join(folder, NAME)
        self.file = files.Appender(self.path, buffered)

    def write(self, step: int, split: str, logs: Mapping[str, Any]) -> None:
        """Appends one line: `step`, `split`, then the scalars of `logs` (none: no line)."""
        values = scalars(logs)
        if not values:
            return
        line = json.dumps({"step": int(step), "split": split, **values}, allow_nan=True)
        self.file.append(line + "\n")

    def write_eval(self, step: int, logs: Mapping[str, Any]) -> None:
        """One evaluation's logs: `"eval"`, or a line per validation set (`{name: logs}`)."""
        sets = {k: v for k, v in logs.items() if isinstance(v, Mapping)}
        self.write(step, "eval", logs)
        for name, one in sets.items():
            self.write(step, f"eval/{name}", one)

    def rewind(self, train_step: int, eval_step: int) -> int:
        """Drops the train lines past `train_step` and the evaluation lines past `eval_step`
        (a checkpoint restored there); returns how many lines were dropped. Eager."""
        text = self.file.read()
        if text is None:
            return 0
        lines = text.splitlines()
        kept = []
        for line in lines:
            try:
                row = json.loads(line)
                step, split = int(row["step"]), str(row["split"])
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a kill
            if step <= (train_step if split == "train" else eval_step):
                kept.append(line)
        if len(kept) != len(lines) or len(files.pieces(self.path)) > 1:
            self.file.rewrite("".join(f"{line}\n" for line in kept))
        return len(lines) - len(kept)


def read(path: str) -> list[dict]:
    """The rows of a metrics file and its segments (`files.Appender`), in order (a line cut
    short is skipped); none when there is no file. `pandas.DataFrame(read(path))` is its table."""
    rows = []
    for line in (files.read_appended(path) or "").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "step" in row and "split" in row:
            rows.append(row)
    return rows
