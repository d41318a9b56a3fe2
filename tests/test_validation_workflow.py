"""nabu's validation workflow: go back to the best, restore the best at the end, top-k best
checkpoints, patience in a row or in total, per-task bests, and a baseline evaluation."""

import json

import numpy as np
import pytest
import tensorflow as tf

from orbitask.tasks import MultiTask
from orbitask.trainers import ConfigError, ValidationControl, run_experiment
from tests.helpers import Killed, TinyTask


class Scored(TinyTask):
    """Each evaluation logs `score = scores[(step, optimizer rate)]` (lower is better), so a
    resumed run scores a repeated evaluation as the first run did; `evaluated` lists the steps.
    `crash_at = (step, rate)`: the callback after that step raises (a killed run)."""

    def __init__(self, scores, crash_at=None, **kwargs):
        super().__init__(**kwargs)
        self.scores, self.crash_at = scores, crash_at
        self.order: list[tuple[int, float]] = []
        self.visits: list[dict] = []
        self.evaluated: list[int] = []

    def build_optimizer(self, learning_rate):
        self.optimizer = super().build_optimizer(learning_rate)
        return self.optimizer

    def every_steps(self):
        return {1: self._note}

    def _note(self, task, ctx):
        key = (ctx.step, round(float(ctx.logs["learning_rate"]), 6))
        self.order.append(key)
        iterations = int(ctx.optimizer.iterations.numpy())
        self.visits.append(dict(ctx.logs, iterations=iterations))
        if key == self.crash_at:
            raise Killed(f"killed after step {ctx.step}")

    def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
        logs = super().reduce_aggregated_logs(aggregated_logs, global_step)
        rate = round(float(self.optimizer.learning_rate.numpy()), 6)
        self.evaluated.append(int(global_step))
        if len(self.evaluated) > 12:  # a control that never stops going back
            raise RuntimeError(f"evaluated at steps {self.evaluated}")
        logs["score"] = self.scores.get((int(global_step), rate), 10.0)
        return logs


def _run(task, model_dir, steps, control, **kwargs):
    settings = dict(
        mode="train_and_eval",
        global_batch_size=8,
        learning_rate=0.05,
        eval_interval=2,
        checkpoint_interval=2,
        steps_per_loop=100,
        progress=False,
    )
    settings.update(kwargs)
    return run_experiment(
        task, str(model_dir), train_steps=steps, validation_control=control, **settings
    )


def _state(path) -> tuple:
    """(best value, worse validations, learning rate) in a checkpoint."""
    reader = tf.train.load_checkpoint(str(path))
    names = ("validation_control/best_value", "validation_control/worse_validations", "lr")
    return tuple(reader.get_tensor(f"{n}/.ATTRIBUTES/VARIABLE_VALUE").tolist() for n in names)


def _model_weights(path) -> list:
    model = TinyTask().build_model()
    tf.train.Checkpoint(train_model=model).restore(str(path)).expect_partial()
    return [v.numpy() for v in model.weights]


def _same_weights(a, b) -> None:
    for x, y in zip(_model_weights(a), _model_weights(b), strict=True):
        np.testing.assert_array_equal(x, y)


# Step 4 is worse twice (back to step 2, rate 0.025 then 0.0125), step 8 once (back to 6).
GO_BACK_SCORES = {
    (2, 0.05): 3.0,
    (4, 0.05): 4.0,
    (4, 0.025): 3.5,
    (4, 0.0125): 2.0,
    (6, 0.0125): 1.0,
    (8, 0.0125): 5.0,
    (8, 0.00625): 0.5,
}


def _go_back():
    return ValidationControl(metric="score", go_back=True, early_stop_patience=3)


