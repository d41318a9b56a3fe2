"""Evaluating saved checkpoints: `--mode=eval --checkpoint=PATH` and `--mode=eval_all`.

Each checkpoint is evaluated at its own step, with its own weights; the model directory is only
read (eval summaries aside), even while a training run holds its lock.
"""

import glob
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from orbitask.trainers import ConfigError, run_experiment
from orbitask.trainers.commands import train
from orbitask.trainers.state.model_dir_lock import LOCK_FILE, FileLock
from tests.helpers import TinyTask

B = 16
REPO = Path(__file__).resolve().parents[1]


def _run(model_dir, mode, **kwargs):
    return run_experiment(
        TinyTask(),
        str(model_dir),
        mode=mode,
        train_steps=6,
        global_batch_size=B,
        learning_rate=0.05,
        steps_per_loop=2,
        checkpoint_interval=2,
        strategy="one_device",
        progress=False,
        **kwargs,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A model directory trained to step 6 with checkpoints at steps 2, 4 and 6."""
    model_dir = tmp_path_factory.mktemp("trained") / "run"
    _run(model_dir, "train")
    return model_dir


@pytest.fixture
def model_dir(trained, tmp_path) -> Path:
    """A copy of `trained` for one test."""
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    return copy


def _expected_loss(path: str) -> float:
    """The eval loss (mean cross-entropy over the validation set) of the weights in `path`,
    computed with a fresh model and plain Keras."""
    task = TinyTask()
    model = task.build_model()
    tf.train.Checkpoint(train_model=model).restore(path).expect_partial()
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=task.y, logits=model(task.x))
    return float(tf.reduce_mean(losses))


def _files(model_dir: Path) -> dict[str, tuple[bytes, int]]:
    """Every file outside `eval/`, with its bytes and modification time."""
    found = {}
    for path in sorted(model_dir.rglob("*")):
        relative = path.relative_to(model_dir)
        if relative.parts[0] == "eval":
            continue
        if path.is_file():
            found[str(relative)] = (path.read_bytes(), path.stat().st_mtime_ns)
        else:
            found[str(relative)] = (b"", 0)
    return found


def _eval_points(model_dir: Path) -> dict[int, float]:
    """{step: loss} of the scalar summaries under `eval/`."""
    points = {}
    for path in glob.glob(os.path.join(model_dir, "eval", "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == "loss":
                    points[event.step] = float(tf.make_ndarray(value.tensor))
    return points


def test_eval_all_evaluates_every_checkpoint_at_its_step_and_only_reads(model_dir, capsys):
    """Beside a training run holding the lock, with a killed save's leftover folder: each
    checkpoint, oldest first, is evaluated with its own weights at its own step (logs,
    summaries, one line each); nothing outside `eval/` changes."""
    (model_dir / "ckpt-8_temp").mkdir()  # a killed save's leftover: a locking run removes it
    holder = FileLock(str(model_dir / LOCK_FILE))
    assert holder.acquire()
    before = _files(model_dir)
    try:
        logs = _run(model_dir, "eval_all")
    finally:
        holder.release()
    assert _files(model_dir) == before
    paths = [str(model_dir / f"ckpt-{step}") for step in (2, 4, 6)]
    evaluated = logs["evaluated"]
    assert [e["checkpoint"] for e in evaluated] == paths
    assert [e["step"] for e in evaluated] == [2, 4, 6]
    expected = [_expected_loss(path) for path in paths]
    assert len(set(expected)) == 3  # the checkpoints differ
    np.testing.assert_allclose([e["eval"]["loss"] for e in evaluated], expected, rtol=1e-5)
    points = _eval_points(model_dir)
    assert sorted(points) == [2, 4, 6]
    np.testing.assert_allclose([points[s] for s in (2, 4, 6)], expected, rtol=1e-5)
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if ": eval at step " in line]
    assert [line.split(":")[1].strip() for line in lines] == ["ckpt-2", "ckpt-4", "ckpt-6"], out


def test_eval_all_started_again_goes_on_after_the_checkpoints_it_evaluated(
    model_dir, tmp_path, capsys
):
    """A first eval_all sees ckpt-2 and ckpt-4 only (as one stopped before ckpt-6 would have
    evaluated them); started again, it evaluates ckpt-6 alone: each step once in `eval/`."""
    aside = tmp_path / "aside"
    aside.mkdir()
    for path in glob.glob(str(model_dir / "ckpt-6.*")):
        shutil.move(path, aside)
    first = _run(model_dir, "eval_all")
    assert [e["step"] for e in first["evaluated"]] == [2, 4]
    for path in aside.iterdir():
        shutil.move(str(path), model_dir)
    capsys.readouterr()
    again = _run(model_dir, "eval_all")
    assert [e["step"] for e in again["evaluated"]] == [6]
    record = model_dir / "eval" / "evaluated_checkpoints.txt"
    assert f"orbitask: eval_all: 2 checkpoint(s) evaluated before ({record})" in (
        capsys.readouterr().out
    )
    assert record.read_text() == "ckpt-2\nckpt-4\nckpt-6\n"
    assert sorted(_eval_points(model_dir)) == [2, 4, 6]


def test_eval_of_a_chosen_checkpoint_from_elsewhere(model_dir, tmp_path, capsys):
    """A copy of ckpt-4 outside the model directory: its weights, evaluated at step 4 (not
    the newest checkpoint, 6); the model directory gains only its eval summary."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for path in glob.glob(str(model_dir / "ckpt-4.*")):
        shutil.copy(path, elsewhere)
    chosen = str(elsewhere / "ckpt-4")
    before = _files(model_dir)
    logs = _run(model_dir, "eval", eval_checkpoint=chosen)
    assert _files(model_dir) == before
    assert [(e["checkpoint"], e["step"]) for e in logs["evaluated"]] == [(chosen, 4)]
    expected = _expected_loss(chosen)
    assert logs["eval"]["loss"] == pytest.approx(expected, rel=1e-5)
    assert list(_eval_points(model_dir)) == [4]
    assert "orbitask: eval at step 4: " in capsys.readouterr().out


def _garbled(model_dir: Path) -> str:
    """ckpt-2 with its data file cut short: present, but not readable."""
    data = glob.glob(str(model_dir / "ckpt-2.data-*"))[0]
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 2)
    return str(model_dir / "ckpt-2")


