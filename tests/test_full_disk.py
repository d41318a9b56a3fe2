"""A full disk during a save: one line naming the path, the half-written checkpoint removed, the
previous one intact and restorable, a non-zero exit (4); on one process, sync and async, and on the
chief of two workers saving asynchronously.

The model directory is a small tmpfs (the test machines run as root); where mounting is not
permitted the test is skipped, saying so.
"""

import os
import subprocess
import uuid

import pytest
import tensorflow as tf

from tests import faults, launching

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs: room for the first checkpoint of the model below (~1.9 MiB), not two."""
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.parametrize("async_checkpoints", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("shuffle_buffer", ["None", "512"], ids=["indexed", "tf.data"])
def test_a_full_disk_stops_the_run_with_one_line_and_keeps_the_previous_checkpoint(
    small_disk, shuffle_buffer, async_checkpoints
):
    # Async: the failing write is on the background thread; the next save or the end of the
    # run raises it.
    model = small_disk / "model"
    extra = [
        "orbitask.DigitsClassification.hidden_units=(2048,)",  # ~1.8 MiB with Nadam's slots
        f"orbitask.DigitsClassification.shuffle_buffer={shuffle_buffer}",
        "orbitask.Task.max_to_keep=5",
        f"orbitask.run_experiment.async_checkpoints={async_checkpoints}",
    ]
    command = faults.command(model, steps=60, extra=extra)
    result = subprocess.run(command, cwd=REPO, env=faults.env(), capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert result.returncode == 4, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("orbitask: error:")]
    assert len(lines) == 1, result.stderr[-3000:]
    assert "no space left on the device to write checkpoint" in lines[0]
    assert str(model / "ckpt-") in lines[0] and "is intact" in lines[0]
    assert "function_node" not in result.stderr and "Traceback" not in result.stderr
    # Nothing half-written is left; the previous checkpoint reads back in full.
    assert not [d for d, _, _ in os.walk(model) if "_temp" in d]
    latest = tf.train.latest_checkpoint(str(model))
    assert latest is not None and latest.endswith("ckpt-20")
    assert sorted(n for n in os.listdir(model) if n.startswith("ckpt-")) == [
        "ckpt-20.data-00000-of-00001",
        "ckpt-20.index",
    ]
    reader = tf.train.load_checkpoint(latest)
    for name, dtype in reader.get_variable_to_dtype_map().items():
        if dtype != tf.variant:
            reader.get_tensor(name)


def test_a_full_disk_on_the_chief_of_two_workers_saving_asynchronously_stops_the_job(
    small_disk, tmp_path
):
    """multi_worker_mirrored through the launcher, the model directory on the small disk: the
    chief's background write of ckpt-40 fails; the next save raises it as the one line, the job
    exits 4, and ckpt-20 stays intact."""
    model = small_disk / "model"
    extra = [
        "orbitask.DigitsClassification.hidden_units=(2048,)",
        "orbitask.Task.max_to_keep=5",
        "orbitask.run_experiment.async_checkpoints=True",
    ]
    status, text = launching.run(
        ["--workers", "2"], launching.train_flags(model, 60, extra), tmp_path
    )
    assert status == 4, text[-3000:]
    assert "orbitask launch: worker 0 exited with status 4; stopping the job" in text
    errors = [line for line in text.splitlines() if line.startswith("[worker 0] orbitask: error:")]
    assert len(errors) == 1, text[-3000:]
    assert f"no space left on the device to write checkpoint {model}/ckpt-40" in errors[0]
    assert "is intact" in errors[0]
    assert not [d for d, _, _ in os.walk(model) if "_temp" in d]
    latest = tf.train.latest_checkpoint(str(model))
    assert latest is not None and latest.endswith("ckpt-20")
    reader = tf.train.load_checkpoint(latest)
    for name, dtype in reader.get_variable_to_dtype_map().items():
        if dtype != tf.variant:
            reader.get_tensor(name)
