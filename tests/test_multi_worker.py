"""`multi_worker_mirrored` through the local launcher: the real binary, 2 worker processes on CPU.

Two workers x one replica train and evaluate like one process with two mirrored replicas and the
same global batch (the digits input is an `IndexedInput`: replica r gets the r-th slice of each
global batch wherever it runs); only the chief keeps checkpoints, summaries and config; after a
worker is killed, the restarted job resumes from the chief's checkpoint to the same weights as an
uninterrupted run, and after both are killed one process carries on. With a `tf.data` shuffle
input each worker reads its own shard and saves its own position in the model directory.
"""

import os
import re
import signal

import numpy as np
import pytest

from tests import faults, launching

STEPS = 300  # ~4 s of training at ~70 steps/s: room to kill a worker after the first checkpoint
BUFFERED = ["orbitask.DigitsClassification.shuffle_buffer=256"]  # a tf.data shuffle input
ASYNC = ["orbitask.run_experiment.async_checkpoints=True"]


def _uninterrupted(tmp, extra=()):
    flags = launching.train_flags(tmp / "model", STEPS, extra, mode="train_and_eval")
    status, text = launching.run(["--workers", "2"], flags, tmp)
    assert status == 0, text[-3000:]
    return tmp


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """One uninterrupted 2-worker run; returns its folder (model/, tmp/, launch.log)."""
    return _uninterrupted(tmp_path_factory.mktemp("mw"))


@pytest.fixture(scope="module")
def uninterrupted_buffered(tmp_path_factory):
    """The same with a tf.data shuffle input."""
    return _uninterrupted(tmp_path_factory.mktemp("mw_buffered"), BUFFERED)


@pytest.mark.slow
def test_two_workers_train_like_two_mirrored_replicas(uninterrupted, tmp_path):
    single = tmp_path / "single"
    command = [*faults.command(single, replicas=2, steps=STEPS), "--mode=train_and_eval"]
    result = faults.run(command, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    # Both runs really had two replicas: one per worker (the chief says so), two in one process.
    assert faults.replicas_in(result.stdout) == [2]
    text = launching.output(uninterrupted)
    assert faults.replicas_in(text) == [2]
    assert re.search(r"^\[worker 0\] orbitask: \w+Strategy, 2 replicas \(", text, re.M)
    model = uninterrupted / "model"
    assert launching.latest_step(model) == STEPS
    workers, mirrored = faults.final_state(model), faults.final_state(single)
    assert workers.keys() == mirrored.keys() and workers
    for name in workers:
        np.testing.assert_allclose(workers[name], mirrored[name], rtol=1e-5, atol=1e-6)
    # Evaluation at the end: the chief aggregates every worker's replicas, as one process does.
    for tag in ("loss", "accuracy"):
        chief, one = launching.eval_scalars(model, tag), launching.eval_scalars(single, tag)
        assert list(chief) == [STEPS] and chief[STEPS] == pytest.approx(one[STEPS], rel=1e-5)

    # Both workers trained; only the chief's files remain, and the non-chief's temp folder is gone.
    assert f"[worker 0] step {STEPS}: loss" in text and f"[worker 1] step {STEPS}: loss" in text
    assert (model / "operative_config.gin").is_file() and (model / "train").is_dir()
    assert (model / f"ckpt-{STEPS}.index").is_file()
    assert os.listdir(uninterrupted / "tmp") == []


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra", [(), BUFFERED, BUFFERED + ASYNC], ids=["indexed", "tf.data", "tf.data-async"]
)
def test_killed_worker_restarts_the_job_which_resumes_exactly(
    uninterrupted, uninterrupted_buffered, tmp_path, extra
):
    """kill -9 of worker 1; the launcher kills worker 0 too (the whole job is dead), then runs
    the same command again: both workers restore the chief's checkpoint and their own input
    position, and the job ends at the right step with the uninterrupted run's weights, bit for
    bit (as on one machine). With async checkpoints the reference is still a synchronous run."""
    reference = uninterrupted_buffered if extra else uninterrupted
    model = tmp_path / "model"
    flags = launching.train_flags(model, STEPS, extra, mode="train_and_eval")
    proc = launching.start(["--workers", "2", "--max_restarts", "1"], flags, tmp_path)
    try:
        worker = launching.pid_of(tmp_path, "worker 1", proc)
        faults.wait_for_checkpoint(model, proc, min_step=20)
        os.kill(worker, signal.SIGKILL)
        proc.wait(timeout=240)
    finally:
        launching.stop(proc)
    text = launching.output(tmp_path)
    assert proc.returncode == 0, text[-3000:]
    assert "worker 1 exited with status 137; stopping the job" in text
    assert "restarting the job from its last checkpoint (1/1)" in text
    assert "[worker 1] orbitask: resumed from" in text  # non-chief restored the chief's checkpoint
    assert faults.replicas_in(text) == [2, 2]  # both runs of the job, on two replicas
    assert launching.latest_step(model) == STEPS
    faults.assert_identical(faults.final_state(model), faults.final_state(reference / "model"))
    assert "restarts from its beginning" not in text
    if extra:  # each worker's own iterator, for the newest 3 checkpoints only
        saved = sorted(os.listdir(model / "input" / f"ckpt-{STEPS}"))
        assert [n for n in saved if n.endswith(".index")] == [
            "worker-0-of-2.index",
            "worker-0-of-2.shuffle_seeds.index",  # the reshuffling shuffle's seed generator
            "worker-1-of-2.index",
            "worker-1-of-2.shuffle_seeds.index",
        ]
        assert len(os.listdir(model / "input")) == 3
    # The killed worker's temp checkpoint folder (no exit handlers ran) was emptied by the
    # restarted worker, which removed it at its own exit. (TensorFlow's autograph files of the
    # killed process do stay.)
    assert [n for n in os.listdir(tmp_path / "tmp") if n.startswith("orbitask-")] == []


