"""Gradient accumulation, learning-rate schedules, and nabu's validation-driven control."""

import json

import numpy as np
import pytest
import tensorflow as tf

from orbitask.trainers import ValidationControl, learning_rate_schedule, run_experiment
from tests.helpers import LinearTask, Recorder, StepRecorder, TinyTask, checkpoint_weights


class Rec(TinyTask):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.rec = Recorder()
        self.seen = StepRecorder()

    def every_steps(self):
        return {1: [self.rec, self.seen]}


def _weights(model_dir):
    return checkpoint_weights(Rec(l2=0.05), model_dir)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_accumulating_k_batches_equals_one_batch_k_times_larger(tmp_path, strategy):
    common = dict(mode="train", learning_rate=0.05, progress=False, strategy=strategy)
    big, acc = Rec(l2=0.05), Rec(l2=0.05)
    run_experiment(big, str(tmp_path / "big"), train_steps=3, global_batch_size=24, **common)
    run_experiment(
        acc,
        str(tmp_path / "acc"),
        train_steps=3,
        global_batch_size=8,
        gradient_accumulation_steps=3,
        **common,
    )
    # The step counter and callbacks count optimizer updates.
    assert [s for s, _ in acc.rec.calls] == [1, 2, 3]
    replicas = 2 if strategy == "mirrored" else 1
    assert big.rec.replicas == acc.rec.replicas == {replicas}
    for (_, a), (_, b) in zip(big.rec.calls, acc.rec.calls, strict=True):
        np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-5)
        np.testing.assert_allclose(b["grad_norm"], a["grad_norm"], rtol=1e-5)
    wa, wb = _weights(tmp_path / "big"), _weights(tmp_path / "acc")
    for a, b in zip(wa, wb, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "kind,kwargs,at",
    [
        ("exponential", dict(decay_steps=10, decay_rate=0.5), {0: 0.1, 10: 0.05, 20: 0.025}),
        ("cosine", dict(decay_steps=10), {0: 0.1, 5: 0.05, 10: 0.0}),
        ("constant", dict(warmup_steps=4), {0: 0.0, 2: 0.05, 4: 0.1, 9: 0.1}),
        (
            "piecewise",
            dict(boundaries=(2, 4), values=(0.1, 0.05, 0.01)),
            {0: 0.1, 2: 0.1, 3: 0.05, 5: 0.01},
        ),
        ("polynomial", dict(decay_steps=10, end=0.0, power=2.0), {0: 0.1, 5: 0.025, 10: 0.0}),
        ("inverse_sqrt", {}, {0: 0.1, 4: 0.05, 16: 0.025}),
        (
            "cosine_restarts",
            dict(decay_steps=4, t_mul=2.0, m_mul=0.5),
            {0: 0.1, 2: 0.05, 4: 0.05, 8: 0.025},
        ),
    ],
)
def test_schedules_drive_the_rate_at_every_step(tmp_path, kind, kwargs, at):
    schedule = learning_rate_schedule(kind, initial=0.1, **kwargs)
    for step, value in at.items():
        assert float(schedule(step)) == pytest.approx(value, abs=1e-6)
    task = Rec()
    run_experiment(
        task,
        str(tmp_path),
        mode="train",
        train_steps=6,
        global_batch_size=8,
        learning_rate=schedule,
        steps_per_loop=100,
        progress=False,
    )
    # Logged after step s: the rate used by step s was schedule(s - 1), in the optimizer too.
    for step, logs in task.rec.calls:
        assert logs["learning_rate"] == pytest.approx(float(schedule(step - 1)), rel=1e-5)
        rate = task.seen.steps[step]["optimizer_lr"]
        assert rate == pytest.approx(float(schedule(step - 1)), rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("flavour", ["keras", "tf_keras"])
def test_schedule_moves_sgd_weights_by_exactly_the_scheduled_rate(tmp_path, flavour):
    """The weight's gradient is exactly 1 (LinearTask): step s moves it by -schedule(s - 1)."""

    class Linear(LinearTask):
        def every_steps(self):
            return {1: self.seen}

    schedule = learning_rate_schedule("exponential", initial=0.1, decay_steps=2, decay_rate=0.5)
    task = Linear(np.ones((40, 1)), flavour=flavour)
    task.seen = StepRecorder()
    run_experiment(
        task,
        str(tmp_path),
        mode="train",
        train_steps=5,
        global_batch_size=8,
        learning_rate=schedule,
        steps_per_loop=100,
        checkpoint_interval=None,
        progress=False,
    )
    rates = [float(schedule(s)) for s in range(5)]  # 0.1, 0.0707, 0.05, 0.0354, 0.025
    assert task.seen.column("optimizer_lr") == pytest.approx(rates, rel=1e-6)
    moved = [float(w[0].item()) for w in task.seen.column("weights")]
    assert moved == pytest.approx(-np.cumsum(rates), rel=1e-5)


def test_inverse_sqrt_with_warm_up_is_the_transformer_tutorials_schedule():
    """TensorFlow's Transformer tutorial: `d_model ** -0.5 * min(step ** -0.5, step *
    warmup_steps ** -1.5)`, its `CustomSchedule` as the tutorial writes it."""
    d_model, warmup = 128, 4000

    def tutorial(step):
        step = tf.cast(step, tf.float32)
        arg1, arg2 = tf.math.rsqrt(step), step * (warmup**-1.5)
        return tf.math.rsqrt(tf.cast(d_model, tf.float32)) * tf.math.minimum(arg1, arg2)

    ours = learning_rate_schedule("inverse_sqrt", initial=d_model**-0.5, warmup_steps=warmup)
    for step in (1, 100, 3999, 4000, 4001, 20000):
        assert float(ours(step)) == pytest.approx(float(tutorial(step)), rel=1e-5), step


def test_piecewise_needs_one_value_more_than_boundaries():
    with pytest.raises(ValueError, match=r"one rate more than boundaries .* values=\(0.1,\)"):
        learning_rate_schedule("piecewise", boundaries=(5,), values=(0.1,))


def test_schedule_needs_decay_steps():
    with pytest.raises(ValueError, match="decay_steps"):
        learning_rate_schedule("cosine")


class Worsening(TinyTask):
    """Validation loss rises after the first evaluation (a huge learning rate diverges)."""

    def __init__(self):
        super().__init__()
        self.rates = Recorder()
        self.seen = StepRecorder()

    def every_steps(self):
        return {1: [self.rates, self.seen]}


def _control_run(model_dir, steps, control, lr=3.0):
    task = Worsening()
    logs = run_experiment(
        task,
        str(model_dir),
        mode="train_and_eval",
        train_steps=steps,
        global_batch_size=8,
        learning_rate=lr,
        eval_interval=2,
        checkpoint_interval=2,
        progress=False,
        validation_control=control,
    )
    return task, logs


def test_halves_lr_on_worse_validation_exports_best_and_stops_early(tmp_path):
    control = ValidationControl(metric="loss", early_stop_patience=2)
    task, logs = _control_run(tmp_path, 40, control)
    assert "early_stop" in logs and "did not improve for 2" in logs["early_stop"]
    stopped = int(logs["early_stop"].split("step ")[1].split(":")[0])
    assert stopped < 40
    rates = {round(logs_["learning_rate"], 6) for _, logs_ in task.rates.calls}
    rates = sorted(rates, reverse=True)
    assert rates[:2] == [3.0, 1.5]  # halved once per worse validation
    # The optimizer's own rate follows: after every step it is the logged one.
    logged = [logs_["learning_rate"] for logs_ in task.seen.column("logs")]
    assert task.seen.column("optimizer_lr") == pytest.approx(logged, rel=1e-6)
    optimizer_rates = sorted(set(np.round(task.seen.column("optimizer_lr"), 6)), reverse=True)
    assert optimizer_rates[:2] == [3.0, 1.5]
    best = json.loads((tmp_path / "best" / "info.json").read_text())
    assert best["loss"] <= logs["eval"]["loss"]
    assert tf.train.latest_checkpoint(str(tmp_path / "best"))

    # A restart knows it stopped, and keeps the halved rate and the best value.
    again, logs2 = _control_run(
        tmp_path, 40, ValidationControl(metric="loss", early_stop_patience=2)
    )
    assert "already stopped early" in logs2.get("early_stop", ""), logs2
    assert again.rates.calls == []


def test_unknown_metric_is_named(tmp_path):
    with pytest.raises(ValueError, match="'acc' is not in the eval logs"):
        _control_run(tmp_path, 2, ValidationControl(metric="acc"))


class Scripted(TinyTask):
    """Each evaluation logs the next of `scores` as `score` (lower is better)."""

    def __init__(self, scores):
        super().__init__()
        self.scores = list(scores)
        self.rates = Recorder()

    def every_steps(self):
        return {1: self.rates}

    def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
        logs = super().reduce_aggregated_logs(aggregated_logs, global_step)
        logs["score"] = self.scores.pop(0)
        return logs


def _model_weights(path):
    model = Scripted([]).build_model()
    tf.train.Checkpoint(train_model=model).restore(path).expect_partial()
    return [np.array(v) for v in model.weights]


def test_patience_counts_worse_validations_in_a_row_and_best_holds_the_best_weights(tmp_path):
    # Evaluations at steps 2, 4, 6, 8, 10: best, worse, best, worse, worse -> stop at step 10.
    task = Scripted([3.0, 4.0, 1.0, 2.0, 5.0, 0.5, 0.4])
    logs = run_experiment(
        task,
        str(tmp_path),
        mode="train_and_eval",
        train_steps=20,
        global_batch_size=8,
        learning_rate=0.05,
        eval_interval=2,
        checkpoint_interval=2,
        progress=False,
        validation_control=ValidationControl(metric="score", early_stop_patience=2),
    )
    # The improvement at step 6 restarted the count: not stopped at step 8.
    assert logs.get("early_stop", "").startswith("early stop at step 10:"), logs
    rates = {step: logs_["learning_rate"] for step, logs_ in task.rates.calls}
    assert sorted(rates) == list(range(1, 11))
    for step, rate in rates.items():  # halved after the worse validations at steps 4 and 8
        assert rate == pytest.approx(0.05 if step <= 4 else 0.025 if step <= 8 else 0.0125)

    # best/ holds the weights of step 6 (score 1.0), not those of a later evaluation.
    info = json.loads((tmp_path / "best" / "info.json").read_text())
    assert info["score"] == 1.0 and info["best_ckpt_global_step"] == 6
    best = _model_weights(tf.train.latest_checkpoint(str(tmp_path / "best")))
    at_6 = _model_weights(str(tmp_path / "ckpt-6"))
    at_10 = _model_weights(str(tmp_path / "ckpt-10"))
    for b, a in zip(best, at_6, strict=True):
        np.testing.assert_array_equal(b, a)
    assert not all(np.array_equal(b, c) for b, c in zip(best, at_10, strict=True))


def _control_state(path) -> tuple:
    """(best value, worse validations in a row, learning rate) in a checkpoint."""
    reader = tf.train.load_checkpoint(str(path))
    names = ("validation_control/best_value", "validation_control/worse_validations", "lr")
    return tuple(reader.get_tensor(f"{n}/.ATTRIBUTES/VARIABLE_VALUE").item() for n in names)


def test_validation_state_is_saved_after_each_evaluation_and_resumed(tmp_path):
    """Scores 3, 4, 1, 2, 5 at steps 2, 4, ..., 10 (patience 2). The checkpoint saved after each
    evaluation holds that evaluation's best value, worse count and learning rate. A run stopped
    at step 8 (one worse validation in a row, best 1.0, rate halved twice) and resumed stops
    at step 10 as an uninterrupted run does: only the restored state makes 5.0 the second
    worse validation in a row."""
    scores = [3.0, 4.0, 1.0, 2.0, 5.0, 0.5, 0.4]

    def run(model_dir, steps, task):
        return run_experiment(
            task,
            str(model_dir),
            mode="train_and_eval",
            train_steps=steps,
            global_batch_size=8,
            learning_rate=0.05,
            eval_interval=2,
            checkpoint_interval=None,
            progress=False,
            validation_control=ValidationControl(metric="score", early_stop_patience=2),
        )

    run(tmp_path / "split", 8, Scripted(scores[:4]))
    expected = {2: (3.0, 0, 0.05), 4: (3.0, 1, 0.025), 6: (1.0, 0, 0.025), 8: (1.0, 1, 0.0125)}
    for step, state in expected.items():
        got = _control_state(tmp_path / "split" / f"ckpt-{step}")
        assert got == pytest.approx(state, rel=1e-6), step
    resumed = Scripted(scores[4:])
    logs = run(tmp_path / "split", 20, resumed)
    assert logs.get("early_stop", "").startswith("early stop at step 10:"), logs
    got = _control_state(tmp_path / "split" / "ckpt-10")
    assert got == pytest.approx((1.0, 2, 0.00625), rel=1e-6)
    rates = [(step, logs_["learning_rate"]) for step, logs_ in resumed.rates.calls]
    assert rates == [(9, pytest.approx(0.0125)), (10, pytest.approx(0.0125))]
    assert json.loads((tmp_path / "split" / "best" / "info.json").read_text())["score"] == 1.0


@pytest.mark.slow
def test_a_scaled_schedule_stays_scaled_after_a_resume(tmp_path):
    """An exponential schedule, scaled by `lr_multiplier` (0.25) after the worse validation at
    step 4 (the factor is saved with the checkpoint): resumed at step 4, steps 5 and 6 train at
    a quarter of the schedule."""
    schedule = learning_rate_schedule("exponential", initial=0.1, decay_steps=4, decay_rate=0.5)

    def run(steps, scores):
        task = Scripted(scores)
        run_experiment(
            task,
            str(tmp_path),
            mode="train_and_eval",
            train_steps=steps,
            global_batch_size=8,
            learning_rate=schedule,
            eval_interval=2,
            progress=False,
            validation_control=ValidationControl(metric="score", lr_multiplier=0.25),
        )
        return {step: logs["learning_rate"] for step, logs in task.rates.calls}

    rates = run(4, [3.0, 4.0])
    assert rates == pytest.approx({s: float(schedule(s - 1)) for s in range(1, 5)}, rel=1e-6)
    rates = run(6, [2.0])
    assert rates == pytest.approx({s: 0.25 * float(schedule(s - 1)) for s in (5, 6)}, rel=1e-6)


def test_without_halving_worse_validations_are_counted_and_the_rate_kept(tmp_path):
    task = Scripted([3.0, 4.0, 5.0])
    run_experiment(
        task,
        str(tmp_path),
        mode="train_and_eval",
        train_steps=6,
        global_batch_size=8,
        learning_rate=0.05,
        eval_interval=2,
        progress=False,
        validation_control=ValidationControl(metric="score", halve_lr_on_worse=False),
    )
    assert [logs["learning_rate"] for _, logs in task.rates.calls] == pytest.approx([0.05] * 6)
    assert _control_state(tmp_path / "ckpt-6") == pytest.approx((3.0, 2, 0.05))
