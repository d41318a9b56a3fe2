"""EMA of weights: exact averages, evaluation with them, training on the raw weights."""

import numpy as np
import pytest
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


def _shadows(model_dir, count):
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
    return [reader.get_tensor(f"ema/shadows/{i}/.ATTRIBUTES/VARIABLE_VALUE") for i in range(count)]


def test_ema_averages_and_evaluates_with_the_average(tmp_path):
    """Decay 0.8 over 5 steps: a formula mixing up `decay` and `1 - decay` gives another average
    (at 0.5 the two agree)."""
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
        ema=ExponentialMovingAverage(decay=0.8),
    )
    expected = [np.array(v) for v in Tracked().build_model().trainable_variables]
    for weights in task.trajectory:
        expected = [0.8 * s + 0.2 * w for s, w in zip(expected, weights, strict=True)]

    shadows = _shadows(tmp_path, len(expected))
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
    shadows = _shadows(tmp_path, len(task.trajectory[-1]))
    # The first evaluation is the best so far: exported at step 4 with the averages swapped in.
    best = checkpoint_weights(Tracked(), tmp_path / "best")
    for got, want in zip(best, shadows, strict=True):
        np.testing.assert_array_equal(got, want)
    assert not np.allclose(best[0], task.trajectory[-1][0])  # not the raw weights
    # ... and swapped back: the run's own checkpoint keeps the raw weights.
    for got, raw in zip(checkpoint_weights(Tracked(), tmp_path), task.trajectory[-1], strict=True):
        np.testing.assert_array_equal(got, raw)


@pytest.mark.slow
def test_a_resumed_run_continues_the_averages(tmp_path):
    """3 steps, then a resume to 6: the shadows restored from the checkpoint go on averaging, as
    in an uninterrupted run (shadows started afresh from the resumed weights would differ)."""

    def train(model_dir, steps):
        task = Tracked()
        run_experiment(
            task,
            str(model_dir),
            mode="train",
            train_steps=steps,
            global_batch_size=8,
            learning_rate=0.1,
            checkpoint_interval=3,
            progress=False,
            ema=ExponentialMovingAverage(decay=0.8),
        )
        return task

    full = train(tmp_path / "full", 6)
    train(tmp_path / "split", 3)
    resumed = train(tmp_path / "split", 6)
    assert len(resumed.trajectory) == 3  # steps 4, 5 and 6 only
    count = len(full.trajectory[0])
    for got, want in zip(
        _shadows(tmp_path / "split", count), _shadows(tmp_path / "full", count), strict=True
    ):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    expected = [np.array(v) for v in Tracked().build_model().trainable_variables]
    for weights in full.trajectory:
        expected = [0.8 * s + 0.2 * w for s, w in zip(expected, weights, strict=True)]
    for got, want in zip(_shadows(tmp_path / "split", count), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
