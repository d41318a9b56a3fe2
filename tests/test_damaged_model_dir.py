"""A damaged model directory: a warning naming the damage and a resume from the newest checkpoint
that restores completely (found by its files when the state file is wrong), or one line; never a
fresh start over checkpoints, never a checkpoint deleted or overwritten, except a corrupt one
whose step is trained again. Checkpoints the state file names none of, none readable, are saves cut
short (TensorFlow writes the state file after a checkpoint's files): the run starts afresh."""

import hashlib
import json
import os
import shutil

import gin
import numpy as np
import pytest
import tensorflow as tf

from orbitask.trainers import run_experiment
from orbitask.trainers.errors import ConfigError
from tests.helpers import TinyTask, keras_module, weights


def _run(model_dir, steps, task=None, **kwargs):
    task = task or TinyTask()
    run_experiment(
        task,
        str(model_dir),
        mode="train",
        train_steps=steps,
        global_batch_size=8,
        learning_rate=0.05,
        steps_per_loop=5,
        checkpoint_interval=5,
        progress=False,
        **kwargs,
    )
    return task


def _weights_at(path):
    model = TinyTask().build_model()
    tf.train.Checkpoint(train_model=model).restore(str(path)).expect_partial()
    return weights(model)


def _files(model_dir):
    """Every checkpoint file of `model_dir` by path, with a digest of its bytes (input positions
    are pruned to the newest few by design)."""
    out = {}
    for path in sorted(model_dir.glob("ckpt-*")):
        out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _kept(before, after, changed=()):
    """No file of `before` was deleted, and none but `changed` was rewritten."""
    lost = sorted(set(before) - set(after))
    assert not lost, f"deleted: {lost}"
    rewritten = sorted(p for p in before if after[p] != before[p] and p not in changed)
    assert not rewritten, f"overwritten: {rewritten}"


def _line(error):
    """The error's message: one line (gin adds a note on where it was called in-process)."""
    lines = [x for x in str(error).splitlines() if not x.strip().startswith("In call to config")]
    assert len(lines) == 1, str(error)
    return lines[0]


def _resumed_step(out):
    lines = [x for x in out.splitlines() if x.startswith("orbitask: resumed from")]
    assert len(lines) == 1, out[-3000:]
    return int(lines[0].rsplit("(step ", 1)[1].rstrip(")"))


