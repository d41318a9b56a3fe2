"""Loggers for search services that start the binary for each trial themselves.

- `'hypertune'` (`HypertuneLogger`): Vertex AI's hyperparameter tuning service reads a trial's
  metric through `cloudml-hypertune` (`pip install 'orbitask[hypertune]'`), which writes the
  reports to the file the service names (`CLOUD_ML_HP_METRIC_FILE`, default
  `/tmp/hypertune/output.metrics`). Each evaluation's scalars are reported, each tagged by its
  eval log's name (`accuracy`, a validation set's `valid/accuracy`), at its step, so the
  service's `metricId` names one of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orbitask.trainers.state.loggers import Logger


class HypertuneLogger(Logger):
    """Each evaluation's scalars to Vertex AI's tuning service (module docstring)."""

    name = "hypertune"

    def start(self, model_dir: str, params: Mapping[str, Any], step: int, resumed: bool) -> None:
        import hypertune

        self.reports = hypertune.HyperTune()

    def write(self, step: int, split: str, scalars: Mapping[str, float]) -> None:
        head, _, name = split.partition("/")
        if head != "eval":
            return
        for key, value in scalars.items():
            self.reports.report_hyperparameter_tuning_metric(
                hyperparameter_metric_tag=f"{name}/{key}" if name else key,
                metric_value=value,
                global_step=int(step),
            )
