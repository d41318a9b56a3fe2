"""Where a run's scalars go: `orbitask.run_experiment.loggers`, default `('tensorboard', 'jsonl')`.

Every scalar that goes to TensorBoard (train logs at each device loop's end, each evaluation,
the learning rate) also goes to each logger, keyed by step and split (`"train"`, `"eval"`, or
`"eval/<name>"` for several validation sets):

- `'tensorboard'`: the event files under `train/` and `eval/`, always written (images,
  histograms, profiles and callbacks' summaries live there), and in a training run the HParams
  plugin's data in `<model_dir>` itself (`TensorBoardHParams`): the settings as hparams, so
  TensorBoard's HPARAMS tab, pointed at a sweep's parent folder, compares its runs by their
  final evaluations;
- `'jsonl'`: `<model_dir>/metrics.jsonl` (`metrics_file`);
- `'csv'`: `<model_dir>/metrics.csv`, one row a value: `step,split,name,value`;
- `'mlflow'` (`tracking_loggers`): an MLflow run (where MLflow's own `MLFLOW_TRACKING_URI` says: a
  tracking server, `http://HOST:5000`), its id kept in `<model_dir>/mlflow_run_id` so that a resumed
  run goes on in it; the run's settings as its params; its end recorded as FINISHED, FAILED or
  KILLED (SIGTERM, Ctrl-C). `pip install 'orbitask[mlflow]'` installs MLflow's client alone
  (`mlflow-skinny`), which cannot open MLflow's default store (SQLite): without
  `MLFLOW_TRACKING_URI` the run is refused before step 1 in one line.
- `'wandb'` (`tracking_loggers`): a W&B run (W&B's own settings; `WANDB_MODE=offline` works without
  a network), resumed by its id in `<model_dir>/wandb_run_id`; the settings as its config.
  `pip install 'orbitask[wandb]'`. A new model directory's run takes `WANDB_RUN_ID` as its id (a
  W&B sweep's agent sets it).
- `'hypertune'`: each evaluation's scalars to Vertex AI's tuning service (`tuning_loggers`).
  `pip install 'orbitask[hypertune]'`.
- `'ray'`: each row to Ray Tune or Ray Train when the run is inside one (`ray_logger`);
  `orbitask ray` turns it on.
- a `Logger` of your own, bound in gin: `loggers = ['tensorboard', 'jsonl', @MyLogger()]`.

A training run resumed from a checkpoint rewinds the files to it (`rewind`), so that after a
kill -9 they hold each split and step once. MLflow and W&B keep the points a killed run wrote
past its checkpoint; the resumed run writes those steps again. A process killed with kill -9
loses what W&B had not yet written: a resumed run first logs the rows of `metrics.jsonl` (with
the `'jsonl'` logger) up to its checkpoint that W&B's record lacks (its offline files,
`wandb_records`, and the steps its server holds). A built-in logger that cannot start stops the
run before step 1 in one line naming it. Evaluation modes append to
`eval/metrics.jsonl` (and `eval/metrics.csv`) of their output folder only.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import os
from collections.abc import Mapping
from typing import Any

from absl import logging

from orbitask.common import files
from orbitask.common.errors import one_line
from orbitask.trainers.errors import ConfigError
from orbitask.trainers.state import metrics_file

BUILT_IN = ("tensorboard", "jsonl", "csv", "mlflow", "wandb", "hypertune", "ray")
_EXTRAS = {"mlflow": "mlflow", "wandb": "wandb", "hypertune": "hypertune"}


class Logger:
    """A place a run's scalars go. Subclass it, override what you need, and bind an instance
    in gin (`orbitask.run_experiment.loggers = ['tensorboard', 'jsonl', @MyLogger()]`). Each
    method is called eagerly by the chief of a training run."""

    def start(self, model_dir: str, params: Mapping[str, Any], step: int, resumed: bool) -> None:
        """Once, when training starts at `step` (`resumed`: from a checkpoint), with the run's
        settings as `params` (name -> value, values that are not numbers or text as text).
        Eager; returns None."""

    def write(self, step: int, split: str, scalars: Mapping[str, float]) -> None:
        """The scalars of `split` ("train", "eval", "eval/<name>") at `step`. Eager; returns
        None."""

    def rewind(self, train_step: int, eval_step: int) -> None:
        """A start from a checkpoint (any start, before `start`): drop what was written past
        these steps, if you can. Eager; returns None."""

    def end(self, status: str) -> None:
        """Once, when training ends: `status` is "FINISHED" (the last step, or an early stop),
        "KILLED" (SIGTERM, Ctrl-C) or "FAILED" (an error). Not called after kill -9. Eager;
        returns None."""


class JsonlLogger(Logger):
    """`<folder>/metrics.jsonl` (`metrics_file.MetricsFile`); `buffered` as there."""

    name = "jsonl"

    def __init__(self, folder: str, buffered: bool = True):
        self.file = metrics_file.MetricsFile(folder, buffered)

    def write(self, step: int, split: str, scalars: Mapping[str, float]) -> None:
        self.file.write(step, split, scalars)

    def rewind(self, train_step: int, eval_step: int) -> None:
        self.file.rewind(train_step, eval_step)

    def end(self, status: str) -> None:
        self.file.file.flush()  # on object storage, the lines since the last checkpoint


class CsvLogger(Logger):
    """`<folder>/metrics.csv`: a header `step,split,name,value`, then one row a value. On
    object storage in segments as `metrics.jsonl` (`files.Appender`, `buffered` as there):
    `pandas.read_csv(io.StringIO(files.read_appended(path)))` reads them as one."""

    name = "csv"

    def __init__(self, folder: str, buffered: bool = True):
        self.path = os.path.join(folder, "metrics.csv")
        self.file = files.Appender(self.path, buffered)

    def write(self, step: int, split: str, scalars: Mapping[str, float]) -> None:
        text = io.StringIO(newline="")
        writer = csv.writer(text)
        if not self.file.exists():
            writer.writerow(["step", "split", "name", "value"])
        writer.writerows([int(step), split, name, value] for name, value in scalars.items())
        self.file.append(text.getvalue())

    def rewind(self, train_step: int, eval_step: int) -> None:
        found = self.file.read()
        if found is None:
            return
        rows = list(csv.reader(io.StringIO(found, newline="")))
        kept = rows[:1] + [r for r in rows[1:] if _kept(r, train_step, eval_step)]
        if len(kept) != len(rows) or len(files.pieces(self.path)) > 1:
            text = io.StringIO(newline="")
            csv.writer(text).writerows(kept)
            self.file.rewrite(text.getvalue())

    def end(self, status: str) -> None:
        self.file.flush()  # on object storage, the rows since the last checkpoint


def _kept(row: list, train_step: int, eval_step: int) -> bool:
    try:
        step, split = int(row[0]), row[1]
    except (ValueError, IndexError):
        return False  # a row cut short by a kill
    return step <= (train_step if split == "train" else eval_step)


class TensorBoardHParams(Logger):
    """The HParams plugin's data: the settings as the run's hparams, in an events file of
    `<model_dir>` itself. The plugin takes the last value of each scalar under `train/` and
    `eval/` as the run's metrics (the final evaluation's, for eval ones). It shows a run's
    first hparams only, so each start replaces the file: a resumed run shows its own settings
    (each start's are kept in `operative_config-<step>.gin`)."""

    name = "tensorboard"

    def start(self, model_dir: str, params: Mapping[str, Any], step: int, resumed: bool) -> None:
        import tensorflow as tf
        from tensorboard.plugins.hparams import api as hp

        for old in tf.io.gfile.glob(os.path.join(model_dir, "events.out.tfevents.*")):
            tf.io.gfile.remove(old)
        writer = tf.summary.create_file_writer(model_dir)
        with writer.as_default():
            hp.hparams(dict(params), trial_id=run_name(model_dir))
        writer.close()


class Records:
    """The loggers of a run, written as one (the summary managers' `metrics`). Eager."""

    def __init__(self, loggers: list[Logger], model_dir: str, params: Mapping[str, Any]):
        self.loggers, self.model_dir, self.params = loggers, model_dir, params

    def start(self, step: int, resumed: bool, train_step: int, eval_step: int) -> None:
        """A training start: each logger rewound to the checkpoint's steps (a fresh run's: 0),
        then started. Eager; returns None.

        Raises:
          ConfigError: for a built-in logger that cannot start (naming it); a logger of your
            own raises what it raises.
        """
        for logger in self.loggers:
            logger.rewind(train_step, eval_step)
            try:
                logger.start(self.model_dir, self.params, step, resumed)
            except Exception as e:
                if isinstance(e, ConfigError) or not _built_in(logger):
                    raise
                raise ConfigError(
                    f"the logger {logger.name!r} cannot start: {one_line(e, 300)} (or remove "
                    f"{logger.name!r} from orbitask.run_experiment.loggers)"
                ) from e

    def end(self, ended: str) -> None:
        """Training ended (`ended`: "finished", or the name of the exception that stopped it):
        each logger's `end` with its status. A logger that fails there is logged, never raised
        over the run's own end. Eager; returns None."""
        status = "FINISHED" if ended in ("finished", "EarlyStop") else "FAILED"
        if ended in ("Preempted", "KeyboardInterrupt"):
            status = "KILLED"
        for logger in self.loggers:
            try:
                logger.end(status)
            except Exception as e:  # noqa: BLE001 -- the run's own outcome stands
                name = getattr(logger, "name", type(logger).__name__)
                logging.warning("the logger %s could not record the run's end: %s", name, e)

    def write(self, step: int, split: str, logs: Mapping[str, Any]) -> None:
        """The scalars of `logs` (none: nothing written) to every logger."""
        values = metrics_file.scalars(logs)
        if values:
            for logger in self.loggers:
                logger.write(step, split, values)

    def write_eval(self, step: int, logs: Mapping[str, Any]) -> None:
        """One evaluation's logs: `"eval"`, and `"eval/<name>"` per validation set."""
        self.write(step, "eval", logs)
        for name, one in logs.items():
            if isinstance(one, Mapping):
                self.write(step, f"eval/{name}", one)


def _built_in(logger: Logger) -> bool:
    """Whether `logger` is one of orbitask's own (not a user's)."""
    from orbitask.trainers.state.tracking_loggers import MlflowLogger, WandbLogger

    built = (JsonlLogger, CsvLogger, MlflowLogger, WandbLogger, TensorBoardHParams)
    return type(logger) in built


def build(loggers: Any, folder: str, training: bool) -> list[Logger]:
    """The loggers named or given in `loggers` writing under `folder`; an evaluation mode
    (`training` False) keeps only the files. Eager, before any work.

    Raises:
      ConfigError: for an unknown name, a list without 'tensorboard', or a logger whose package
        is not installed (naming the pip command).
    """
    loggers = list(loggers) if isinstance(loggers, (list, tuple)) else [loggers]
    names = [x for x in loggers if isinstance(x, str)]
    unknown = [x for x in names if x not in BUILT_IN] + [
        repr(x) for x in loggers if not isinstance(x, (str, Logger))
    ]
    if unknown:
        raise ConfigError(
            f"unknown logger {unknown[0]}: orbitask.run_experiment.loggers takes "
            f"{', '.join(repr(b) for b in BUILT_IN)} or an orbitask.Logger instance."
        )
    if "tensorboard" not in names:
        raise ConfigError(
            "orbitask.run_experiment.loggers must keep 'tensorboard': its event files also hold "
            "images, histograms, profiles and callbacks' summaries."
        )
    for name in names:
        if name in _EXTRAS and importlib.util.find_spec(_EXTRAS[name]) is None:
            raise ConfigError(
                f"the logger {name!r} needs its package: pip install 'orbitask[{name}]' (or "
                "remove it from orbitask.run_experiment.loggers)."
            )
    from orbitask.trainers.state.tracking_loggers import MlflowLogger, WandbLogger  # Logger's

    made = {"jsonl": JsonlLogger, "csv": CsvLogger, "mlflow": MlflowLogger, "wandb": WandbLogger}
    made["tensorboard"] = TensorBoardHParams
    from orbitask.trainers.state.tuning_loggers import HypertuneLogger  # it subclasses Logger

    made["hypertune"] = HypertuneLogger
    from orbitask.trainers.state import ray_logger

    made["ray"] = ray_logger.RayLogger
    if ray_logger.REPORTS_FD in os.environ and "ray" not in names:  # under `orbitask ray`
        loggers.append("ray")
    built = []
    for x in loggers:
        if x in ("jsonl", "csv"):
            built.append(made[x](folder, buffered=training))
        elif training:
            built.append(made[x]() if isinstance(x, str) else x)
    return built


def run_name(model_dir: str) -> str:
    """The run's name: the model directory's last part (`gs://b/runs/digits` -> `digits`)."""
    if files.is_local(model_dir):
        return os.path.basename(os.path.abspath(model_dir))
    return model_dir.rstrip("/").rpartition("/")[2]