def _assert_same(a, b):
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Weights of an uninterrupted run at steps 20 and 25."""
    model_dir = tmp_path_factory.mktemp("reference")
    _run(model_dir, 25)
    return {s: _weights_at(model_dir / f"ckpt-{s}") for s in (20, 25)}


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.slow
def test_truncated_data_of_the_final_checkpoint_is_retrained_and_replaced(
    tmp_path, capsys, reference
):
    _run(tmp_path, 20)
    _truncate(next(tmp_path.glob("ckpt-20.data-*")))
    before = _files(tmp_path)
    capsys.readouterr()

    _run(tmp_path, 20)  # the same command again
    out = capsys.readouterr().out
    warning = [x for x in out.splitlines() if "unreadable" in x]
    assert len(warning) == 1 and "ckpt-20" in warning[0], out[-3000:]
    assert _resumed_step(out) == 15
    after = _files(tmp_path)
    replaced = [p for p in before if "ckpt-20" in p]
    _kept(before, after, changed=replaced)
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-20")
    _assert_same(_weights_at(tmp_path / "ckpt-20"), reference[20])


def test_truncated_input_position_resumes_exactly_from_the_previous_checkpoint(
    tmp_path, capsys, reference
):
    _run(tmp_path, 20)
    _truncate(next((tmp_path / "input" / "ckpt-20").glob("worker-0-of-1.data-*")))
    before = _files(tmp_path)
    capsys.readouterr()

    _run(tmp_path, 25)
    out = capsys.readouterr().out
    warning = [x for x in out.splitlines() if "input position" in x and "unreadable" in x]
    assert len(warning) == 1 and "ckpt-20" in warning[0], out[-3000:]
    assert "restarts from its beginning" not in out
    assert _resumed_step(out) == 15
    _kept(before, _files(tmp_path), changed=[p for p in before if "ckpt-20" in p])
    _assert_same(_weights_at(tmp_path / "ckpt-25"), reference[25])


def test_truncated_input_position_of_the_only_checkpoint_restarts_the_input(tmp_path, capsys):
    _run(tmp_path, 5)
    _truncate(next((tmp_path / "input" / "ckpt-5").glob("worker-0-of-1.data-*")))
    before = _files(tmp_path)
    capsys.readouterr()

    _run(tmp_path, 10)
    out = capsys.readouterr().out
    line = [x for x in out.splitlines() if "training input restarts" in x]
    assert len(line) == 1 and "unreadable" in line[0] and "step 5" in line[0], out[-3000:]
    assert _resumed_step(out) == 5
    _kept(before, _files(tmp_path))
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-10")


@pytest.mark.slow
def test_a_first_save_cut_short_starts_afresh(tmp_path, capsys, reference):
    """A kill -9 while the first checkpoint is written leaves a torn index and no state file."""
    _run(tmp_path, 5)
    (tmp_path / "checkpoint").unlink()
    _truncate(tmp_path / "ckpt-5.index")
    capsys.readouterr()

    _run(tmp_path, 25)
    out = capsys.readouterr().out
    assert "a save was cut short; starting afresh" in out, out[-3000:]
    assert "resumed from" not in out
    _assert_same(_weights_at(tmp_path / "ckpt-25"), reference[25])


def test_the_only_checkpoint_the_state_file_names_unreadable_is_one_line(tmp_path):
    _run(tmp_path, 5)
    _truncate(tmp_path / "ckpt-5.index")
    before = _files(tmp_path)
    with pytest.raises(ConfigError) as error:
        _run(tmp_path, 10)
    assert _line(error.value).startswith(f"none of the 1 checkpoint(s) in {tmp_path}")
    _kept(before, _files(tmp_path))


STATE_DAMAGE = {
    "random_bytes": (bytes(range(256)) * 4, "does not parse"),
    "empty": (b"", "names no checkpoint"),
    "garbled_text": (b"model_checkpoint_path: ckpt-20 {", "does not parse"),
    "names_missing": (b'model_checkpoint_path: "ckpt-90"\n', "ckpt-90, which does not exist"),
}


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(STATE_DAMAGE))
def test_damaged_state_file_resumes_from_the_checkpoint_files(tmp_path, capsys, reference, damage):
    _run(tmp_path, 20)
    data, named = STATE_DAMAGE[damage]
    (tmp_path / "checkpoint").write_bytes(data)
    before = _files(tmp_path)
    capsys.readouterr()

    _run(tmp_path, 25)
    out = capsys.readouterr().out
    warning = [x for x in out.splitlines() if "the state file" in x]
    assert len(warning) == 1 and named in warning[0], out[-3000:]
    assert "newest ckpt-20" in warning[0]
    assert _resumed_step(out) == 20
    _kept(before, _files(tmp_path))
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-25")
    _assert_same(_weights_at(tmp_path / "ckpt-25"), reference[25])


def test_damaged_state_file_over_more_files_than_kept_resumes_from_the_newest(
    tmp_path, capsys, reference
):
    """Four checkpoints on disk, a garbled state file, and a resume keeping 2: the manager
    holds the newest two and resumes from ckpt-20; saving ckpt-25 retires ckpt-15 (keep 2),
    and the files it never held (ckpt-5, ckpt-10) are left alone."""
    _run(tmp_path, 20)
    (tmp_path / "checkpoint").write_bytes(STATE_DAMAGE["garbled_text"][0])
    before = _files(tmp_path)
    capsys.readouterr()

    _run(tmp_path, 25, max_to_keep=2)
    out = capsys.readouterr().out
    warning = [x for x in out.splitlines() if "the state file" in x]
    assert len(warning) == 1 and "2 found, newest ckpt-20" in warning[0], out[-3000:]
    assert _resumed_step(out) == 20
    after = _files(tmp_path)
    assert sorted(set(before) - set(after)) == [p for p in before if "ckpt-15." in p]
    _kept({p: d for p, d in before.items() if "ckpt-15." not in p}, after)
    _assert_same(_weights_at(tmp_path / "ckpt-25"), reference[25])


def test_damaged_state_file_without_checkpoint_files_is_one_line(tmp_path):
    (tmp_path / "checkpoint").write_bytes(b'model_checkpoint_path: "ckpt-90"\n')
    with pytest.raises(ConfigError) as error:
        _run(tmp_path, 5)
    text = _line(error.value)
    assert "ckpt-90, which does not exist" in text
    assert "no ckpt-<N>.index checkpoint" in text
    assert not list(tmp_path.glob("ckpt-*"))


class OneMoreLayer(TinyTask):
    """TinyTask with a third Dense layer whose shapes fit the checkpoint's layout."""

    def build_model(self):
        model = super().build_model()
        k = keras_module(self.flavour)
        return k.Sequential([k.Input((6,)), *model.layers, k.layers.Dense(3)])


