"""`run_eagerly`: the step and its stages run as Python, so a stage can read a tensor's value
(and stop at a breakpoint), on one device and on replicas."""

import numpy as np
import pytest
import tensorflow as tf

from orbitask.trainers import run_experiment
from tests.helpers import TinyTask


class Reads(TinyTask):
    """`loss_pre` reads its outputs' value with `.numpy()`: possible only eagerly."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.read = []

    def loss_pre(self, outputs, batch, model, lr):
        self.read.append(float(np.sum(outputs.numpy())))
        return super().loss_pre(outputs, batch, model, lr)


def _run(task, tmp_path, **kwargs):
    settings = dict(mode="train", train_steps=3, global_batch_size=8, steps_per_loop=3)
    return run_experiment(task, str(tmp_path), loop_seconds=None, progress=False,
                          **{**settings, **kwargs})  # fmt: skip


@pytest.mark.parametrize("strategy, replicas", [("one_device", 1), ("mirrored", 2)])
def test_a_stage_reads_tensor_values(tmp_path, capsys, strategy, replicas):
    task = Reads()
    _run(task, tmp_path, run_eagerly=True, strategy=strategy)
    # The pre-flight checks' calls on batches of zeros (outputs 0), then a call per replica and
    # step on the data.
    assert sum(1 for value in task.read if value != 0.0) == 3 * replicas, task.read
    assert "orbitask: run_eagerly: the step and its stages run eagerly" in capsys.readouterr().out
    assert not tf.config.functions_run_eagerly()  # the setting is put back


def test_without_it_the_stage_is_traced(tmp_path):
    with pytest.raises(AttributeError, match="numpy"):
        _run(Reads(), tmp_path / "traced")


class ReadsItsInput(TinyTask):
    """`input_pre`, in training, in the checks before step 1 and in validation, reads its batch
    with `.numpy()`; so does `loss_pre` (validation included)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inputs, self.losses = [], []

    def input_pre(self, batch, lr):
        self.inputs.append(batch[0].numpy().shape)
        return super().input_pre(batch, lr)

    def loss_pre(self, outputs, batch, model, lr):
        self.losses.append(batch[1].numpy().shape)
        return super().loss_pre(outputs, batch, model, lr)


def test_every_step_is_eager_in_train_and_eval_the_checks_before_step_1_included(tmp_path):
    task = ReadsItsInput()
    eval_settings = dict(mode="train_and_eval", eval_interval=3, eval_steps=2)
    logs = _run(task, tmp_path, run_eagerly=True, **eval_settings)
    assert logs["train"]["loss"] > 0 and logs["eval"]["loss"] > 0
    # 3 train steps and 2 validation steps, besides the checks' batches of zeros and the first
    # validation batch.
    assert task.inputs.count((8, 6)) >= 3 + 2, task.inputs
    assert task.losses.count((8,)) >= 3 + 2, task.losses
    assert not tf.config.functions_run_eagerly()
