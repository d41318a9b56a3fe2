"""`run_experiment.loggers`: the scalars of a run in a CSV file, in MLflow (its file store), in
W&B (offline) and in a logger of your own, each resumed as the run is; mistakes in one line."""

import csv
import os

import pytest

import orbitask
from orbitask.trainers.state import loggers, metrics_file
from tests.helpers import DiesAt, Killed
from tests.test_metrics_file import _run  # 12 steps: loops of 2, checkpoints and evaluations at 4


class Recorder(orbitask.Logger):
    """A logger of one's own: keeps what it is given."""

    def __init__(self):
        self.starts, self.rows = [], []

    def start(self, model_dir, params, step, resumed):
        self.starts.append((step, resumed, params["global_batch_size"]))

    def write(self, step, split, scalars):
        self.rows.append((step, split, dict(scalars)))


def _csv(model_dir) -> list[tuple]:
    with open(model_dir / "metrics.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["step", "split", "name", "value"]
    return [(int(s), split, name, float(v)) for s, split, name, v in rows[1:]]


def test_csv_and_a_logger_of_ones_own_get_what_the_jsonl_file_gets(tmp_path):
    recorder = Recorder()
    _run(DiesAt(), tmp_path, loggers=["tensorboard", "jsonl", "csv", recorder])
    jsonl = [
        (r["step"], r["split"], name, value)
        for r in metrics_file.read(str(tmp_path / "metrics.jsonl"))
        for name, value in r.items()
        if name not in ("step", "split")
    ]
    assert _csv(tmp_path) == jsonl
    assert recorder.starts == [(0, False, 8)]
    assert [(s, split) for s, split, _ in recorder.rows if split == "eval"] == [
        (4, "eval"),
        (8, "eval"),
        (12, "eval"),
    ]
    assert {"loss", "learning_rate"} <= set(recorder.rows[0][2])


def test_a_killed_and_resumed_run_rewinds_the_csv_file(tmp_path):
    """Killed after step 11 (checkpoint 8) and resumed: the CSV file is an uninterrupted run's,
    the clock's figure (steps/s) aside."""
    both = ["tensorboard", "csv"]
    _run(DiesAt(), tmp_path / "whole", loggers=both)
    with pytest.raises(Killed):
        _run(DiesAt(at=11), tmp_path / "split", loggers=both)
    _run(DiesAt(), tmp_path / "split", loggers=both)

    def timeless(folder):
        return [r for r in _csv(folder) if r[2] != "steps_per_second"]

    assert timeless(tmp_path / "split") == timeless(tmp_path / "whole")
    assert not (tmp_path / "split" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_mlflow_gets_the_settings_once_and_a_resumed_run_goes_on_in_the_same_run(
    tmp_path, monkeypatch
):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow's file store, as it is
    model_dir = tmp_path / "run"
    _run(DiesAt(), model_dir, train_steps=8, loggers=["tensorboard", "mlflow"])
    _run(DiesAt(), model_dir, train_steps=12, loggers=["tensorboard", "mlflow"])
    run_id = (model_dir / "mlflow_run_id").read_text().strip()
    client = MlflowClient()
    (run,) = client.search_runs([client.get_experiment_by_name("orbitask").experiment_id])
    assert run.info.run_id == run_id
    assert run.data.params["global_batch_size"] == "8"
    history = client.get_metric_history(run_id, "train/loss")
    assert sorted({m.step for m in history}) == [2, 4, 6, 8, 10, 12]
    assert [m.step for m in client.get_metric_history(run_id, "eval/loss")] == [4, 8, 12]


@pytest.mark.slow
def test_wandb_offline_writes_a_run_and_resumes_it(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    model_dir = tmp_path / "run"
    for steps in (8, 12):
        _run(DiesAt(), model_dir, train_steps=steps, loggers=["tensorboard", "wandb"])
    run_id = (model_dir / "wandb_run_id").read_text().strip()
    runs = [d for d in os.listdir(model_dir / "wandb") if d.startswith("offline-run-")]
    assert len(runs) == 2 and all(d.endswith(run_id) for d in runs), runs
    import wandb

    wandb.finish()


@pytest.mark.parametrize(
    "given, refused",
    [
        (["tensorboard", "excel"], r"^unknown logger excel: orbitask.run_experiment.loggers takes"),
        (["jsonl"], r"^orbitask.run_experiment.loggers must keep 'tensorboard'"),
    ],
)
def test_a_wrong_logger_is_refused_in_one_line(tmp_path, given, refused):
    with pytest.raises(orbitask.ConfigError, match=refused):
        _run(DiesAt(), tmp_path, loggers=given)


def test_a_logger_without_its_package_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setitem(loggers._EXTRAS, "mlflow", "a_package_that_is_not_installed")
    with pytest.raises(orbitask.ConfigError, match=r"pip install 'orbitask\[mlflow\]'"):
        _run(DiesAt(), tmp_path, loggers=["tensorboard", "mlflow"])
    assert not list(tmp_path.glob("ckpt-*"))


def _session_groups(logdir) -> dict[str, tuple[dict, dict]]:
    """TensorBoard's HPARAMS tab over `logdir`, read by the plugin's own handler: each session's
    hparams and metrics (`"eval/accuracy"` -> the last value)."""
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import api_pb2, backend_context, list_session_groups

    mux = plugin_event_multiplexer.EventMultiplexer()
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, str(logdir))
    tb = base_plugin.TBContext(logdir=str(logdir), data_provider=provider, multiplexer=mux)
    request = api_pb2.ListSessionGroupsRequest(
        allowed_statuses=[api_pb2.STATUS_UNKNOWN], aggregation_type=api_pb2.AGGREGATION_AVG,
        include_metrics=True, start_index=0, slice_size=10,
    )  # fmt: skip
    handler = list_session_groups.Handler(
        context.RequestContext(), backend_context.Context(tb), "", request
    )
    groups = {}
    for group in handler.run().session_groups:
        hparams = {k: getattr(v, v.WhichOneof("kind")) for k, v in group.hparams.items()}
        metrics = {f"{m.name.group}/{m.name.tag}": m.value for m in group.metric_values}
        groups[group.name] = (hparams, metrics)
    return groups


@pytest.mark.slow  # three runs
def test_tensorboards_hparams_tab_compares_a_sweeps_runs(tmp_path):
    """Two runs of a sweep, one resumed with a longer schedule: the HPARAMS tab shows each run
    once, with the settings it ran with and its final evaluation."""
    _run(DiesAt(), tmp_path / "fast", learning_rate=0.1)
    _run(DiesAt(), tmp_path / "slow", learning_rate=0.01, train_steps=8)
    _run(DiesAt(), tmp_path / "slow", learning_rate=0.01)
    groups = _session_groups(tmp_path)
    assert sorted(groups) == ["fast", "slow"]
    for name, rate in (("fast", 0.1), ("slow", 0.01)):
        hparams, metrics = groups[name]
        assert hparams["learning_rate"] == pytest.approx(rate)
        assert hparams["train_steps"] == 12 and hparams["global_batch_size"] == 8
        last = [r for r in metrics_file.read(str(tmp_path / name / "metrics.jsonl"))
                if r["split"] == "eval"][-1]  # fmt: skip
        assert last["step"] == 12
        assert metrics["eval/accuracy"] == pytest.approx(last["accuracy"])
        assert metrics["eval/loss"] == pytest.approx(last["loss"])
