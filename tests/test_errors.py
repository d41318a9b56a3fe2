"""Configuration mistakes are one line (exit 2); the user's own bugs keep their traceback (exit 1);
a dataset that ends early and a data error in a step name the step."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from orbitask.trainers import ConfigError, run_experiment
from tests.helpers import TinyTask

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(task, model_dir, **kwargs):
    settings = dict(mode="train", train_steps=3, global_batch_size=8, progress=False)
    settings.update(kwargs)
    return run_experiment(task, str(model_dir), **settings)


class WrongWeights(TinyTask):
    def build_model(self):
        model = super().build_model()
        model.layers[0].set_weights([np.zeros((64, 64), np.float32)])  # the user's bug
        return model


def test_a_bug_in_build_model_keeps_its_type_and_traceback(tmp_path):
    with pytest.raises(ValueError) as info:
        _run(WrongWeights(), tmp_path)
    assert not isinstance(info.value, ConfigError)
    frames = [frame.name for frame in info.traceback]
    assert "build_model" in frames


USER_TASK = textwrap.dedent(
    """
    import gin
    import numpy as np
    from tests.helpers import TinyTask

    @gin.configurable
    class BuggyTask(TinyTask):
        def build_model(self):
            model = super().build_model()
            model.layers[0].set_weights([np.zeros((64, 64), np.float32)])
            return model
    """
)


def test_the_binary_prints_the_users_traceback_and_exits_1(tmp_path):
    (tmp_path / "buggy_task.py").write_text(USER_TASK)
    (tmp_path / "buggy.gin").write_text(
        "include 'configs/defaults.gin'\nimport buggy_task\n"
        "TASK = @BuggyTask()\nTRAIN_STEPS = 3\norbitask.run_experiment.progress = False\n"
    )
    env = dict(os.environ, PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(
        [sys.executable, "-m", "orbitask.trainers.train", "--gin_file=buggy.gin",
         f"--model_dir={tmp_path / 'run'}", "--mode=train"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "Traceback (most recent call last)" in result.stderr
    assert 'buggy_task.py", line 10, in build_model' in result.stderr
    assert "orbitask: error:" not in result.stderr


def test_a_configuration_mistake_is_one_line_and_exit_2(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(
        [sys.executable, "-m", "orbitask.trainers.train", "--gin_file=experiments/digits.gin",
         "--gin_params=orbitask.run_experiment.steps_per_loop = 0",
         f"--model_dir={tmp_path / 'run'}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("orbitask: error:")]
    assert lines == [
        "orbitask: error: `steps_per_loop` must be a positive integer; received 0. Set "
        "run_experiment.steps_per_loop in your experiment's .gin file or with --gin_params."
    ]


class Finite(TinyTask):
    """16 batches of 8, no repeat."""

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ds = tf.data.Dataset.from_tensor_slices((self.x[:128], self.y[:128]))
        return ds.batch(per_replica_batch_size, drop_remainder=True)


@pytest.mark.parametrize("steps_per_loop", [5, 100])
def test_a_dataset_that_ends_early_names_the_step_after_saving(tmp_path, steps_per_loop):
    task = Finite(n=128)
    with pytest.raises(
        ConfigError, match=r"ended after step 16 of train_steps 100: .*\.repeat\(\)"
    ):
        _run(task, tmp_path, train_steps=100, steps_per_loop=steps_per_loop, loop_seconds=None)
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-16")


class BadLabel(TinyTask):
    """Step 7's batch holds a label out of range."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.y = self.y.copy()
        self.y[6 * 8 + 3] = 40

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ds = tf.data.Dataset.from_tensor_slices((self.x, self.y))
        return ds.batch(per_replica_batch_size, drop_remainder=True).repeat()


def test_a_data_error_in_a_step_names_the_step(tmp_path):
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        _run(BadLabel(), tmp_path, train_steps=20, steps_per_loop=20, loop_seconds=None)
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "after global step 6" in notes, notes
