"""EMA of weights: exact averages, evaluation with them, training on the raw weights."""

import numpy as np
import tensorflow as tf

from orbitask.trainers import ExponentialMovingAverage, ValidationControl, run_experiment
from tests.helpers import TinyTask, checkpoint_weights


class Tracked(TinyTask):
    def __init__(self):
        super().__init__(l2=0.0)
        self.trajectory = []

    def every_steps(self):
        return {
            1: lambda task, ctx: self.trajectory.append(
                [np.array(v) for v in ctx.model.trainable_variables]
            )
        }


def test_ema_averages_and_evaluates_with_the_average(tmp_path):
    task = Tracked()
    logs = run_experiment(
        task,
        str(tmp_path),
        mode="train_and_eval",
        train_steps=5,
        global_batch_size=8,
        learning_rate=0.1,
        eval_interval=5,
        progress=False,
        ema=ExponentialMovingAverage(decay=0.5),
    )
    expected = [np.array(v) for v in Tracked().build_model().trainable_variables]
    for weights in task.trajectory:
        expected = [0.5 * s + 0.5 * w for s, w in zip(expected, weights, strict=True)]

    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(tmp_path)))
    shadows = [
        reader.get_tensor(f"ema/shadows/{i}/.ATTRIBUTES/VARIABLE_VALUE")
        for i in range(len(expected))
    ]
    for got, want in zip(shadows, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(shadows[0], task.trajectory[-1][0])  # an average, not the weights

    # Training (and the checkpoint's model) kept the raw weights, swapped back after the eval.
    for got, raw in zip(checkpoint_weights(Tracked(), tmp_path), task.trajectory[-1], strict=True):
        np.testing.assert_array_equal(got, raw)

    # The evaluation used the averaged weights.
    model = Tracked().build_model()
    for variable, value in zip(model.trainable_variables, shadows, strict=True):
        variable.assign(value)
    loss = task.build_losses()((model(task.x), task.y)).numpy() / len(task.x)
    np.testing.assert_allclose(logs["eval"]["loss"], loss, rtol=1e-5)


def test_best_checkpoint_export_holds_the_averaged_weights(tmp_path):
    task = Tracked()
    run_experiment(
        task,
        str(tmp_path),
        mode="train_and_eval",
        train_steps=4,
        global_batch_size=8,
        learning_rate=0.1,
        eval_interval=4,
        progress=False,
        ema=ExponentialMovingAverage(decay=0.5),
        validation_control=ValidationControl(metric="loss"),
    )
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(tmp_path)))
    shadows = [
        reader.get_tensor(f"ema/shadows/{i}/.ATTRIBUTES/VARIABLE_VALUE")
        for i in range(len(task.trajectory[-1]))
    ]
    # The first evaluation is the best so far: exported at step 4 with the averages swapped in.
    best = checkpoint_weights(Tracked(), tmp_path / "best")
    for got, want in zip(best, shadows, strict=True):
        np.testing.assert_array_equal(got, want)
    assert not np.allclose(best[0], task.trajectory[-1][0])  # not the raw weights
    # ... and swapped back: the run's own checkpoint keeps the raw weights.
    for got, raw in zip(checkpoint_weights(Tracked(), tmp_path), task.trajectory[-1], strict=True):
        np.testing.assert_array_equal(got, raw)
