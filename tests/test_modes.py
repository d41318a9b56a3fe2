"""The runner's modes: train, eval, train_and_eval and continuous_eval."""

import numpy as np
import tensorflow as tf

from orbitask.trainers import run_experiment
from tests.helpers import TinyTask


def _run(model_dir, mode, steps, **kwargs):
    return run_experiment(
        TinyTask(),
        str(model_dir),
        mode=mode,
        train_steps=steps,
        global_batch_size=8,
        checkpoint_interval=5,
        progress=False,
        **kwargs,
    )


def test_eval_mode_evaluates_the_latest_checkpoint(tmp_path):
    trained = _run(tmp_path, "train_and_eval", 10, eval_interval=10)
    evaluated = _run(tmp_path, "eval", 10)
    assert evaluated["train"] == {}
    np.testing.assert_allclose(evaluated["eval"]["loss"], trained["eval"]["loss"], rtol=1e-6)
    assert set(evaluated["eval"]) >= {"loss", "accuracy"}


def test_eval_loss_is_the_mean_over_the_whole_validation_set(tmp_path):
    logs = _run(tmp_path, "train_and_eval", 5, eval_interval=5)
    task = TinyTask()
    model = task.build_model()
    # Same weights as the run's final checkpoint.
    tf.train.Checkpoint(train_model=model).restore(
        tf.train.latest_checkpoint(str(tmp_path))
    ).expect_partial()
    logits = model(task.x)
    expected = task.build_losses()((logits, task.y)).numpy() / len(task.x)
    np.testing.assert_allclose(logs["eval"]["loss"], expected, rtol=1e-5)


def test_continuous_eval_stops_after_the_last_checkpoint(tmp_path):
    _run(tmp_path, "train", 10)
    logs = _run(tmp_path, "continuous_eval", 10, continuous_eval_timeout=1)
    assert "loss" in logs["eval"]


def test_train_and_eval_evaluates_every_interval(tmp_path):
    seen = []

    class Counting(TinyTask):
        def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
            seen.append(global_step)
            return super().reduce_aggregated_logs(aggregated_logs, global_step)

    run_experiment(
        Counting(),
        str(tmp_path),
        mode="train_and_eval",
        train_steps=12,
        global_batch_size=8,
        eval_interval=4,
        progress=False,
    )
    assert seen == [4, 8, 12]
