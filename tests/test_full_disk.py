"""A full disk during a save: one line naming the path, the half-written checkpoint removed, the
previous one intact and restorable, a non-zero exit (4); on one process, sync and async, and on the
chief of two workers saving asynchronously. A full disk for the summaries, an input position, the
operative config or an export: the same one line and exit, nothing half-written, and the steps
taken saved in a checkpoint where its disk has room.

The model directory is a small tmpfs (the test machines run as root); where mounting is not
permitted the test is skipped, saying so.
"""

import os
import subprocess
import uuid

import pytest
import tensorflow as tf

from orbitask.trainers.commands import export, train
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


@pytest.mark.slow
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
        "orbitask.run_experiment.max_to_keep=5",
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


@pytest.mark.slow
def test_a_full_disk_on_the_chief_of_two_workers_saving_asynchronously_stops_the_job(
    small_disk, tmp_path
):
    """multi_worker_mirrored through the launcher, the model directory on the small disk: the
    chief's background write of ckpt-40 fails; the next save raises it as the one line, the job
    exits 4, and ckpt-20 stays intact."""
    model = small_disk / "model"
    extra = [
        "orbitask.DigitsClassification.hidden_units=(2048,)",
        "orbitask.run_experiment.max_to_keep=5",
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


def _fill(disk, leave: int) -> None:
    """Fills `disk` with one file, leaving `leave` bytes (tmpfs counts whole 4 KiB pages)."""
    stat = os.statvfs(disk)
    with open(disk / "filler", "wb") as f:
        f.write(b"\0" * (stat.f_bavail * stat.f_frsize - leave))


def _train(model_dir, steps, extra=()) -> int:
    """The orbitask binary in this process on the digits experiment (`faults.command`'s flags);
    returns its exit status."""
    return train.main(faults.command(model_dir, steps=steps, extra=extra)[3:])


def _one_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("orbitask: error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["histograms", "scalars", "one-disk"])
def test_full_disk_for_summaries_saves_the_steps_taken_and_stops_with_one_line(
    small_disk, tmp_path, capsys, case
):
    """The train summaries' device fills: histograms every step (written by a callback), or the
    scalars written on the background thread. With the summaries on their own full device
    (`train/` a link to it), a checkpoint of the step reached is saved beside them; on one full
    device that save fails as a checkpoint save does."""
    extra = ["orbitask.DigitsClassification.shuffle_buffer=None"]
    if case == "histograms":
        extra.append("orbitask.run_experiment.histogram_interval=1")
    else:  # one loop a step: more scalars than one page holds
        extra += [
            "orbitask.run_experiment.steps_per_loop=1",
            "orbitask.run_experiment.loop_seconds=None",
        ]
    if case == "one-disk":
        model = small_disk / "model"
        extra.append("orbitask.run_experiment.histogram_interval=1")
        # The lock, the settings record (two files), run.json, the model summary, a few summaries.
        _fill(small_disk, leave=10 * 4096)
    else:
        model = tmp_path / "model"
        model.mkdir()
        os.symlink(small_disk, model / "train")
        _fill(small_disk, leave=2 * 4096 if case == "histograms" else 4096)
    assert _train(model, steps=25, extra=extra) == 4
    line = _one_error(capsys.readouterr().err)
    assert not [d for d, _, _ in os.walk(model) if "_temp" in d]
    if case == "one-disk":
        assert f"no space left on the device to write checkpoint {model}/ckpt-" in line
        assert "previous checkpoint (none) is intact" in line
        assert not [n for n in os.listdir(model) if n.startswith("ckpt-")]
        return
    latest = tf.train.latest_checkpoint(str(model))
    assert f"no space left on the device to write {model}/train/events.out" in line
    assert f"the steps taken are saved in checkpoint {latest}." in line
    reader = tf.train.load_checkpoint(latest)
    assert reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == int(latest.rsplit("-", 1)[1])
    if case == "histograms":  # the run stopped within the first loop's few steps
        assert int(latest.rsplit("-", 1)[1]) < 10


def test_full_disk_for_an_input_position_stops_with_one_line_and_keeps_the_previous_one(
    small_disk, capsys
):
    """A `tf.data` input's position (~0.7 MiB: a shuffle buffer of 1400 examples) fits once in
    the room left, not twice: the save at step 40 stops the run, and no part of its position
    or checkpoint is left."""
    model = small_disk / "model"
    _fill(small_disk, leave=1200 * 1024)
    extra = ["orbitask.DigitsClassification.shuffle_buffer=1400"]
    assert _train(model, steps=40, extra=extra) == 4
    line = _one_error(capsys.readouterr().err)
    assert f"no space left on the device to write checkpoint {model}/ckpt-40" in line
    assert f"the previous checkpoint ({model}/ckpt-20) is intact" in line
    assert os.listdir(model / "input") == ["ckpt-20"]
    assert not [d for d, _, _ in os.walk(model) if "_temp" in d]
    assert tf.train.latest_checkpoint(str(model)) == str(model / "ckpt-20")
    for prefix in (model / "ckpt-20", model / "input" / "ckpt-20" / "worker-0-of-1"):
        reader = tf.train.load_checkpoint(str(prefix))
        for name, dtype in reader.get_variable_to_dtype_map().items():
            if dtype != tf.variant:
                reader.get_tensor(name)


@pytest.mark.parametrize(
    "pages, full",
    [(1, "train/events.out"), (2, "operative_config-0.gin")],
    ids=["summaries", "config"],
)
def test_full_disk_before_training_stops_with_one_line(small_disk, capsys, pages, full):
    """Room for the lock alone: the train summaries' writer stops the run as it is built; room
    for the events file too: the operative config, written whole or not at all."""
    model = small_disk / "model"
    _fill(small_disk, leave=pages * 4096)
    extra = ["orbitask.DigitsClassification.shuffle_buffer=None"]
    assert _train(model, steps=20, extra=extra) == 4
    line = _one_error(capsys.readouterr().err)
    assert f"no space left on the device to write {model}/{full}" in line
    assert "training had not started" in line
    assert sorted(os.listdir(model)) == ["orbitask.lock", "train"]


def test_full_disk_for_an_export_stops_with_one_line_and_leaves_no_part_of_it(small_disk, capsys):
    model = small_disk / "model"
    assert _train(model, steps=10, extra=["orbitask.DigitsClassification.shuffle_buffer=None"]) == 0
    _fill(small_disk, leave=4096)
    capsys.readouterr()
    assert export.main([f"--model_dir={model}"]) == 4
    line = _one_error(capsys.readouterr().err)
    assert f"no space left on the device to write the SavedModel {model}/export/10" in line
    assert "the half-written export was removed" in line
    assert not (model / "export").exists()
