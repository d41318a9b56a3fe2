"""A run's best evaluation: `run_experiment(...)["best"]`, a `Best`, and its `orbitask:` line.

The ranked metric is the one `ValidationControl` watches (`metric`, `higher_is_better`) when
the run has one (without `per_task`); otherwise the rule of `orbitask report`: `accuracy`, else
the first eval log whose name says neither loss nor error (maximised), else `loss` (minimised).
Its best value is the best of every evaluation of the run: for a training run that writes
`metrics.jsonl`, every evaluation line of that file (which a resume rewinds to its checkpoint,
so the evaluations of every process of the run count once); otherwise this process's
evaluations. Ties go to the earliest step, as `ValidationControl` keeps the first best.

The checkpoint is that step's: `best/best_ckpt-<step>` when `ValidationControl` exported it,
the evaluated checkpoint of `eval_checkpoint` or eval_all, else `ckpt-<step>` when the model
directory still keeps it (None when not).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Iterable
from typing import Any

from orbitask.common import files
from orbitask.trainers.state import metrics_file


@dataclasses.dataclass(frozen=True)
class Best:
    """The best evaluation of a run's ranked metric.

    Attributes:
      metric: the eval log ranked, e.g. "accuracy" or "valid/accuracy" (a validation set's).
      value: its best value.
      step: the step of that evaluation (the earliest of equal ones).
      checkpoint: the checkpoint of that step (a path prefix), or None when none is kept.
      higher_is_better: the direction it is ranked in.
    """

    metric: str
    value: float
    step: int
    checkpoint: str | None
    higher_is_better: bool

    def line(self) -> str:
        """The line the run prints: `best eval accuracy 0.97 at step 1000 (max), <ckpt>`."""
        kept = self.checkpoint or "no checkpoint of that step kept"
        direction = "max" if self.higher_is_better else "min"
        return f"best eval {self.metric} {self.value:.4g} at step {self.step} ({direction}), {kept}"


def minimised(name: str) -> bool:
    """Whether a smaller value of eval log `name` is better (names with 'loss' or 'error')."""
    return bool(re.search(r"loss|error", name, re.IGNORECASE))


def ranked(names: Iterable[str], control: Any = None) -> tuple[str, bool] | None:
    """`(metric, higher_is_better)` ranked among the eval log `names` (module docstring), or
    None when there is none."""
    if control is not None and not getattr(control, "per_task", False):
        return control.metric, bool(control.higher_is_better)
    names = set(names)
    if "accuracy" in names:
        return "accuracy", True
    others = sorted(n for n in names if not minimised(n))
    if others:
        return others[0], True
    return ("loss", False) if "loss" in names else None


def evaluations_of(rows: list[dict]) -> list[tuple[int, dict[str, float]]]:
    """`(step, {eval log: value})` of each evaluation in a metrics file's `rows`, in step order;
    a validation set's logs as `<set>/<name>` (`split` "eval/<set>")."""
    found: dict[int, dict[str, float]] = {}
    for row in rows:
        split, _, name = str(row["split"]).partition("/")
        if split != "eval":
            continue
        logs = found.setdefault(int(row["step"]), {})
        for key, value in row.items():
            if key not in ("step", "split") and isinstance(value, (int, float)):
                logs[f"{name}/{key}" if name else key] = float(value)
    return sorted(found.items())


def pick(
    evaluations: list[tuple[int, dict]], metric: str, higher_is_better: bool
) -> tuple[float, int] | None:
    """`(best value, its step)` of `metric` among `evaluations` (`(step, logs)`), the earliest
    of equal values; None when no evaluation has a finite value of it."""
    chosen: tuple[float, int] | None = None
    for step, logs in evaluations:
        value = logs.get(metric)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        better = chosen is None or (value > chosen[0] if higher_is_better else value < chosen[0])
        if better:
            chosen = (float(value), int(step))
    return chosen


def of_run(
    model_dir: str,
    evaluations: list[tuple[int, dict]],
    control: Any = None,
    checkpoints: dict[int, str] | None = None,
    training: bool = True,
) -> Best | None:
    """The `Best` of a run in `model_dir` whose process made `evaluations` (`(step, logs)`);
    a `training` run's `metrics.jsonl` holds them all. `checkpoints` maps the step of each saved
    checkpoint evaluated to its path (eval_all). Eager; None when nothing ranked was evaluated."""
    if training and checkpoints is None:  # `read` joins the segments of object storage
        rows = metrics_file.read(os.path.join(model_dir, metrics_file.NAME))
        evaluations = evaluations_of(rows) or evaluations
    names = {name for _, logs in evaluations for name in logs}
    rule = ranked(names, control)
    found = pick(evaluations, *rule) if rule else None
    if found is None:
        return None
    value, step = found
    checkpoint = _checkpoint(model_dir, step, control, checkpoints)
    return Best(rule[0], value, step, checkpoint, rule[1])


def _checkpoint(model_dir: str, step: int, control: Any, evaluated: dict | None) -> str | None:
    """The checkpoint of `step` (module docstring), or None."""
    if evaluated is not None:
        return evaluated.get(step)
    return checkpoint_of(model_dir, step, exported=control is not None)


def checkpoint_of(model_dir: str, step: int, exported: bool = True) -> str | None:
    """`best/best_ckpt-<step>` of `model_dir` (when `exported`), else its `ckpt-<step>`, the
    first that exists; None when neither does. Eager."""
    candidates = [os.path.join(model_dir, f"ckpt-{step}")]
    if exported:
        candidates.insert(0, os.path.join(model_dir, "best", f"best_ckpt-{step}"))
    return next((c for c in candidates if files.exists(c + ".index")), None)
