"""MultiTask: per-task losses and weights, sharing modes, per-task validation, replicas."""

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from orbitask.tasks import DigitsClassification, DigitsParity, MultiTask
from orbitask.trainers import run_experiment
from orbitask.trainers.commands import train
from tests.helpers import Recorder, TinyTask

REPO = Path(__file__).resolve().parents[1]
WEIGHTS = {"digit": 1.0, "parity": 0.5}


class Recording(MultiTask):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.recorder = Recorder()
        self.final = None

    def every_steps(self):
        return {1: self.recorder}

    def at_step(self):
        return {6: self._grab}

    def _grab(self, task, ctx):
        self.final = [np.array(v) for v in ctx.model.weights]


def _digits(l2=0.0, **kwargs):
    tasks = {
        "digit": DigitsClassification(hidden_units=(16,), l2=l2),
        "parity": DigitsParity(hidden_units=(16,), l2=l2),
    }
    return Recording(tasks, weights=WEIGHTS, **kwargs)


def _train(task, model_dir, strategy="one_device", mode="train", steps=6):
    return run_experiment(
        task,
        str(model_dir),
        mode=mode,
        train_steps=steps,
        global_batch_size=16,
        learning_rate=0.01,
        steps_per_loop=3,
        eval_interval=steps,
        strategy=strategy,
        progress=False,
        seed=3,
    )


def test_two_replicas_equal_one_device_with_double_batch(tmp_path):
    one, two = _digits(l2=0.01), _digits(l2=0.01)
    _train(one, tmp_path / "one", "one_device")
    _train(two, tmp_path / "two", "mirrored")
    assert one.recorder.replicas == {1} and two.recorder.replicas == {2}
    assert [s for s, _ in two.recorder.calls] == [1, 2, 3, 4, 5, 6]
    for (s, l1), (_, l2) in zip(one.recorder.calls, two.recorder.calls, strict=True):
        for key in ("loss", "loss/digit", "loss/parity", "grad_norm"):
            np.testing.assert_allclose(l2[key], l1[key], rtol=1e-5, err_msg=f"{key} @{s}")
        # The trunk's L2 is counted once (not once per replica): it is all of loss - weighted.
        weighted = (l1["loss/digit"] + 0.5 * l1["loss/parity"]) / 1.5
        assert l1["loss"] > weighted + 1e-4
    for w1, w2 in zip(one.final, two.final, strict=True):
        np.testing.assert_allclose(w2, w1, rtol=1e-5, atol=1e-6)


def test_train_logs_per_task_losses_and_validation_excludes_tasks(tmp_path):
    task = _digits(sharing="separate", exclude_from_validation=["parity"])
    results = _train(task, tmp_path, mode="train_and_eval")
    for _, logs in task.recorder.calls:  # no regularisation: loss is the weighted mean exactly
        weighted = (logs["loss/digit"] + 0.5 * logs["loss/parity"]) / 1.5
        assert logs["loss"] == pytest.approx(weighted, rel=1e-5)
        assert {"accuracy/digit", "accuracy/parity"} <= logs.keys()
    assert logs["loss/parity"] < 0.8 < logs["loss/digit"]  # two different tasks, two losses
    assert set(results["eval"]) == {"loss", "loss/digit", "accuracy/digit"}
    assert results["eval"]["loss"] == results["eval"]["loss/digit"]


def test_validation_loss_is_the_weighted_mean_of_the_task_losses(tmp_path):
    results = _train(_digits(), tmp_path, mode="train_and_eval", steps=2)["eval"]
    digit, parity = results["loss/digit"], results["loss/parity"]
    assert digit > parity + 0.5  # far apart, so the weights (1 and 0.5) change the mean
    assert results["loss"] == pytest.approx((digit + 0.5 * parity) / 1.5, rel=1e-6)