@pytest.mark.slow
@pytest.mark.parametrize("strategy, killed", [("one_device", True), ("mirrored", False)])
def test_go_back_restores_the_best_and_a_killed_run_resumes_exactly(tmp_path, strategy, killed):
    """Uninterrupted on 1 device and 2 replicas; killed and resumed on 1 device (a resume on
    2 replicas is the same restore, test_resume.py)."""
    common = dict(strategy=strategy, keep_input_positions=1)  # older positions are deleted
    whole = Scored(GO_BACK_SCORES)
    _run(whole, tmp_path / "whole", 8, _go_back(), **common)
    assert whole.order == [
        (1, 0.05), (2, 0.05), (3, 0.05), (4, 0.05),
        (3, 0.025), (4, 0.025),
        (3, 0.0125), (4, 0.0125), (5, 0.0125), (6, 0.0125), (7, 0.0125), (8, 0.0125),
        (7, 0.00625), (8, 0.00625),
    ]  # fmt: skip
    assert whole.evaluated == [2, 4, 4, 4, 6, 8, 8]
    # Step 3 again: the loss of step 2's weights on step 3's batch (an input position deleted
    # in the run's own input/ and kept under best/), and the optimizer's count of step 3.
    for again in (4, 6):
        assert whole.visits[again]["loss"] == whole.visits[2]["loss"]
        assert whole.visits[again]["grad_norm"] == whole.visits[2]["grad_norm"]
    iterations = [v["iterations"] for v in whole.visits]
    assert iterations == [1, 2, 3, 4, 3, 4, 3, 4, 5, 6, 7, 8, 7, 8]
    # Going back keeps the counts and the rate: step 2 saved again after the second worse.
    assert _state(tmp_path / "whole" / "ckpt-2") == pytest.approx((3.0, 2, 0.0125))
    assert _state(tmp_path / "whole" / "ckpt-8") == pytest.approx((0.5, 0, 0.00625))
    info = json.loads((tmp_path / "whole" / "best" / "info.json").read_text())
    assert info["score"] == 0.5 and info["best_ckpt_global_step"] == 8

    if not killed:
        return
    # Killed after the replay of step 7, resumed from the checkpoint saved on going back to 6.
    split = tmp_path / "split"
    with pytest.raises(Killed, match="killed after step 7"):
        _run(Scored(GO_BACK_SCORES, crash_at=(7, 0.00625)), split, 8, _go_back(), **common)
    resumed = Scored(GO_BACK_SCORES)
    _run(resumed, split, 8, _go_back(), **common)
    assert resumed.order == [(7, 0.00625), (8, 0.00625)]
    assert _state(split / "ckpt-8") == _state(tmp_path / "whole" / "ckpt-8")
    _same_weights(split / "ckpt-8", tmp_path / "whole" / "ckpt-8")


def test_restore_best_puts_the_best_weights_in_the_final_checkpoint_and_export(tmp_path):
    """Scores 3, 2, 1, 4 at steps 2..8 on 2 replicas: the best is step 6; `best/` keeps the two
    best (steps 4 and 6); the final checkpoint and the SavedModel hold step 6's weights."""
    scores = {(2, 0.05): 3.0, (4, 0.05): 2.0, (6, 0.05): 1.0, (8, 0.05): 4.0}
    control = ValidationControl(metric="score", restore_best=True, keep_best=2)
    logs = _run(Scored(scores), tmp_path, 8, control, strategy="mirrored", export_at_end=True)
    best = sorted(p.name for p in (tmp_path / "best").glob("*.index"))
    assert best == ["best_ckpt-4.index", "best_ckpt-6.index"]
    _same_weights(tmp_path / "ckpt-8", tmp_path / "ckpt-6")
    _same_weights(tmp_path / "ckpt-8", tmp_path / "best" / "best_ckpt-6")
    exported = tf.train.load_checkpoint(f"{logs['export']}/variables/variables")
    values = [exported.get_tensor(k) for k in exported.get_variable_to_shape_map()]
    for weight in _model_weights(tmp_path / "ckpt-6"):
        assert any(v.shape == weight.shape and np.array_equal(v, weight) for v in values)
    assert not np.array_equal(_model_weights(tmp_path / "ckpt-4")[0], values[0])


def test_restore_best_acts_at_an_early_stop(tmp_path):
    """Scores 1, 2, 3 at steps 2..6 with patience 2: the run stops early at step 6, before
    `train_steps`, and its final checkpoint holds step 2's (the best) weights."""
    scores = {(2, 0.05): 1.0, (4, 0.05): 2.0, (6, 0.025): 3.0}
    control = ValidationControl(metric="score", restore_best=True, early_stop_patience=2)
    logs = _run(Scored(scores), tmp_path, 10, control)
    assert logs["early_stop"].startswith("early stop at step 6:"), logs
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-6")
    _same_weights(tmp_path / "ckpt-6", tmp_path / "ckpt-2")
    final, fourth = _model_weights(tmp_path / "ckpt-6"), _model_weights(tmp_path / "ckpt-4")
    assert not np.array_equal(final[0], fourth[0])


