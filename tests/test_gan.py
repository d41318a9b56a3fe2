"""DigitsGAN: two models and two optimizers in one task, checkpointed, resumed, on replicas."""

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from orbitask.tasks import DigitsGAN
from orbitask.trainers import run_experiment
from orbitask.trainers.commands import train
from tests.helpers import Recorder

REPO = Path(__file__).resolve().parents[1]
KEYS = ("loss", "d_loss", "g_loss", "d_grad_norm", "g_grad_norm")


class RecordingGAN(DigitsGAN):
    def __init__(self):
        super().__init__(latent_dim=8, hidden_units=16, l2=0.01)
        self.recorder = Recorder()

    def every_steps(self):
        return {1: self.recorder}


def _run(model_dir, steps, strategy="mirrored"):
    task = RecordingGAN()
    run_experiment(
        task,
        str(model_dir),
        mode="train",
        train_steps=steps,
        global_batch_size=16,
        learning_rate=0.01,
        steps_per_loop=4,
        checkpoint_interval=4,
        strategy=strategy,
        progress=False,
        seed=5,
    )
    return task


def _state(model_dir):
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
    names = sorted(n for n in reader.get_variable_to_shape_map() if "py_state" not in n)
    return {n: reader.get_tensor(n) for n in names if n != "_CHECKPOINTABLE_OBJECT_GRAPH"}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """8 steps on 2 replicas, never stopped."""
    model_dir = tmp_path_factory.mktemp("gan_full")
    return model_dir, _run(model_dir, 8)


@pytest.mark.slow
def test_both_optimizers_are_checkpointed(uninterrupted):
    model_dir, task = uninterrupted
    assert [s for s, _ in task.recorder.calls] == list(range(1, 9))
    assert task.recorder.replicas == {2}
    state = _state(model_dir)
    for key in ("generator", "discriminator"):
        assert state[f"optimizer/{key}/_iterations/.ATTRIBUTES/VARIABLE_VALUE"] == 8
        slots = [n for n in state if n.startswith(f"optimizer/{key}/_variables/")]
        assert len(slots) >= 8, f"{key}: Adam's m and v of 4 variables expected; got {slots}"


@pytest.mark.slow
def test_stop_and_restart_continues_both_optimizers(tmp_path, uninterrupted):
    full_dir, full = uninterrupted
    _run(tmp_path, 4)
    resumed = _run(tmp_path, 8)
    assert [s for s, _ in resumed.recorder.calls] == [5, 6, 7, 8]
    assert resumed.recorder.replicas == {2}
    for (s, l1), (_, l2) in zip(full.recorder.calls[4:], resumed.recorder.calls, strict=True):
        for key in KEYS:
            np.testing.assert_allclose(l2[key], l1[key], rtol=1e-6, err_msg=f"{key} @{s}")
    a, b = _state(full_dir), _state(tmp_path)
    assert a.keys() == b.keys()
    for name in a:  # weights, both optimizers' slots and iterations, step, lr
        np.testing.assert_allclose(b[name], a[name], rtol=1e-6, atol=1e-7, err_msg=name)


def test_two_replicas_equal_one_device_with_double_batch(tmp_path, uninterrupted):
    full_dir, two = uninterrupted
    one = _run(tmp_path, 8, strategy="one_device")
    assert one.recorder.replicas == {1} and two.recorder.replicas == {2}
    for (s, l1), (_, l2) in zip(one.recorder.calls, two.recorder.calls, strict=True):
        for key in KEYS:
            np.testing.assert_allclose(l2[key], l1[key], rtol=1e-5, err_msg=f"{key} @{s}")
    a, b = _state(tmp_path), _state(full_dir)
    for name in a:
        if name.startswith(("train_model/", "optimizer/")):
            np.testing.assert_allclose(b[name], a[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_experiment_trains_and_evaluates(tmp_path, capsys):
    status = train.main(
        [
            f"--gin_file={REPO / 'experiments' / 'digits_gan.gin'}",
            "--gin_params=TRAIN_STEPS=4",
            "--gin_params=orbitask.run_experiment.eval_interval=4",
            "--gin_params=orbitask.run_experiment.eval_steps=2",
            "--gin_params=orbitask.run_experiment.progress=False",
            f"--model_dir={tmp_path}",
        ]
    )
    out = capsys.readouterr().out
    assert status == 0, out
    assert "d_accuracy_real" in out and "d_accuracy_fake" in out
    model = DigitsGAN().build_model()
    tf.train.Checkpoint(train_model=model).restore(
        tf.train.latest_checkpoint(str(tmp_path))
    ).assert_existing_objects_matched()


def test_every_loss_is_shown_by_print_loss_the_progress_line_and_the_report(tmp_path, capsys):
    import io
    import re

    from orbitask.trainers.actions import progress
    from orbitask.trainers.commands import report

    task = DigitsGAN(latent_dim=8, hidden_units=16)
    run_experiment(
        task, str(tmp_path), mode="train", train_steps=10, global_batch_size=16,
        strategy="one_device", progress=False, loop_seconds=None, steps_per_loop=5,
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert re.search(r"^step 10: loss \S+, d_loss \S+, g_loss \S+$", printed, re.MULTILINE)
    line = progress.ProgressAction(tf.Variable(10), 10, stream=io.StringIO()).line(
        10, {"loss": 1.0, "d_loss": 0.6, "g_loss": 0.4, "grad_norm": 3.0}
    )
    assert line.endswith("| loss 1 | d_loss 0.6 | g_loss 0.4")
    run = report.load_run(str(tmp_path))
    text = report.summary(run, str(tmp_path), str(tmp_path / "report.png"), None)
    assert re.search(r"last loss \S+, d_loss \S+, g_loss \S+", text), text
