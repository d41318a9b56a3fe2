"""SLURM: two local processes with a simulated job step's environment (no TF_CONFIG) build the
multi-worker cluster themselves and train as 2 workers; `slurm.tf_config` reads the same
environment as `srun` sets it."""

import json
import os
import socket
import subprocess
import sys

import pytest

from tests import faults, launching

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _two_free_ports() -> int:
    """A port p with p and p+1 free on 127.0.0.1 (free when asked)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", base))
                b.bind(("127.0.0.1", base + 1))
                return base
            except OSError:
                continue
    raise AssertionError("no two consecutive free ports")


def _slurm_env(rank: int, port: int, tmp) -> dict:
    env = launching.env(tmp)
    env.pop("TF_CONFIG", None)
    env.update(
        SLURM_PROCID=str(rank),
        SLURM_STEP_NUM_TASKS="2",
        SLURM_STEP_NODELIST="localhost",
        SLURM_STEP_TASKS_PER_NODE="2",
        ORBITASK_SLURM_PORT=str(port),
    )
    return env


@pytest.mark.slow
def test_the_cluster_comes_from_slurms_environment():
    code = (
        "import json; from orbitask.trainers.distribution import slurm; "
        "print(json.dumps(slurm.tf_config()))"
    )
    env = _slurm_env(1, 9000, os.environ.get("TMPDIR", "/tmp"))
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    config = json.loads(out.stdout.strip().splitlines()[-1])
    assert config == {
        "cluster": {"worker": ["localhost:9000", "localhost:9001"]},
        "task": {"type": "worker", "index": 1},
    }


@pytest.mark.slow
def test_two_slurm_tasks_train_as_two_workers(tmp_path):
    port = _two_free_ports()
    model = tmp_path / "model"
    command = faults.command(
        model, steps=40, extra=["orbitask.run_experiment.strategy='multi_worker_mirrored'"]
    )
    procs = [
        subprocess.Popen(
            command,
            cwd=REPO,
            env=_slurm_env(rank, port, tmp_path / f"task{rank}"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=240)[0])
    finally:
        for proc in procs:
            proc.kill()
    for proc, text in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, text[-3000:]
    assert faults.replicas_in(outputs[0]) == [2]  # the chief: 2 replicas, one per task
    assert launching.latest_step(model) == 40
