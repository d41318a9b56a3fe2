"""Ray Train as the engine: `orbitask ray` on a real local Ray cluster, and the 'ray' logger.

The slow test starts `orbitask ray --workers 2 --max_failures 1` on this machine's CPUs: the
local cluster lives in a loopback-only network namespace, every row the chief logs is reported
to Ray by both workers, a Ray worker killed with SIGKILL after a checkpoint is started again by
Ray's FailureConfig, the run resumes from the model directory and ends with the weights of an
uninterrupted 2-worker run (`orbitask launch`, the same topology), bit for bit, and no process
of the cluster is left. The quick tests use the logger's pipe as `orbitask ray`'s workers do,
stand-ins for Ray's report functions, and a Python where `import ray` fails.
"""

import ast
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import pytest

from orbitask.trainers import run_experiment
from orbitask.trainers.commands import cli
from orbitask.trainers.state import metrics_file, ray_logger
from tests import faults, launching
from tests.helpers import TinyTask

STEPS = 300  # as tests/test_multi_worker.py: room to kill a worker after the first checkpoint


def _tiny_run(model_dir, loggers):
    run_experiment(
        TinyTask(), str(model_dir), mode="train_and_eval", train_steps=20, global_batch_size=8,
        steps_per_loop=10, loop_seconds=None, eval_interval=10, progress=False, loggers=loggers,
    )  # fmt: skip


def _expected(model_dir) -> dict:
    """`{(step, split): {"<split>/<name>": value}}` of the run's metrics.jsonl."""
    rows = metrics_file.read(os.path.join(model_dir, "metrics.jsonl"))
    return {
        (r["step"], r["split"]): {
            f"{r['split']}/{k}": v for k, v in r.items() if k not in ("step", "split")
        }
        for r in rows
    }


def _keyed(reports: list[dict]) -> dict:
    """The same keying of reported rows (the last report of a step and split wins)."""
    return {
        (r["step"], r["split"]): {k: v for k, v in r.items() if k not in ("step", "split")}
        for r in reports
    }


def test_under_orbitask_ray_each_row_goes_to_the_workers_pipe(tmp_path, monkeypatch):
    """The binary on `orbitask ray`'s worker: the 'ray' logger is on without being named, and
    each row of metrics.jsonl is written to the pipe, one JSON line a row."""
    read, write = os.pipe()
    monkeypatch.setenv(ray_logger.REPORTS_FD, str(write))
    try:
        _tiny_run(tmp_path / "run", ["tensorboard", "jsonl"])
    finally:
        os.close(write)
    with os.fdopen(read) as pipe:
        lines = pipe.read().splitlines()
    assert _keyed([json.loads(line) for line in lines]) == _expected(tmp_path / "run")
    assert len(lines) == len(_expected(tmp_path / "run")) > 2


def _stand_in_ray(monkeypatch, in_tune: bool, in_train: bool) -> list:
    """`ray`, `ray.train` and `ray.tune` as a Ray run would have them; returns the reports."""
    reports: list = []
    train, tune = types.ModuleType("ray.train"), types.ModuleType("ray.tune")

    def get_context():
        if in_tune:  # what Ray Train's get_context raises in a Tune trial
            raise DeprecationWarning("`ray.train.get_context` is deprecated in Tune")
        if not in_train:
            raise RuntimeError("`get_context` cannot be used outside of a Ray Train function")

    train.get_context = get_context
    train.report = lambda row: reports.append(("train", row))
    tune.report = lambda row: reports.append(("tune", row))
    ray = types.ModuleType("ray")
    ray.train, ray.tune = train, tune
    for name, module in (("ray", ray), ("ray.train", train), ("ray.tune", tune)):
        monkeypatch.setitem(sys.modules, name, module)
    return reports


@pytest.mark.parametrize(
    "in_tune, in_train, where",
    [(True, False, "tune"), (False, True, "train"), (False, False, None)],
    ids=["tune-trial", "train-worker", "ray-outside-a-run"],
)
def test_the_ray_logger_reports_to_the_ray_run_it_runs_in(
    tmp_path, monkeypatch, in_tune, in_train, where
):
    monkeypatch.delenv(ray_logger.REPORTS_FD, raising=False)
    reports = _stand_in_ray(monkeypatch, in_tune, in_train)
    _tiny_run(tmp_path / "run", ["tensorboard", "jsonl", "ray"])
    assert {kind for kind, _ in reports} == ({where} if where else set())
    if where:
        assert _keyed([row for _, row in reports]) == _expected(tmp_path / "run")


def test_without_ray_the_logger_reports_nothing_and_no_module_imports_ray(tmp_path, monkeypatch):
    """`import ray` fails in this process (as where Ray is not installed): a run naming 'ray'
    trains all the same."""
    monkeypatch.delenv(ray_logger.REPORTS_FD, raising=False)
    monkeypatch.setitem(sys.modules, "ray", None)
    _tiny_run(tmp_path / "run", ["tensorboard", "jsonl", "ray"])
    assert launching.latest_step(tmp_path / "run") == 20


