"""One run per model directory (`trainers.state.model_dir_lock`): a second training run on a
directory in use is refused with one line naming the holder, a killed run's lock is taken over,
an evaluation runs beside training, leftovers of killed saves are removed at start; non-chief
workers' temp folders have unpredictable names."""

import os
import signal
import stat
import tempfile

import pytest
import tensorflow as tf

from orbitask.trainers import run_experiment
from orbitask.trainers.commands import train
from orbitask.trainers.state import checkpoint_files, checkpoint_manager, model_dir_lock
from tests import faults
from tests.helpers import TinyTask


@pytest.mark.slow
def test_second_run_is_refused_and_a_killed_runs_lock_is_taken_over(tmp_path, capsys):
    model = tmp_path / "model"
    first = faults.start(faults.command(model, steps=100000))
    try:
        faults.wait_for_checkpoint(model, first, min_step=20)
        lock_text = (model / model_dir_lock.LOCK_FILE).read_text()
        assert lock_text.strip().endswith(f"pid {first.pid}"), lock_text
        operative = (model / "operative_config.gin").read_text()

        # A second training run on the same directory: one line naming the holder, exit 2.
        assert train.main(faults.command(model, steps=100000)[3:]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("orbitask: error: "), err
        assert f"--model_dir '{model}' is in use by another run (host " in err, err
        assert f", pid {first.pid}); wait for it to end" in err, err
        assert first.poll() is None  # the first run goes on
        assert (model / model_dir_lock.LOCK_FILE).read_text() == lock_text
        assert (model / "operative_config.gin").read_text() == operative

        # An evaluation only reads: it runs beside the training run.
        assert train.main([*faults.command(model)[3:], "--mode=eval"]) == 0
        assert "orbitask: eval at step" in capsys.readouterr().out

        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=30)
    # The first run's checkpoints are its own and intact.
    killed_at = tf.train.latest_checkpoint(str(model))
    assert checkpoint_files.unreadable_reason(killed_at) is None
    step = int(killed_at.rsplit("-", 1)[1])

    # The killed run's lock file is still there; the next run takes it over and resumes.
    assert str(first.pid) in (model / model_dir_lock.LOCK_FILE).read_text()
    assert train.main(faults.command(model, steps=step + 10)[3:]) == 0
    assert f"resumed from {killed_at}" in capsys.readouterr().out
    assert tf.train.latest_checkpoint(str(model)).endswith(f"ckpt-{step + 10}")
    assert f"pid {os.getpid()}\n" in (model / model_dir_lock.LOCK_FILE).read_text()


def test_leftovers_of_killed_saves_are_removed_at_start(tmp_path):
    model = tmp_path / "model"
    half = [model / "ckpt-20_temp", model / "best" / "best_ckpt-8_temp"]
    half += [model / "input" / "ckpt-20" / "worker-0-of-1_temp"]  # an input position
    half += [model / "input" / "ckpt-20" / "worker-0-of-1.shuffle_seeds_temp"]
    for folder in half:
        folder.mkdir(parents=True)
        (folder / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"half")
    atomic = model / ("checkpoint.tmp" + "0123456789abcdef" * 2)
    atomic.write_text("model_checkpoint_path: ")
    kept = [model / "notes_temp", model / "my_temp.txt"]  # not what a save leaves
    kept[0].mkdir()
    kept[1].write_text("mine")
    run_experiment(
        TinyTask(), str(model), mode="train", train_steps=2, global_batch_size=8, progress=False
    )
    assert not any(p.exists() for p in [*half, atomic])
    assert all(p.exists() for p in kept)
    assert tf.train.latest_checkpoint(str(model)).endswith("ckpt-2")


def test_only_a_chief_that_writes_checkpoints_takes_the_lock(tmp_path):
    """`take(False)`: a non-chief worker, or eval / continuous_eval (they only read)."""
    other = model_dir_lock.FileLock(str(tmp_path / model_dir_lock.LOCK_FILE))
    with model_dir_lock.ModelDirLock(str(tmp_path)) as lock:
        lock.take(False)
        assert other.acquire()
        other.release()
    with model_dir_lock.ModelDirLock(str(tmp_path)) as lock:
        lock.take(True)
        assert not other.acquire()
    assert other.acquire()  # released on leaving the block
    other.release()


def test_worker_temp_folders_are_unpredictable_and_abandoned_ones_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    chief = str(tmp_path / "model")
    checkpoint = tf.train.Checkpoint(step=tf.Variable(0))
    first = checkpoint_manager.WorkerCheckpointManager(checkpoint, chief, worker="worker-1")
    # What another user could create first under the name a worker would use.
    prefix = os.path.basename(first.temp_directory)[: -len("xxxxxxxx")]
    squatted = tmp_path / prefix.rstrip("-")
    squatted.mkdir()
    abandoned = tmp_path / f"{prefix}killed"  # a SIGKILLed worker's: its lock is free
    abandoned.mkdir()
    (abandoned / "worker.lock").write_text("host h pid 1\n")

    second = checkpoint_manager.WorkerCheckpointManager(checkpoint, chief, worker="worker-1")
    names = {first.temp_directory, second.temp_directory}
    assert len(names) == 2 and all(os.path.basename(n).startswith(prefix) for n in names)
    assert all(stat.S_IMODE(os.stat(n).st_mode) == 0o700 for n in names)
    assert not abandoned.exists()
    assert os.path.isdir(first.temp_directory)  # a live worker's folder is kept
    assert second.save(checkpoint_number=1).startswith(second.temp_directory)
    for manager in (first, second):
        manager._lock.release()
