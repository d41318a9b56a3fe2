"""The loggers of tracking services, `'mlflow'` and `'wandb'` (`loggers` says what each
records): each keeps its run's id in a file of the model directory (`mlflow_run_id`,
`wandb_run_id`), so that a resumed run goes on in the same run.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping
from typing import Any

from orbitask.common import files
from orbitask.common.errors import one_line
from orbitask.trainers.errors import ConfigError
from orbitask.trainers.state import wandb_records
from orbitask.trainers.state.loggers import Logger, run_name


class MlflowLogger(Logger):
    """An MLflow run through `MlflowClient` (no global active run); resumed by its saved id."""

    name = "mlflow"

    def start(self, model_dir: str, params: Mapping[str, Any], step: int, resumed: bool) -> None:
        self.client = _mlflow_client()
        id_file = os.path.join(model_dir, "mlflow_run_id")
        self.run_id = _read(id_file)
        if self.run_id is not None:
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            name = run_name(model_dir)
            experiment = self.client.get_experiment_by_name("orbitask")
            experiment_id = (
                experiment.experiment_id
                if experiment is not None
                else self.client.create_experiment("orbitask")
            )
            self.run_id = self.client.create_run(experiment_id, run_name=name).info.run_id
            _write(id_file, self.run_id)
            from mlflow.entities import Param

            kept = [Param(key, str(value)[:500]) for key, value in params.items()]
            for i in range(0, len(kept), 100):  # one request per 100, MLflow's batch limit
                self.client.log_batch(self.run_id, params=kept[i : i + 100])

    def write(self, step: int, split: str, scalars: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        rows = [Metric(f"{split}/{k}", v, now, int(step)) for k, v in scalars.items()]
        self.client.log_batch(self.run_id, metrics=rows)  # one request a row

    def end(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status)


def _mlflow_client() -> Any:
    """An `MlflowClient` of the tracking store MLflow's settings name, its store reached.

    Raises:
      ConfigError: when MLflow cannot open that store (one line: what to set).
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = mlflow.get_tracking_uri()
    try:
        client = MlflowClient(uri)
        client.search_experiments(max_results=1)
    except Exception as e:  # noqa: BLE001 -- MLflow's errors vary by store and version
        hint = ""
        if "MLFLOW_ALLOW_FILE_STORE" in str(e):
            hint = "MLflow 3 opens a file store only with MLFLOW_ALLOW_FILE_STORE=true; "
        elif uri.startswith(("sqlite:", "postgresql", "mysql", "mssql")):
            hint = f"{uri.partition(':')[0]} stores need the full package (pip install mlflow); "
        raise ConfigError(
            f"the logger 'mlflow' cannot open MLflow's tracking store {uri!r}: {hint}set "
            "MLFLOW_TRACKING_URI to your tracking server (http://HOST:5000) or remove 'mlflow' "
            f"from orbitask.run_experiment.loggers ({one_line(e, 100)})"
        ) from e
    return client


class WandbLogger(Logger):
    """A W&B run, resumed by its saved id (`resume="allow"`); a resumed run first logs the
    rows of `metrics.jsonl` up to its checkpoint that W&B's record lacks (module docstring)."""

    name = "wandb"
    kept: tuple[int, int] | None = None  # the checkpoint's train and eval steps (`rewind`)

    def rewind(self, train_step: int, eval_step: int) -> None:
        self.kept = (train_step, eval_step)

    def start(self, model_dir: str, params: Mapping[str, Any], step: int, resumed: bool) -> None:
        import wandb

        id_file = os.path.join(model_dir, "wandb_run_id")
        # A W&B sweep's agent names the run it started (WANDB_RUN_ID).
        run_id = _read(id_file) or os.environ.get("WANDB_RUN_ID") or uuid.uuid4().hex[:8]
        _write(id_file, run_id)
        name = run_name(model_dir)
        self.run = wandb.init(
            id=run_id, name=name, dir=model_dir if files.is_local(model_dir) else None,
            config=dict(params), resume="allow",
            reinit="finish_previous",
        )  # fmt: skip
        if resumed and self.kept is not None:
            last = self.run.summary.get("_step")  # the last step W&B's server holds, if any
            root = os.path.dirname(os.path.dirname(os.path.dirname(self.run.dir)))  # of wandb/
            found = wandb_records.missing(model_dir, run_id, self.kept, last, root)
            for step, split, values in found:
                self.write(step, split, values)

    def write(self, step: int, split: str, scalars: Mapping[str, float]) -> None:
        self.run.log({f"{split}/{name}": value for name, value in scalars.items()}, step=step)

    def end(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)


def _read(path: str) -> str | None:
    return (files.read_text(path) or "").strip() or None


def _write(path: str, text: str) -> None:
    files.write_text(path, text + "\n")
