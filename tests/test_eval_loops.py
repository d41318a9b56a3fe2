"""Evaluation in device loops: the same logs as step by step, on 1 and 2 replicas.

With the default log reduction an evaluation is one `tf.while_loop` summing the logs on the
device; a task with its own `aggregate_logs` runs step by step. Both give the same results, with
a partial last batch, a dataset of unknown length, and `eval_steps`.
"""

import numpy as np
import pytest
import tensorflow as tf

from orbitask.tasks import eval_logs
from orbitask.trainers import ConfigError, run_experiment
from tests.helpers import TinyTask


class Unsized(TinyTask):
    """Validation: 90 examples (a partial last batch), of unknown length to tf.data."""

    def __init__(self, **kwargs):
        super().__init__(n=90, **kwargs)

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ds = super().build_inputs(per_replica_batch_size, input_context, training)
        return ds if training else ds.filter(lambda x, y: True)


class StepByStep(Unsized):
    """The same logs through a Python-side `aggregate_logs` (one host call per step)."""

    def aggregate_logs(self, state, step_logs):
        self.host_steps = getattr(self, "host_steps", 0) + 1
        return eval_logs.aggregate(state, step_logs)


def _evaluate(task, tmp_path, strategy, eval_steps=None):
    logs = run_experiment(
        task,
        str(tmp_path / type(task).__name__ / strategy / str(eval_steps)),
        mode="train_and_eval",
        train_steps=3,
        global_batch_size=16,
        eval_steps=eval_steps,
        strategy=strategy,
        progress=False,
    )
    return logs["eval"]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
@pytest.mark.parametrize("eval_steps", [None, 4])
def test_a_device_loop_evaluates_like_step_by_step(tmp_path, strategy, eval_steps):
    device = _evaluate(Unsized(), tmp_path, strategy, eval_steps)
    python_side = StepByStep()
    host = _evaluate(python_side, tmp_path, strategy, eval_steps)
    # The whole set: 90 examples in 6 steps of 16 (the last one partial); or 4 steps of 16.
    assert python_side.host_steps == (eval_steps or 6)
    assert device.keys() == host.keys() == {"loss", "accuracy"}
    for key in device:
        assert device[key] == pytest.approx(host[key], rel=1e-6), key


@pytest.mark.slow
def test_two_replicas_evaluate_like_one_device(tmp_path):
    one = _evaluate(Unsized(), tmp_path, "one_device")
    two = _evaluate(Unsized(), tmp_path, "mirrored")
    for key in one:
        np.testing.assert_allclose(two[key], one[key], rtol=1e-5)


def test_an_empty_validation_set_is_one_line_not_zeros(tmp_path):
    class Empty(TinyTask):
        def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
            ds = super().build_inputs(per_replica_batch_size, input_context, training)
            return ds if training else ds.take(0)

    with pytest.raises(ConfigError, match=r"build_inputs\(training=False\) yields no batches"):
        _evaluate(Empty(), tmp_path, "one_device")


class MeanLoss(Unsized):
    """A validation step returning its batch's mean loss (no `num_examples`): the evaluation
    reports the mean over replicas and steps."""

    def validation_step(self, batch, model, metrics=None, *, loss_fn, lr):
        logs = super().validation_step(batch, model, metrics, loss_fn=loss_fn, lr=lr)
        return {"loss": logs["loss"] / tf.maximum(logs["num_examples"], 1.0)}


class MeanLossStepByStep(MeanLoss, StepByStep):
    pass


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_a_mean_per_step_is_averaged_over_replicas_and_steps_alike(tmp_path, strategy):
    device = _evaluate(MeanLoss(), tmp_path, strategy)
    host = _evaluate(MeanLossStepByStep(), tmp_path, strategy)
    assert device["loss"] == pytest.approx(host["loss"], rel=1e-6)


class PerExample(Unsized):
    """COCO-style: per-example losses gathered on the host, reduced once at the end."""

    def validation_step(self, batch, model, metrics=None, *, loss_fn, lr):
        x, y = batch
        logits = model(x, training=False)
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        return {"losses": losses}

    def aggregate_logs(self, state, step_logs):
        state = list(state or [])
        step = np.concatenate([np.reshape(v, [-1]) for v in step_logs["losses"]])
        self.step_sizes = [*getattr(self, "step_sizes", []), len(step)]
        return state + list(step)

    def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
        return {"count": float(len(aggregated_logs)), "mean": float(np.mean(aggregated_logs))}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_a_python_side_reduction_gets_every_examples_output(tmp_path, strategy):
    task = PerExample()
    gathered = _evaluate(task, tmp_path, strategy)
    assert task.step_sizes == [16, 16, 16, 16, 16, 10]  # each step's outputs, the last partial
    assert gathered["count"] == 90
    summed = _evaluate(Unsized(), tmp_path, strategy)  # the same weights, reduced on the device
    assert gathered["mean"] == pytest.approx(summed["loss"], rel=1e-5)


class Counted(PerExample):
    """Counts validation steps on the device; `aggregate_logs` records the count it sees."""

    def build_metrics(self, training=True):
        if not training:
            self.ran = tf.Variable(0, trainable=False)
        return super().build_metrics(training)

    def validation_step(self, batch, model, metrics=None, *, loss_fn, lr):
        with tf.control_dependencies([self.ran.assign_add(1)]):
            return super().validation_step(batch, model, metrics, loss_fn=loss_fn, lr=lr)

    def aggregate_logs(self, state, step_logs):
        self.seen_when_folding = [*getattr(self, "seen_when_folding", []), int(self.ran.numpy())]
        return super().aggregate_logs(state, step_logs)


def test_a_python_side_reduction_gets_a_whole_device_loop_at_once(tmp_path):
    """The steps run in one device loop before the host folds in the first one's outputs."""
    task = Counted()
    _evaluate(task, tmp_path, "one_device")
    assert task.seen_when_folding[-6:] == [task.seen_when_folding[-1]] * 6
    assert task.seen_when_folding[-1] % 6 == 0


class Padded(PerExample):
    """Outputs whose inner shape changes from step to step (sequences padded per batch)."""

    def validation_step(self, batch, model, metrics=None, *, loss_fn, lr):
        x, y = batch
        length = tf.reduce_max(y) + 1  # each batch pads to its own longest label
        return {"padded": tf.ones([tf.shape(x)[0], length]) * tf.cast(length, tf.float32)}

    def aggregate_logs(self, state, step_logs):
        self.widths = [
            *getattr(self, "widths", []),
            *[int(v.shape[1]) for v in step_logs["padded"]],
        ]
        return super().aggregate_logs(state, {"losses": [v[:, 0] for v in step_logs["padded"]]})


def test_outputs_whose_shape_changes_between_steps_reach_aggregate_logs_whole(tmp_path):
    task = Padded()
    logs = _evaluate(task, tmp_path, "one_device")
    assert logs["count"] == 90.0
    assert len(task.widths) == 6 and all(w >= 1 for w in task.widths)
    assert logs["mean"] == pytest.approx(np.mean(np.repeat(task.widths, [16] * 5 + [10])))