@pytest.mark.parametrize("reset, stop", [(False, 8), (True, None)])
def test_patience_counts_in_a_row_or_in_total(tmp_path, reset, stop):
    """Scores 3, 4, 1, 2 at steps 2..8, patience 2: the worse ones (4, 8) are not in a row."""
    scores = {(2, 0.05): 3.0, (4, 0.05): 4.0, (6, 0.025): 1.0, (8, 0.025): 2.0}
    control = ValidationControl(
        metric="score", early_stop_patience=2, reset_patience_on_improvement=reset
    )
    logs = _run(Scored(scores), tmp_path, 8, control)
    if stop:
        assert logs["early_stop"].startswith(f"early stop at step {stop}:"), logs
        assert _state(tmp_path / "ckpt-8") == pytest.approx((1.0, 2, 0.0125))
    else:
        assert "early_stop" not in logs
        assert _state(tmp_path / "ckpt-8") == pytest.approx((1.0, 1, 0.0125))


class ScoredTasks(MultiTask):
    """Each evaluation's `loss/<task>` is `scores[step][task]`."""

    def __init__(self, scores):
        super().__init__({"a": TinyTask(n=16), "b": TinyTask(n=16, seed=1)}, sharing="shared")
        self.scores = scores

    def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
        logs = super().reduce_aggregated_logs(aggregated_logs, global_step)
        per_task = self.scores[int(global_step)]
        logs.update({f"loss/{name}": value for name, value in per_task.items()})
        logs["loss"] = sum(per_task.values()) / len(per_task)
        return logs


def test_per_task_keeps_a_best_per_task_and_acts_when_any_gets_worse(tmp_path):
    """At step 4 task b gets worse while the mean improves: the rate is halved and b counted;
    at step 6 both improve: the bests move and b's count resets."""
    scores = {2: {"a": 3.0, "b": 3.0}, 4: {"a": 1.0, "b": 3.5}, 6: {"a": 0.5, "b": 2.0}}
    control = ValidationControl(metric="loss", per_task=True, early_stop_patience=2)
    _run(ScoredTasks(scores), tmp_path, 6, control)
    best, worse, rate = _state(tmp_path / "ckpt-4")
    assert (best, worse, rate) == ([3.0, 3.0], [0, 1], pytest.approx(0.025))
    best, worse, rate = _state(tmp_path / "ckpt-6")
    assert (best, worse, rate) == ([0.5, 2.0], [0, 0], pytest.approx(0.025))
    info = json.loads((tmp_path / "best" / "info.json").read_text())
    assert info["best_ckpt_global_step"] == 6


def test_a_baseline_evaluation_runs_once_and_counts_as_the_first_best(tmp_path):
    """A checkpoint of --mode=train at step 2 records no evaluation: train_and_eval with
    `eval_at_start` evaluates it first (2.0), so step 4 (3.0) is worse and halves the rate. A
    resume of that run evaluates no baseline again."""
    scores = {(2, 0.05): 2.0, (4, 0.05): 3.0, (6, 0.025): 1.0}
    _run(Scored(scores), tmp_path, 2, None, mode="train")
    first = Scored(scores)
    _run(first, tmp_path, 4, ValidationControl(metric="score"), eval_at_start=True)
    assert first.evaluated == [2, 4]
    assert _state(tmp_path / "ckpt-4") == pytest.approx((2.0, 1, 0.025))
    again = Scored(scores)
    _run(again, tmp_path, 6, ValidationControl(metric="score"), eval_at_start=True)
    assert again.evaluated == [6]
    assert _state(tmp_path / "ckpt-6") == pytest.approx((1.0, 0, 0.025))


@pytest.mark.parametrize(
    "control, settings, message",
    [
        (
            dict(go_back=True),
            {},
            r"^`ValidationControl.go_back = True` needs `early_stop_patience`",
        ),
        (dict(keep_best=0), {}, r"^Expected a positive integer. Received: keep_best=0 "),
        (
            dict(reset_patience_on_improvement="no"),
            {},
            r"^Expected True or False. Received: reset_patience_on_improvement='no'",
        ),
        (dict(per_task=True), {}, r"^`ValidationControl.per_task = True` needs a MultiTask"),
        (
            dict(restore_best=True),
            {"ema": "ema"},
            r"^`ValidationControl.go_back` and `.restore_best` cannot be used with",
        ),
        ({}, {"eval_at_start": 1}, r"^Expected True or False. Received: eval_at_start=1 "),
    ],
)
def test_bad_settings_are_one_line(tmp_path, control, settings, message):
    from orbitask.trainers import ExponentialMovingAverage

    with pytest.raises(ConfigError, match=message) as info:
        if settings.get("ema"):
            settings = dict(settings, ema=ExponentialMovingAverage())
        _run(Scored({}), tmp_path, 2, ValidationControl(metric="score", **control), **settings)
    assert "\n" not in str(info.value).split("\n  In call to configurable")[0]
