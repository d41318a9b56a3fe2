"""The rate a user gives is the rate used: the optimizer's own when run_experiment.learning_rate is
unset, orbitask's setting when set (with one line when the two differ), each optimizer's own in a
dict of optimizers with different rates."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from orbitask import Task, run_experiment


class OneWeight(Task):
    """y = w * x with w starting at 0; the loss is the SUM of (w*x - 1)^2, x = 1: one step moves w
    by exactly lr * 2 * batch / global_batch = 2 * lr (SGD)."""

    def __init__(self, optimizer_fn, **kwargs):
        super().__init__(clip_norm=None, **kwargs)
        self.optimizer_fn = optimizer_fn

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ones = np.ones((8, 1), np.float32)
        ds = tf.data.Dataset.from_tensor_slices((ones, ones))
        return ds.repeat().batch(per_replica_batch_size, drop_remainder=True)

    def build_model(self):
        layer = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")
        self.built = keras.Sequential([keras.Input((1,)), layer])
        return self.built

    def build_losses(self):
        return lambda pair: tf.reduce_sum(tf.square(pair[0] - pair[1]))

    def build_optimizer(self, learning_rate):
        return self.optimizer_fn(learning_rate)

    def every_steps(self):
        return {}


def _train(task, tmp_path, **kwargs):
    settings = dict(mode="train", train_steps=1, global_batch_size=4, progress=False)
    run_experiment(task, str(tmp_path), **{**settings, **kwargs})
    return task


def _weight_after_one_step(tmp_path, optimizer_fn, **kwargs):
    task = _train(OneWeight(optimizer_fn), tmp_path, **kwargs)
    return float(task.built.weights[0].numpy().squeeze())


def test_the_optimizers_own_rate_is_used_when_none_is_set(tmp_path):
    w = _weight_after_one_step(tmp_path, lambda lr: keras.optimizers.SGD(learning_rate=0.5))
    assert w == pytest.approx(2 * 0.5)


def test_the_rate_build_optimizer_receives_is_used(tmp_path):
    w = _weight_after_one_step(tmp_path, lambda lr: keras.optimizers.SGD(learning_rate=lr))
    assert w == pytest.approx(2 * 1e-3)


def test_a_set_rate_wins_and_one_line_says_so(tmp_path, capsys):
    w = _weight_after_one_step(
        tmp_path, lambda lr: keras.optimizers.SGD(learning_rate=0.5), learning_rate=0.1
    )
    assert w == pytest.approx(2 * 0.1)
    lines = [line for line in capsys.readouterr().out.splitlines() if "replaces the rate" in line]
    assert lines == [
        "orbitask: run_experiment.learning_rate (0.1) replaces the rate build_optimizer gave the "
        "optimizer (0.5); unset run_experiment.learning_rate to keep the optimizer's."
    ]


class TwoOptimizers(Task):
    """Two Dense models, each with its own SGD; `train_step` moves each by its own optimizer."""

    def __init__(self, rates):
        super().__init__(clip_norm=None)
        self.rates = rates

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ones = np.ones((8, 1), np.float32)
        return tf.data.Dataset.from_tensor_slices(ones).repeat().batch(per_replica_batch_size)

    def build_model(self):
        make = lambda: keras.Sequential(  # noqa: E731
            [keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")]
        )
        self.built = {"g": make(), "d": make()}
        return self.built

    def build_optimizer(self, learning_rate):
        return {k: keras.optimizers.SGD(learning_rate=r) for k, r in self.rates.items()}

    def train_step(self, batch, model, optimizer, metrics=None, *, loss_fn, lr, global_batch_size):
        logs = {}
        for key in ("g", "d"):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(model[key](batch) - 1.0)) / global_batch_size
            grads = tape.gradient(loss, model[key].trainable_variables)
            optimizer[key].apply_gradients(zip(grads, model[key].trainable_variables, strict=True))
            logs[f"{key}_loss"] = loss
        logs["loss"] = logs["g_loss"] + logs["d_loss"]
        return logs

    def build_losses(self):
        return None

    def every_steps(self):
        return {}


@pytest.mark.parametrize("rates", [{"g": 3e-4, "d": 3e-4}, {"g": 0.5, "d": 0.1}])
def test_each_optimizer_in_a_dict_keeps_its_own_rate(tmp_path, rates):
    task = TwoOptimizers(rates)
    _train(task, tmp_path, train_steps=3)
    for key, rate in rates.items():
        w = float(task.built[key].weights[0].numpy().squeeze())
        expected = 0.0
        for _ in range(3):  # SGD on (w - 1)^2 averaged: w += rate * 2 * (1 - w)
            expected += rate * 2 * (1 - expected)
        assert w == pytest.approx(expected, rel=1e-5), key


class ScoredOneWeight(OneWeight):
    """OneWeight in either Keras flavour whose evaluations score 3, 4, 5, ... (lower is better),
    recording each step's logged rate and weight."""

    def __init__(self, flavour, optimizer_fn):
        super().__init__(optimizer_fn)
        self.flavour, self.rates, self.weights = flavour, [], []

    def build_model(self):
        k = keras if self.flavour == "keras" else tf_keras
        layer = k.layers.Dense(1, use_bias=False, kernel_initializer="zeros")
        self.built = k.Sequential([k.Input((1,)), layer])
        return self.built

    def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
        logs = super().reduce_aggregated_logs(aggregated_logs, global_step)
        logs["score"] = 2.0 + int(global_step) // 2
        return logs

    def every_steps(self):
        def keep(task, ctx):
            self.rates.append(ctx.logs["learning_rate"])
            self.weights.append(float(ctx.model.weights[0].numpy().squeeze()))

        return {1: keep}