@pytest.mark.parametrize(
    "sharing, kernels",
    [
        ("shared", [(64, 16), (16, 10)]),
        ("trunk", [(64, 16), (16, 10), (16, 2)]),
        ("separate", [(64, 16), (16, 10), (64, 16), (16, 2)]),
    ],
)
def test_sharing_modes_build_and_checkpoint_the_right_variables(tmp_path, sharing, kernels):
    task = _digits(sharing=sharing)
    model = task.build_model()
    assert [tuple(v.shape) for v in model.trainable_variables if v.shape.rank == 2] == kernels
    path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
    saved = [n for n, _ in tf.train.list_variables(path) if n.startswith("model/")]
    assert len(saved) == len(model.variables), saved
    outputs = model({"digit": tf.zeros((3, 64)), "parity": tf.zeros((3, 64))})
    assert {k: tuple(v.shape) for k, v in outputs.items()} == {
        "digit": (3, 10),
        "parity": (3, kernels[-1][1]),
    }


def test_tf_keras_tasks_give_a_tf_keras_model_and_flavours_must_match(tmp_path):
    task = MultiTask({"a": TinyTask(flavour="tf_keras"), "b": TinyTask(flavour="tf_keras")})
    model = task.build_model()
    assert isinstance(model, tf_keras.Model)
    path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
    saved = [n for n, _ in tf.train.list_variables(path) if n.startswith("model/")]
    assert len(saved) == len(model.variables) == 6, saved  # trunk 2, two heads 2 each
    mixed = MultiTask({"a": TinyTask(flavour="tf_keras"), "b": TinyTask()}, sharing="separate")
    with pytest.raises(TypeError, match="Keras models of one flavour"):
        mixed.build_model()


def test_validation_runs_every_tasks_whole_set():
    task = MultiTask({"long": TinyTask(n=40), "short": TinyTask(n=24)}, sharing="separate")
    sizes = {"long": 0, "short": 0}
    for batch in task.build_inputs(16, training=False):
        for name, (x, _) in batch.items():
            sizes[name] += int(x.shape[0])
    assert sizes == {"long": 40, "short": 24}  # a plain zip would stop the long task at 24


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"sharing": "tree"}, "`MultiTask.sharing` must be one of shared, trunk, separate"),
        ({"weights": {"a": 1.0}}, "`MultiTask.weights` must be a dict with one weight per task"),
        ({"weights": {"a": 1.0, "b": -1}}, "must be non-negative numbers"),
        ({"exclude_from_validation": ["c"]}, r"names unknown task\(s\) \['c'\]"),
        ({"exclude_from_validation": ["a", "b"]}, "excludes every task"),
        ({"head_layers": 0}, "`MultiTask.head_layers` must be a positive integer"),
    ],
)
def test_bad_settings_are_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MultiTask({"a": TinyTask(), "b": TinyTask()}, **kwargs)


def test_bad_tasks_are_named():
    with pytest.raises(TypeError, match=r"`MultiTask.tasks\['b'\]` must be a tasks.Task"):
        MultiTask({"a": TinyTask(), "b": 3})
    with pytest.raises(TypeError, match=r"`MultiTask.tasks` must be a non-empty dict"):
        MultiTask([TinyTask()])
    with pytest.raises(ValueError, match="names must be identifiers"):
        MultiTask({"a b": TinyTask()})


def test_experiment_trains_a_few_steps(tmp_path, capsys):
    status = train.main(
        [
            f"--gin_file={REPO / 'experiments' / 'digits_multitask.gin'}",
            "--gin_params=TRAIN_STEPS=4",
            "--gin_params=orbitask.run_experiment.eval_interval=4",
            "--gin_params=orbitask.run_experiment.eval_steps=2",
            "--gin_params=orbitask.run_experiment.progress=False",
            f"--model_dir={tmp_path}",
        ]
    )
    out = capsys.readouterr().out
    assert status == 0, out
    assert "loss/digit" in out and "loss/parity" in out and "accuracy/parity" in out
    # Trunk and both heads restore from the checkpoint (variables print under the optimizer's
    # references, so check the model's own path by restoring it).
    train.parse_gin([str(REPO / "experiments" / "digits_multitask.gin")], [])
    model = train.build_task().build_model()
    status = tf.train.Checkpoint(train_model=model).restore(
        tf.train.latest_checkpoint(str(tmp_path))
    )
    status.assert_existing_objects_matched()
    assert {"trunk_0", "trunk_1", "head_digit_0", "head_parity_0"} <= set(vars(model))
