"""Async checkpoints (`run_experiment.async_checkpoints`): the files are complete when the run
returns, raises or exits, and the input position is the saved step's.

Exact resume with them on is in test_resume.py and, on 2 workers, test_multi_worker.py; under
parameter_server in test_parameter_server.py; SIGTERM in test_reliability.py, a full disk in
test_full_disk.py.
"""

import json
import os
import threading

import keras
import pytest
import tensorflow as tf

from orbitask.trainers import compat, run_experiment
from orbitask.trainers.errors import ConfigError
from orbitask.trainers.state import checkpoint_files, checkpoint_manager
from orbitask.trainers.state.input_position import IteratorInput
from tests import faults
from tests.helpers import Killed, TinyTask

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Wide(TinyTask):
    """A 64 MiB hidden layer (with Nadam's slots ~190 MiB a checkpoint): writes take a while."""

    def build_model(self):
        return keras.Sequential(
            [keras.Input((6,)), keras.layers.Dense(4096), keras.layers.Dense(4096),
             keras.layers.Dense(3)]
        )  # fmt: skip


class FailAt(Wide):
    def __init__(self, step, **kwargs):
        super().__init__(**kwargs)
        self.fail_step = step

    def at_step(self):
        def fail(task, ctx):
            raise Killed(f"stopped at step {ctx.step}")

        return {self.fail_step: fail}


def _complete(model_dir, step):
    latest = tf.train.latest_checkpoint(str(model_dir))
    assert latest is not None and latest.endswith(f"ckpt-{step}"), latest
    assert checkpoint_files.unreadable_reason(latest) is None
    assert not [d for d, _, _ in os.walk(model_dir) if "_temp" in d]
    return latest


def _train(task, model_dir, steps, **kwargs):
    return run_experiment(
        task, str(model_dir), mode="train", train_steps=steps, global_batch_size=8,
        steps_per_loop=2, checkpoint_interval=4, progress=False, async_checkpoints=True,
        **kwargs,
    )  # fmt: skip


@pytest.mark.slow
def test_the_last_save_is_complete_when_run_experiment_returns(tmp_path):
    _train(Wide(), tmp_path, 6)
    _complete(tmp_path, 6)


@pytest.mark.slow
def test_the_last_save_is_complete_when_the_run_raises(tmp_path):
    with pytest.raises(Killed, match="stopped at step 5"):
        _train(FailAt(5), tmp_path, 10)
    _complete(tmp_path, 4)


@pytest.mark.slow
def test_a_process_that_exits_right_after_its_final_save_leaves_it_complete(tmp_path):
    model_dir = tmp_path / "run"
    extra = [
        "orbitask.run_experiment.async_checkpoints=True",
        "orbitask.DigitsClassification.hidden_units=(4096, 4096)",  # ~190 MiB a checkpoint
        "orbitask.DigitsClassification.shuffle_buffer=512",  # a tf.data position under input/
    ]
    done = faults.run(faults.command(model_dir, steps=30, extra=extra))
    assert done.returncode == 0, done.stderr[-3000:]
    latest = _complete(model_dir, 30)
    record = json.loads(tf.train.load_checkpoint(latest).get_tensor(
        "input_position/.ATTRIBUTES/py_state"
    ))  # fmt: skip
    assert record["step"] == 30
    assert os.path.exists(model_dir / "input" / "ckpt-30" / "worker-0-of-1.index")


def test_the_input_position_is_taken_on_the_training_thread_at_the_saved_step(tmp_path):
    threads = []

    class Recorded(IteratorInput):
        def serialize(self):
            threads.append(threading.current_thread())
            return super().serialize()

    def build():
        return iter(tf.data.Dataset.range(100))

    step = tf.Variable(3, dtype=tf.int64)
    position = Recorded(build(), step, 1, build, str(tmp_path))
    checkpoint = tf.train.Checkpoint(step=step, big=tf.Variable(tf.zeros([4096, 4096])))
    checkpoint.input_position = position
    compat.enable_async_writes(checkpoint)
    manager = checkpoint_manager.SafeCheckpointManager(checkpoint, str(tmp_path), max_to_keep=3)
    for _ in range(3):
        next(position.iterator)
    manager.save(3, options=tf.train.CheckpointOptions(enable_async=True))
    step.assign(7)  # training goes on while the background thread writes
    for _ in range(4):
        next(position.iterator)
    manager.sync()
    assert threads == [threading.main_thread()]
    record = json.loads(tf.train.load_checkpoint(str(tmp_path / "ckpt-3")).get_tensor(
        "input_position/.ATTRIBUTES/py_state"
    ))  # fmt: skip
    assert record["step"] == 3
    restored = Recorded(build(), tf.Variable(0, dtype=tf.int64), 1, build, str(tmp_path))
    tf.train.Checkpoint(input_position=restored).restore(str(tmp_path / "ckpt-3"))
    assert int(next(restored.iterator)) == 3


def test_a_non_boolean_setting_is_one_line():
    with pytest.raises(ConfigError, match="Expected True or False. Received: async_checkpoints="):
        run_experiment(TinyTask(), "unused", mode="train", train_steps=1, async_checkpoints=1)