@pytest.mark.slow
def test_two_killed_workers_resume_on_one_process(uninterrupted, tmp_path):
    """Both workers killed with SIGKILL after a checkpoint; the job goes on as one process with
    two replicas and ends with the uninterrupted 2-worker run's weights: the IndexedInput
    position counts global examples, so none is skipped or repeated."""
    model = tmp_path / "model"
    flags = launching.train_flags(model, STEPS, mode="train_and_eval")
    proc = launching.start(["--workers", "2"], flags, tmp_path)
    try:
        faults.wait_for_checkpoint(model, proc, min_step=40)
    finally:
        launching.stop(proc)
    killed_at = launching.latest_step(model)
    assert killed_at < STEPS
    command = [*faults.command(model, replicas=2, steps=STEPS), "--mode=train_and_eval"]
    result = faults.run(command, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resumed from {model}/ckpt-{killed_at}" in result.stdout
    assert "restarts from its beginning" not in result.stdout
    resumed, workers = faults.final_state(model), faults.final_state(uninterrupted / "model")
    assert resumed.keys() == workers.keys() and resumed
    for name in resumed:
        np.testing.assert_allclose(resumed[name], workers[name], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_damaged_state_file_resumes_both_workers_from_the_same_checkpoint(
    uninterrupted, tmp_path
):
    """Both workers killed after a checkpoint, the chief's state file garbled: the restarted job
    finds the checkpoints by their files on every worker (a worker that started afresh while the
    chief resumed would train other steps, or wait forever in a collective) and ends with the
    uninterrupted run's weights."""
    model = tmp_path / "model"
    flags = launching.train_flags(model, STEPS, mode="train_and_eval")
    proc = launching.start(["--workers", "2"], flags, tmp_path / "first")
    try:
        faults.wait_for_checkpoint(model, proc, min_step=40)
    finally:
        launching.stop(proc)
    killed_at = launching.latest_step(model)
    assert killed_at < STEPS
    (model / "checkpoint").write_bytes(b"model_checkpoint_path: ckpt-20 {")
    status, text = launching.run(["--workers", "2"], flags, tmp_path / "second")
    assert status == 0, text[-3000:]
    assert text.count(f"resumed from {model}/ckpt-{killed_at} (step {killed_at})") == 2, text
    assert "does not parse" in text
    faults.assert_identical(faults.final_state(model), faults.final_state(uninterrupted / "model"))


@pytest.mark.slow
@pytest.mark.parametrize("target", ["launcher", "worker 1"])
def test_sigterm_stops_every_worker_at_one_step_and_the_rerun_is_exact(
    uninterrupted, tmp_path, target
):
    """SIGTERM to the launcher (it relays it to each worker) or to worker 1 alone: both workers
    agree on the step, save it once, and exit 75, as does the launcher; the same command resumes
    both from that checkpoint and ends with the uninterrupted run's weights, bit for bit."""
    model = tmp_path / "model"
    flags = launching.train_flags(model, STEPS, mode="train_and_eval")
    proc = launching.start(["--workers", "2"], flags, tmp_path / "first")
    try:
        worker = launching.pid_of(tmp_path / "first", "worker 1", proc)
        faults.wait_for_checkpoint(model, proc, min_step=40)
        pid = proc.pid if target == "launcher" else worker
        text = launching.stop_with(proc, pid, tmp_path / "first")
    finally:
        launching.stop(proc)
    assert proc.returncode == 75, text[-3000:]
    stopped = launching.preempted(text, r"saved checkpoint (\S+) at step (\d+);")
    assert sorted(w for w, _, _ in stopped) == ["0", "1"], text[-3000:]
    (_, path, step), (_, other, same) = stopped
    assert (path, step) == (other, same) == (f"{model}/ckpt-{step}", step)
    assert int(step) < STEPS and launching.latest_step(model) == int(step)
    assert text.rstrip().endswith("run the same command again to resume it")
    status, resumed = launching.run(["--workers", "2"], flags, tmp_path / "second")
    assert status == 0, resumed[-3000:]
    assert resumed.count(f"resumed from {model}/ckpt-{step} (step {step})") == 2, resumed
    faults.assert_identical(faults.final_state(model), faults.final_state(uninterrupted / "model"))
