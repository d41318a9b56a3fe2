"""The `'ray'` logger: each row a run logs goes to Ray Tune or Ray Train, when the run is one's.

- Under `orbitask ray` (`run_on_ray`): the binary on each Ray worker writes each row, one JSON
  line, to the pipe its worker names (`ORBITASK_RAY_REPORTS_FD`), and the workers report it with
  `ray.train.report`. `orbitask ray` turns this logger on; naming it changes nothing there.
- Inside a Ray Tune trial or a Ray Train worker that runs `orbitask.run_experiment` itself:
  `ray.tune.report` or `ray.train.report`. Ray Train takes a report only when each of its
  workers makes it, and only the chief logs: a function of your own on several Ray Train workers
  runs on one, or uses `orbitask ray`.
- Anywhere else: nothing (one line says so), so one gin file runs inside Ray and outside.

A row is `{"step": step, "split": split, "<split>/<name>": value, ...}`: a train row's
`train/loss`, an evaluation's `eval/accuracy` (`eval/<set>/accuracy` for a named validation set),
so a Tune search's `metric="eval/accuracy"` names one. This module imports Ray only in a process
where Ray is already imported (a Ray worker).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from absl import logging

from orbitask.trainers.state.loggers import Logger

REPORTS_FD = "ORBITASK_RAY_REPORTS_FD"  # as `ray_train.REPORTS_FD`, which sets it


class RayLogger(Logger):
    """Each logged row to Ray Tune or Ray Train, when inside one (module docstring)."""

    name = "ray"

    def start(self, model_dir: str, params: Mapping[str, Any], step: int, resumed: bool) -> None:
        self.report = ray_report()
        if self.report is None:
            logging.info("the logger 'ray' reports nothing: this run is not inside Ray")

    def write(self, step: int, split: str, scalars: Mapping[str, float]) -> None:
        if self.report is not None:
            row = {"step": int(step), "split": split}
            row.update((f"{split}/{k}", float(v)) for k, v in scalars.items())
            self.report(row)


def ray_report() -> Callable[[dict], None] | None:
    """How a row reaches Ray here: the pipe of `orbitask ray`'s worker, the Tune or Train
    run's `report` (a Tune trial's or a Train worker's), or None outside Ray. Eager."""
    fd = os.environ.get(REPORTS_FD)
    if fd is not None:

        def send(row: dict) -> None:
            os.write(int(fd), (json.dumps(row) + "\n").encode())  # the worker reads lines

        return send
    if sys.modules.get("ray") is None:  # no Ray in this process: not inside a Ray run
        return None
    import ray.train
    import ray.tune

    try:
        ray.train.get_context()
    except DeprecationWarning:  # Ray's way of saying: a Tune trial
        return ray.tune.report
    except RuntimeError:  # not a Ray Train worker
        return None
    return ray.train.report
