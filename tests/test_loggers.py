"""`run_experiment.loggers`: the scalars of a run in a CSV file, in MLflow (a tracking server
and its file store), in W&B (offline, a kill -9 included) and in a logger of your own, each
resumed as the run is; mistakes in one line."""

import csv
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

import orbitask
from orbitask.trainers.state import loggers, metrics_file, wandb_records
from tests import faults
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


class Stops(DiesAt):
    """Raises `error` after step `at` (a user's Ctrl-C, or a bug)."""

    def __init__(self, at, error, **kwargs):
        super().__init__(**kwargs)
        self.stop = (at, error)

    def at_step(self):
        def stop(task, ctx):
            raise self.stop[1]

        return {self.stop[0]: stop}


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` on an SQLite store, on a free port of 127.0.0.1: its URL."""
    folder = tmp_path_factory.mktemp("mlflow")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [os.path.join(os.path.dirname(sys.executable), "mlflow"), "server", "--host",
               "127.0.0.1", "--port", str(port), "--workers", "1",
               "--backend-store-uri", f"sqlite:///{folder}/mlflow.db",
               "--default-artifact-root", str(folder / "artifacts")]  # fmt: skip
    log = open(folder / "server.log", "w")  # noqa: SIM115 -- closed below
    server = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError((folder / "server.log").read_text()[-3000:]) from None
            time.sleep(0.2)
    yield url
    os.killpg(server.pid, signal.SIGKILL)  # the server and the workers it started
    server.wait(timeout=30)
    log.close()


@pytest.mark.slow  # a tracking server
def test_mlflow_logs_to_a_tracking_server_and_records_each_runs_end(mlflow_server, tmp_path,
                                                                    monkeypatch):  # fmt: skip
    """Over HTTP to `mlflow server`, read back through MlflowClient: the settings, every
    point, and the end of each start (FINISHED, then KILLED by a Ctrl-C, then FAILED)."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    both = ["tensorboard", "mlflow"]
    client = MlflowClient(mlflow_server)
    _run(DiesAt(), tmp_path, train_steps=4, loggers=both)
    run_id = (tmp_path / "mlflow_run_id").read_text().strip()
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["global_batch_size"] == "8"
    with pytest.raises(KeyboardInterrupt):
        _run(Stops(6, KeyboardInterrupt()), tmp_path, train_steps=8, loggers=both)
    assert client.get_run(run_id).info.status == "KILLED"
    with pytest.raises(ValueError, match="a bug"):
        _run(Stops(10, ValueError("a bug")), tmp_path, train_steps=12, loggers=both)
    assert client.get_run(run_id).info.status == "FAILED"
    history = client.get_metric_history(run_id, "train/loss")
    assert sorted({m.step for m in history}) == [2, 4, 6, 8]  # (the bug ended step 10's loop)
    assert sorted({m.step for m in client.get_metric_history(run_id, "eval/loss")}) == [4, 8]
    experiment = client.get_experiment_by_name("orbitask").experiment_id
    assert [r.info.run_id for r in client.search_runs([experiment])] == [run_id]  # one run


def test_mlflow_without_a_store_it_can_open_is_refused_before_step_1_in_one_line(
    tmp_path, monkeypatch
):
    """MLflow 3 opens a file store only with MLFLOW_ALLOW_FILE_STORE=true (mlflow-skinny, the
    `mlflow` extra, opens no SQLite store either): one line says what to set."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(orbitask.ConfigError) as refused:
        _run(DiesAt(), tmp_path / "run", loggers=["tensorboard", "mlflow"])
    message = str(refused.value).splitlines()[0]  # (gin adds a line naming run_experiment)
    assert message.startswith("the logger 'mlflow' cannot open"), message
    assert "MLFLOW_ALLOW_FILE_STORE=true" in message and "set MLFLOW_TRACKING_URI" in message
    assert not list((tmp_path / "run").glob("ckpt-*"))
    assert not metrics_file.read(str(tmp_path / "run" / "metrics.jsonl"))


def test_a_built_in_logger_that_cannot_start_is_named_in_one_line(tmp_path, monkeypatch):
    """W&B online without a key (no network here either): the run stops before step 1."""
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_API_KEY", "")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "5")
    import wandb

    try:
        with pytest.raises(orbitask.ConfigError) as refused:
            _run(DiesAt(), tmp_path, loggers=["tensorboard", "wandb"])
    finally:
        wandb.teardown()  # W&B keeps its settings per process: online, without a key
    message = str(refused.value).splitlines()[0]  # (gin adds a line naming run_experiment)
    assert message.startswith("the logger 'wandb' cannot start: "), message
    assert message.endswith("(or remove 'wandb' from orbitask.run_experiment.loggers)")
    assert not list(tmp_path.glob("ckpt-*"))


@pytest.mark.slow  # the binary, killed
def test_wandb_offline_keeps_every_step_after_a_kill_9_and_a_resume(tmp_path, monkeypatch):
    """Killed (kill -9) after step 50, its checkpoint at 40: W&B's offline files, read back,
    hold every row of metrics.jsonl once (the killed process's file lost its rows)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    extra = ["orbitask.run_experiment.loggers = ['tensorboard', 'jsonl', 'wandb']",
             "orbitask.run_experiment.steps_per_loop = 10",
             "orbitask.run_experiment.loop_seconds = None"]  # fmt: skip
    cmd = faults.command(tmp_path, steps=60, extra=extra)
    proc, out = faults.kill_after_line(cmd, random.Random(0), steps=(50,))
    assert proc.returncode == -signal.SIGKILL, out
    done = faults.run(cmd)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    logged = {}  # step -> the history row W&B holds there, from every process's file
    for path in wandb_records.run_files(str(tmp_path), run_id):
        for row in wandb_records.history(path):
            assert row["_step"] not in logged, row  # each step once
            logged[row["_step"]] = row
    rows = metrics_file.read(str(tmp_path / "metrics.jsonl"))
    assert max(r["step"] for r in rows) == 60 and len(rows) >= 6
    for row in rows:
        held = logged[row["step"]]
        for name, value in row.items():
            if name not in ("step", "split"):
                assert held[f"{row['split']}/{name}"] == pytest.approx(value), (row, held)


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