@pytest.mark.parametrize(
    "chosen, reason",
    [
        (lambda d: str(d / "ckpt-5"), r"there is no .*ckpt-5\.index"),
        (lambda d: str(d), "it is a directory"),
        (_garbled, r".+\. Pass a checkpoint prefix"),
    ],
    ids=["missing", "directory", "garbled"],
)
def test_a_path_that_is_not_a_readable_checkpoint_is_one_line(model_dir, chosen, reason):
    path = chosen(model_dir)
    before = _files(model_dir)
    with pytest.raises(ConfigError) as info:
        _run(model_dir, "eval", eval_checkpoint=path)
    line = str(info.value).splitlines()[0]
    assert re.match(
        rf"--checkpoint '{re.escape(path)}' is not a readable checkpoint: {reason}", line
    )
    assert _files(model_dir) == before


def test_eval_all_skips_an_unreadable_checkpoint_and_refuses_an_empty_directory(
    model_dir, tmp_path, capsys
):
    path = _garbled(model_dir)
    logs = _run(model_dir, "eval_all")
    assert [e["step"] for e in logs["evaluated"]] == [4, 6]
    assert f"checkpoint {path} is unreadable, not evaluated" in capsys.readouterr().out
    with pytest.raises(
        ConfigError, match=r"--mode=eval_all evaluates the checkpoints in .* has no"
    ):
        _run(tmp_path / "empty", "eval_all")


def test_the_binary_takes_checkpoint_and_refuses_it_outside_eval(tmp_path, capsys):
    """`--checkpoint` with a path that does not exist, and with `--mode=train`: one line on
    stderr naming it, exit 2, before any work."""
    base = [f"--gin_file={REPO}/experiments/digits.gin", f"--model_dir={tmp_path / 'run'}"]
    missing = str(tmp_path / "nowhere" / "ckpt-3")
    for flags, message in (
        (["--mode=eval", f"--checkpoint={missing}"], f"--checkpoint '{missing}' is not a"),
        (["--mode=train", f"--checkpoint={missing}"], "`eval_checkpoint` "),
    ):
        assert train.main(base + flags) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"orbitask: error: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()
