"""`parameter_server` through the local launcher: a chief (coordinator), workers and a ps, on CPU.

The digits experiment trains with `ClusterCoordinator.schedule`; killing a worker mid-run does
not lose the job; the job checkpoints, resumes (here on a smaller cluster) and evaluates on the
coordinator.
"""

import json
import os
import re
import shutil
import signal

import pytest
import tensorflow as tf

from tests import faults, launching

STEPS = 300  # ~5 s of training at ~65 steps/s: room to kill a worker after the first checkpoint
ASYNC = ["orbitask.run_experiment.async_checkpoints=True"]


@pytest.fixture(scope="module")
def killed_worker_run(tmp_path_factory):
    """A job of 2 workers and 1 ps whose worker 1 gets SIGKILL after the first checkpoint."""
    tmp = tmp_path_factory.mktemp("ps")
    model = tmp / "model"
    proc = launching.start(
        ["--workers", "2", "--ps", "1"], launching.train_flags(model, STEPS), tmp
    )
    try:
        worker = launching.pid_of(tmp, "worker 1", proc)
        faults.wait_for_checkpoint(model, proc, min_step=20)
        os.kill(worker, signal.SIGKILL)
        killed_at = launching.latest_step(model)
        proc.wait(timeout=240)
    finally:
        launching.stop(proc)
    return tmp, proc.returncode, killed_at


@pytest.mark.slow
def test_killing_a_worker_does_not_lose_the_job(killed_worker_run):
    tmp, status, killed_at = killed_worker_run
    text = launching.output(tmp)
    assert status == 0, text[-3000:]
    assert killed_at < STEPS
    assert "worker 1 exited with status 137; continuing without it" in text
    # The coordinator saw the failure and ran that worker's closures on the other one.
    assert "Worker /job:worker/replica:0/task:1 failed" in text
    assert f"[chief] step {STEPS}: loss" in text
    assert launching.latest_step(tmp / "model") == STEPS


def _input_position(checkpoint):
    reader = tf.train.load_checkpoint(str(checkpoint))
    return json.loads(reader.get_tensor("input_position/.ATTRIBUTES/py_state"))


def _eval_line(text):
    return re.findall(r"^\[chief\] orbitask: eval at step .*$", text, re.M)[-1]


@pytest.mark.slow
def test_the_job_resumes_from_its_checkpoint_and_evaluates(killed_worker_run, tmp_path):
    """The resumed job saves asynchronously: its final checkpoint holds the weights it
    evaluated at the end (evaluating the checkpoint again gives the same line) and the input
    position of that step."""
    model = shutil.copytree(killed_worker_run[0] / "model", tmp_path / "model")
    # The digits input is an IndexedInput: its position is the count of examples taken (64 a step).
    position = _input_position(model / f"ckpt-{STEPS}")
    assert position["style"] == "indexed" and position["examples"] == 64 * STEPS
    extra = ["orbitask.run_experiment.eval_interval=20", *ASYNC]
    flags = launching.train_flags(model, STEPS + 40, extra, mode="train_and_eval")
    status, text = launching.run(["--workers", "1", "--ps", "1"], flags, tmp_path)
    assert status == 0, text[-3000:]
    assert f"[chief] orbitask: resumed from {model}/ckpt-{STEPS} (step {STEPS})" in text
    assert launching.latest_step(model) == STEPS + 40
    assert "restarts from its beginning" not in text
    accuracy = launching.eval_scalars(model, "accuracy")
    assert sorted(accuracy) == [STEPS + 20, STEPS + 40]
    assert accuracy[STEPS + 40] > 0.8  # 10 classes; the resumed weights are trained ones
    assert _input_position(model / f"ckpt-{STEPS + 40}")["examples"] == 64 * (STEPS + 40)

    flags = launching.train_flags(model, STEPS + 40, mode="eval")
    status, again = launching.run(["--workers", "1", "--ps", "1"], flags, tmp_path / "eval")
    assert status == 0, again[-3000:]
    assert _eval_line(again) == _eval_line(text)