@pytest.mark.parametrize("flavour", ["keras", "tf_keras"])
def test_halving_scales_the_optimizers_own_schedule(tmp_path, flavour):
    """Evaluations at steps 2 and 4 are each worse than the one before: the optimizer's own
    schedule (0.1 for 2 steps, then 0.05) is halved from step 5, the logged rate is the one
    used, and the weight moves by exactly it."""
    from orbitask.trainers import ValidationControl

    schedules = (keras if flavour == "keras" else tf_keras).optimizers.schedules
    optimizer_class = (keras if flavour == "keras" else tf_keras).optimizers.SGD

    def optimizer_fn(learning_rate):
        return optimizer_class(schedules.PiecewiseConstantDecay([1], [0.1, 0.05]))

    task = ScoredOneWeight(flavour, optimizer_fn)
    control = ValidationControl(metric="score")
    _train(
        task, tmp_path, mode="train_and_eval", train_steps=6, eval_interval=2, eval_steps=1,
        validation_control=control,
    )  # fmt: skip
    expected_rates = [0.1, 0.1, 0.05, 0.05, 0.025, 0.025]
    assert task.rates == pytest.approx(expected_rates, rel=1e-6), (task.rates, task.weights)
    w, expected_weights = 0.0, []
    for rate in expected_rates:  # SGD on (w - 1)^2 averaged: w += rate * 2 * (1 - w)
        w += rate * 2 * (1 - w)
        expected_weights.append(w)
    assert task.weights == pytest.approx(expected_weights, rel=1e-5)


class HalvedAtStep3(ScoredOneWeight):
    """A callback halves `ctx.lr` after step 3."""

    def at_step(self):
        return {3: lambda task, ctx: ctx.lr.assign(ctx.lr * 0.5)}


@pytest.mark.parametrize("owner", ["optimizer_keras", "optimizer_tf_keras", "run_experiment"])
def test_a_callbacks_assignment_scales_a_schedule_from_then_on(tmp_path, owner):
    """The schedule gives 0.1 for 2 steps, then 0.05 (the optimizer's own, in either flavour, or
    run_experiment.learning_rate); a callback halving `ctx.lr` after step 3 halves every later
    rate, and the weight moves by exactly the rates logged."""
    flavour = owner.split("_", 1)[1] if owner.startswith("optimizer") else "keras"
    k = keras if flavour == "keras" else tf_keras
    schedule = k.optimizers.schedules.PiecewiseConstantDecay([1], [0.1, 0.05])
    if owner == "run_experiment":
        task = HalvedAtStep3(flavour, lambda lr: k.optimizers.SGD(lr))
        _train(task, tmp_path, train_steps=5, learning_rate=schedule)
    else:
        task = HalvedAtStep3(flavour, lambda lr: k.optimizers.SGD(schedule))
        _train(task, tmp_path, train_steps=5)
    expected_rates = [0.1, 0.1, 0.05, 0.025, 0.025]
    assert task.rates == pytest.approx(expected_rates, rel=1e-6)
    w, expected_weights = 0.0, []
    for rate in expected_rates:
        w += rate * 2 * (1 - w)
        expected_weights.append(w)
    assert task.weights == pytest.approx(expected_weights, rel=1e-5)


def test_one_function_copies_the_rate_into_the_optimizer():
    """`LearningRate.sync` is the only caller of `keras_compat.sync_learning_rate`, and
    `TaskTrainer._rate_into_optimizer` the only caller of `sync` outside `LearningRate`."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    copies, syncs = [], []
    for path in sorted(root.glob("*/**/*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.split("/")[0] not in ("tasks", "trainers", "orbitask"):
            continue
        for line in path.read_text().splitlines():
            if "sync_learning_rate(" in line and "def sync_learning_rate" not in line:
                copies.append(rel)
            if ".learning_rate.sync(" in line:  # a call, not the docstrings' pseudo-code
                syncs.append(rel)
    # keras_compat's own recursion into a dict of optimizers, and LearningRate.sync.
    assert sorted(copies) == [
        "orbitask/common/keras_compat.py",
        "trainers/features/learning_rate.py",
    ]
    assert syncs == ["trainers/engine/task_trainer.py"]