@pytest.mark.slow
@pytest.mark.parametrize("flavour", ["keras", "tf_keras"])
def test_a_model_with_one_more_layer_is_refused(tmp_path, flavour):
    """Refused in one line, nothing touched: the checkpoints, and the run's record."""
    _run(tmp_path, 10, TinyTask(flavour=flavour))
    before = _files(tmp_path)
    record = (tmp_path / "operative_config.gin").read_bytes()
    gin.bind_parameter("run_experiment.eval_interval", 7)  # a binding the record would show
    with pytest.raises(ConfigError) as error:
        _run(tmp_path, 15, OneMoreLayer(flavour=flavour))
    text = _line(error.value)
    assert text.startswith(f"checkpoint {tmp_path / 'ckpt-10'} does not restore this run")
    assert "variable(s) of this run are not in it (train_model/" in text
    assert "init_checkpoint" in text
    _kept(before, _files(tmp_path))
    assert (tmp_path / "operative_config.gin").read_bytes() == record


def test_a_foreign_checkpoint_is_refused(tmp_path):
    """Another framework's layout: the same model under other names, and no orbitask state."""
    model = TinyTask().build_model()
    foreign = tf.train.Checkpoint(net=model, epoch=tf.Variable(7))
    tf.train.CheckpointManager(foreign, str(tmp_path), max_to_keep=3).save(checkpoint_number=30)
    before = _files(tmp_path)
    with pytest.raises(ConfigError) as error:
        _run(tmp_path, 35)
    text = _line(error.value)
    assert f"checkpoint {tmp_path / 'ckpt-30'} does not restore this run" in text
    assert "train_model/" in text
    _kept(before, _files(tmp_path))


def test_listed_checkpoints_rotated_away_are_followed_to_the_newest(tmp_path, capsys):
    """An evaluation's manager lists ckpt-1 and ckpt-2; a training run beside it saves ckpt-3
    and ckpt-4, its rotation deleting both listed ones before the restore: the newest, ckpt-4,
    is restored, and nothing is called unreadable."""
    from orbitask.trainers.state import checkpoint_restore

    value = tf.Variable(0.0)
    training = tf.train.CheckpointManager(
        tf.train.Checkpoint(value=value), str(tmp_path), max_to_keep=2
    )
    read = tf.Variable(-1.0)
    checkpoint = tf.train.Checkpoint(value=read)
    for step in (1, 2, 3, 4):
        if step == 3:
            evaluating = tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=2)
            assert [os.path.basename(p) for p in evaluating.checkpoints] == ["ckpt-1", "ckpt-2"]
        value.assign(float(step))
        training.save(checkpoint_number=step)
    assert not (tmp_path / "ckpt-2.index").exists()
    path = checkpoint_restore.restore_newest_readable(checkpoint, evaluating)
    assert path == str(tmp_path / "ckpt-4") and float(read.numpy()) == 4.0
    assert evaluating.latest_checkpoint == path
    assert "unreadable" not in capsys.readouterr().out


class DeletesItsModelDir(TinyTask):
    """A callback that deletes the model directory after step 6 (a user's `rm -rf`)."""

    def __init__(self, model_dir, **kwargs):
        super().__init__(**kwargs)
        self.model_dir = model_dir

    def at_step(self):
        return {6: lambda task, ctx: shutil.rmtree(self.model_dir)}


def _scalar_steps(folder) -> set:
    steps = set()
    for path in tf.io.gfile.glob(str(folder / "events.out.tfevents.*")):
        steps |= {e.step for e in tf.compat.v1.train.summary_iterator(path) if e.summary.value}
    return steps


def test_a_model_dir_deleted_while_training_is_made_again_whole(tmp_path, capsys):
    model = tmp_path / "run"
    run_experiment(DeletesItsModelDir(str(model)), str(model), mode="train_and_eval",
                   train_steps=12, global_batch_size=8, steps_per_loop=2, loop_seconds=None,
                   checkpoint_interval=4, eval_interval=10, progress=False)  # fmt: skip
    said = [x for x in capsys.readouterr().out.splitlines() if "was deleted" in x]
    assert said == [
        f"orbitask: --model_dir {model} was deleted during the run at step 6; making it again: "
        "the lock, the settings record, run.json, model_summary.txt and new summary files now, "
        "the checkpoints from the next save on"
    ]
    assert {"orbitask.lock", "operative_config.gin", "operative_config-6.gin"} <= {
        p.name for p in model.iterdir()
    }
    assert "# model" in (model / "model_summary.txt").read_text()
    (entry,) = json.loads((model / "run.json").read_text())  # this start's, ended
    assert (entry["start_step"], entry["end_step"], entry["ended"]) == (0, 12, "finished")
    assert tf.train.latest_checkpoint(str(model)).endswith("ckpt-12")
    assert 12 in _scalar_steps(model / "train") and _scalar_steps(model / "eval") == {10, 12}
