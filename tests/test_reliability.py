"""Nothing lost, nothing silent: kill -9, SIGTERM and Ctrl-C resume exactly; determinism;
corruption."""

import random
import re
import shutil
import signal
import sys

import pytest
import tensorflow as tf

from tests import faults

STEPS = 600


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [1, 2])
def test_kill_9_then_restart_gives_bit_identical_weights(tmp_path, replicas):
    reference = tmp_path / "uninterrupted"
    # Each run's start line says how many replicas it really had.
    done = faults.run(faults.command(reference, replicas, STEPS))
    assert done.returncode == 0, done.stderr[-2000:]
    assert faults.replicas_in(done.stdout) == [replicas]

    model_dir = tmp_path / "killed"
    cmd = faults.command(model_dir, replicas, STEPS)
    rng = random.Random(replicas)
    killed, output = faults.kill_after_line(cmd, rng)
    assert killed.returncode == -signal.SIGKILL
    assert faults.replicas_in(output) == [replicas]
    stopped_at = tf.train.latest_checkpoint(str(model_dir))
    assert not stopped_at.endswith(f"-{STEPS}"), "the kill came too late to test anything"

    resumed = faults.run(cmd)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert faults.replicas_in(resumed.stdout) == [replicas]
    assert tf.train.latest_checkpoint(str(model_dir)).endswith(f"-{STEPS}")
    faults.assert_identical(faults.final_state(reference), faults.final_state(model_dir))


@pytest.mark.slow
def test_two_fresh_deterministic_runs_are_identical(tmp_path):
    for name in ("a", "b"):
        done = faults.run(faults.command(tmp_path / name, 1, 60))
        assert done.returncode == 0, done.stderr[-2000:]
    faults.assert_identical(faults.final_state(tmp_path / "a"), faults.final_state(tmp_path / "b"))


OP_DETERMINISM_PROBE = """
import sys
import tensorflow as tf
from orbitask.trainers import run_experiment
from tests.helpers import TinyTask

def unseeded_random_allowed():
    try:
        tf.random.Generator.from_non_deterministic_state()
    except RuntimeError:  # refused while op determinism is on
        return False
    return True

print("before", unseeded_random_allowed())
run_experiment(TinyTask(), sys.argv[1], mode="train", train_steps=1, global_batch_size=8,
               progress=False, seed=7)
print("after", unseeded_random_allowed())
"""


@pytest.mark.slow
def test_a_seed_turns_on_op_determinism(tmp_path):
    """In a fresh process: op determinism is process-wide and cannot be turned off again."""
    cmd = [sys.executable, "-c", OP_DETERMINISM_PROBE, str(tmp_path / "run")]
    done = faults.run(cmd)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [x for x in done.stdout.splitlines() if x.startswith(("before ", "after "))]
    assert lines == ["before True", "after False"], done.stdout[-2000:]


def _stop_resume(tmp_path, sig, extra, seed):
    """An uninterrupted run and one stopped by `sig` after a `step N: loss` line, then resumed
    by the same command: asserts the stop saved the step it stopped at and the resume ends on
    the uninterrupted weights. Returns `(exit status, output, saved checkpoint, stopped step)`
    of the stopped run. No interval saves: the only checkpoint before the end is the stop's."""
    extra = [*extra, "orbitask.run_experiment.checkpoint_interval=1000"]
    reference = tmp_path / "uninterrupted"
    assert faults.run(faults.command(reference, 1, STEPS, extra)).returncode == 0

    model_dir = tmp_path / "stopped"
    cmd = faults.command(model_dir, 1, STEPS, extra)
    proc, output = faults.kill_after_line(cmd, random.Random(seed), sig=sig)
    # Each device loop (10 steps) prints its last step's loss: the last one is where it stopped.
    losses = re.findall(r"^step (\d+): loss", output, re.MULTILINE)
    assert losses and proc.returncode > 0, (proc.returncode, output[-3000:])
    stopped = int(losses[-1])
    assert 0 < stopped < STEPS
    saved = f"{model_dir}/ckpt-{stopped}"
    assert tf.train.latest_checkpoint(str(model_dir)) == saved, output[-3000:]

    resumed = faults.run(cmd)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed from {saved} (step {stopped})" in resumed.stdout
    faults.assert_identical(faults.final_state(reference), faults.final_state(model_dir))
    return proc.returncode, output, saved, stopped