def test_without_ray_orbitask_ray_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails; find_spec finds none
    status = cli.main(["ray", "--workers", "2", "--", "--gin_file=experiments/digits.gin"])
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "orbitask ray: error: running on Ray needs Ray Train: pip install 'orbitask[ray]'"
    )


def test_orbitask_ray_flag_mistakes_are_one_line(capsys):
    assert cli.main(["ray", "--workers", "0", "--", "--gin_file=x"]) == 2
    assert capsys.readouterr().err.strip() == (
        "orbitask ray: error: --workers must be >= 1; received 0. See `orbitask ray --help`."
    )


# ---------------------------------------------------------------- a real local Ray cluster


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """An uninterrupted 2-worker run through `orbitask launch`; returns its model directory."""
    tmp = tmp_path_factory.mktemp("ray_reference")
    flags = launching.train_flags(tmp / "model", STEPS, mode="train_and_eval")
    status, text = launching.run(["--workers", "2"], flags, tmp)
    assert status == 0, text[-3000:]
    return tmp / "model"


def _in_namespace(namespace: str) -> list[int]:
    """The pids of the processes in the network namespace `namespace` (`net:[inode]`)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.readlink(f"/proc/{entry}/ns/net") == namespace:
                found.append(int(entry))
        except OSError:  # ended meanwhile
            pass
    return found


def _worker_pid(log: Path, rank: int, proc, timeout=240) -> int:
    """The pid Ray Train's controller names for the worker of `rank`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.findall(rf"pid=(\d+)\) world_rank={rank},", log.read_text(errors="replace"))
        if found:
            return int(found[-1])
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        time.sleep(0.1)
    raise AssertionError(f"Ray's worker {rank} never started")


def _reports(text: str) -> list[dict]:
    """The rows Ray's workers reported, as rank 0 logged them (Ray's own INFO line)."""
    line = r"Reporting training result \d+: TrainingReport\(checkpoint=None, metrics=(\{.*?\}), "
    return [ast.literal_eval(m) for m in re.findall(line + r"validation=\w+\) from rank 0", text)]


def _ended(proc, namespace) -> list[int]:
    """Teardown: the driver ended (else killed with its process group), then each process it started
    and each process of its network namespace (None: none; never this test's); returns those
    that outlived the driver's end by 20 seconds."""
    import psutil

    try:
        started = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        started = []
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    if namespace == os.readlink("/proc/self/ns/net"):
        namespace = None
    deadline = time.monotonic() + 20
    left: list[int] = []
    while time.monotonic() < deadline:
        alive = {p.pid for p in started if p.is_running()}
        left = sorted(alive | set(_in_namespace(namespace) if namespace else []))
        if not left:
            break
        time.sleep(0.2)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="pip install 'orbitask[ray]'")
def test_a_killed_ray_worker_is_restarted_and_the_run_resumes_exactly(uninterrupted, tmp_path):
    model, log = tmp_path / "model", tmp_path / "ray.log"
    ray_tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # its sockets' paths must stay short
    env = launching.env(tmp_path / "tmp")
    env.update(HOME=str(tmp_path / "home"), RAY_DEDUP_LOGS="0")  # Ray's token goes in ~/.ray
    ray_args = ["--workers", "2", "--max_failures", "1", "--temp_dir", ray_tmp]
    command = [sys.executable, "-m", "orbitask.trainers.commands.cli", "ray", *ray_args]
    command += ["--storage_path", str(tmp_path / "ray_results"), "--"]
    command += launching.train_flags(model, STEPS, mode="train_and_eval")
    with open(log, "w") as out:
        proc = subprocess.Popen(
            command, cwd=launching.REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    namespace = None
    try:
        worker = _worker_pid(log, 1, proc)
        found = os.readlink(f"/proc/{proc.pid}/ns/net")
        assert found != os.readlink("/proc/self/ns/net")  # the cluster's own network
        namespace = found  # only now: the teardown ends every process in it
        faults.wait_for_checkpoint(model, proc, min_step=20, timeout=240)
        # Loopback only: every process of the cluster is in that namespace, whose only
        # interface is loopback, and none of its ports is reachable from here.
        members = set(_in_namespace(namespace))
        assert {proc.pid, worker} <= members and len(members) > 4
        with open(f"/proc/{proc.pid}/net/dev") as f:
            assert [line.split(":")[0].strip() for line in f.readlines()[2:]] == ["lo"]
        ports = launching.listening(proc.pid)
        assert ports and not ports & launching.listening("self")
        os.kill(worker, signal.SIGKILL)
        proc.wait(timeout=400)
    finally:
        left = _ended(proc, namespace)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    text = log.read_text(errors="replace")
    assert proc.returncode == 0, text[-5000:]
    assert left == [], "processes of the Ray cluster outlived `orbitask ray`"
    assert "orbitask ray: the run finished" in text
    assert re.search(r"orbitask: resumed from \S+/ckpt-\d+", text)  # Ray started them again
    assert launching.latest_step(model) == STEPS
    faults.assert_identical(faults.final_state(model), faults.final_state(uninterrupted))
    reported = _keyed(_reports(text))  # each row of metrics.jsonl, as reported last
    assert reported == _expected(model)