@pytest.mark.slow
@pytest.mark.parametrize("async_checkpoints", [False, True], ids=["sync", "async"])
def test_sigterm_saves_exits_75_and_resumes_exactly(tmp_path, async_checkpoints):
    extra = [f"orbitask.run_experiment.async_checkpoints={async_checkpoints}"]
    status, output, saved, stopped = _stop_resume(tmp_path, signal.SIGTERM, extra, seed=3)
    assert status == 75, output[-2000:]
    assert f"SIGTERM received: saved checkpoint {saved} at step {stopped};" in output


@pytest.mark.slow
def test_ctrl_c_saves_exits_130_in_one_line_and_resumes_exactly(tmp_path):
    """SIGINT, as a terminal's Ctrl-C sends it, to the real binary: it stops after the device
    loop under way, saves, says so in one line without a traceback and exits 130; the same
    command resumes to the weights of an uninterrupted run."""
    status, output, saved, stopped = _stop_resume(tmp_path, signal.SIGINT, [], seed=4)
    assert status == 130, output[-2000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    assert f"orbitask: Ctrl-C: saving step {stopped} (Ctrl-C again quits at once)" in output
    lines = [x for x in output.splitlines() if x.startswith("orbitask: interrupted:")]
    assert lines == [
        f"orbitask: interrupted: SIGINT received: saved checkpoint {saved} at step {stopped}; "
        "run the same command again to resume from it."
    ], output[-3000:]


@pytest.mark.slow
def test_corrupt_latest_checkpoint_falls_back_and_keeps_files(tmp_path):
    model_dir = tmp_path / "run"
    assert faults.run(faults.command(model_dir, 1, 60)).returncode == 0
    latest = tf.train.latest_checkpoint(str(model_dir))
    assert latest.endswith("-60")
    data = next(model_dir.glob("ckpt-60.data-*"))
    data.write_bytes(b"garbage" * 1000)
    before = sorted(p.name for p in model_dir.glob("ckpt-*"))

    resumed = faults.run(faults.command(model_dir, 1, 80))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "ckpt-60" in resumed.stdout and "unreadable" in resumed.stdout
    assert "resumed from" in resumed.stdout and "ckpt-40 (step 40)" in resumed.stdout
    after = sorted(p.name for p in model_dir.glob("ckpt-*"))
    assert set(before) - {"ckpt-60.data-00000-of-00001", "ckpt-60.index"} <= set(after)
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("-80")
    # It went on from step 40 (the newest readable), so it trained steps 41..80.
    assert "step 50: loss" in resumed.stdout


@pytest.mark.slow
def test_checkpoint_of_another_model_names_variable_and_shapes(tmp_path):
    model_dir = tmp_path / "run"
    assert faults.run(faults.command(model_dir, 1, 20)).returncode == 0
    other = faults.run(
        faults.command(model_dir, 1, 40, extra=["orbitask.DigitsClassification.hidden_units=(16,)"])
    )
    assert other.returncode == 2
    lines = [x for x in other.stderr.splitlines() if x.startswith("orbitask: error:")]
    assert len(lines) == 1, other.stderr[-2000:]
    line = lines[0]
    assert line.startswith("orbitask: error: checkpoint")
    assert "dense/kernel" in line and "(64, 32)" in line and "(64, 16)" in line
    assert "Traceback" not in other.stderr
    shutil.rmtree(model_dir)
