"""mixed_bfloat16 and mixed_float16 (with dynamic loss scaling) for both Keras flavours."""

import numpy as np
import pytest
import tensorflow as tf

from orbitask.trainers import ConfigError, NanGuard, run_experiment
from orbitask.trainers.features.precision import DynamicLossScale
from tests.helpers import (
    LinearTask,
    Recorder,
    StepRecorder,
    TinyTask,
    checkpoint_weights,
    keras_module,
    weights,
)


class Rec(TinyTask):
    def __init__(self, scale=1.0, **kwargs):
        super().__init__(**kwargs)
        self.x = self.x * scale
        self.rec = Recorder()
        self.compute_dtype = None

    def build_model(self):
        model = super().build_model()
        self.compute_dtype = model.layers[0].compute_dtype
        return model

    def every_steps(self):
        return {1: self.rec}


@pytest.mark.slow
@pytest.mark.parametrize("flavour", ["keras", "tf_keras"])
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_trains_with_float32_weights(tmp_path, flavour, policy):
    task = Rec(flavour=flavour)
    run_experiment(
        task,
        str(tmp_path),
        mode="train",
        train_steps=4,
        global_batch_size=8,
        learning_rate=0.05,
        progress=False,
        mixed_precision=policy,
    )
    assert task.compute_dtype == policy.split("_")[1]
    losses = [logs["loss"] for _, logs in task.rec.calls]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0] * 1.5
    if policy == "mixed_float16":
        assert task.rec.calls[0][1]["loss_scale"] == 2.0**15
    for value in checkpoint_weights(TinyTask(flavour=flavour), tmp_path):
        assert value.dtype == np.float32 and np.all(np.isfinite(value))


class SgdRec(TinyTask):
    """TinyTask with plain SGD and no clipping: an update is the learning rate times the
    gradient itself (Nadam's would hardly change if the gradient were scaled by a constant)."""

    def __init__(self, **kwargs):
        super().__init__(clip_norm=None, **kwargs)
        self.seen = StepRecorder()

    def build_optimizer(self, learning_rate):
        return keras_module(self.flavour).optimizers.SGD(learning_rate)

    def every_steps(self):
        return {1: self.seen}


@pytest.mark.parametrize("flavour", ["keras", "tf_keras"])
def test_float16_updates_equal_float32_updates(tmp_path, flavour):
    """Same task, same data, 3 steps: the loss-scaled float16 step moves the weights as the
    float32 step does (to float16 precision)."""
    runs = {}
    for policy in ("mixed_float16", None):
        task = SgdRec(flavour=flavour)
        run_experiment(
            task,
            str(tmp_path / str(policy)),
            mode="train",
            train_steps=3,
            global_batch_size=8,
            learning_rate=0.5,
            steps_per_loop=100,
            checkpoint_interval=None,
            progress=False,
            mixed_precision=policy,
        )
        runs[policy] = task.seen
    start = weights(SgdRec(flavour=flavour).build_model())
    half, full = runs["mixed_float16"], runs[None]
    assert [logs["loss_scale"] for logs in half.column("logs")] == [2.0**15] * 3
    assert half.column("iterations") == full.column("iterations") == [1, 2, 3]
    for step in (1, 2, 3):
        losses = [run.steps[step]["logs"]["loss"] for run in (half, full)]
        assert losses[0] == pytest.approx(losses[1], rel=1e-2)
        for w0, w16, w32 in zip(
            start, half.steps[step]["weights"], full.steps[step]["weights"], strict=True
        ):
            moved = w32 - w0
            assert np.abs(moved).max() > 1e-3  # the step really moved this variable
            np.testing.assert_allclose(w16 - w0, moved, rtol=1e-2, atol=5e-3 * np.abs(moved).max())


@pytest.mark.parametrize("flavour", ["keras", "tf_keras"])
def test_an_overflowing_float16_step_changes_no_weight_and_halves_the_scale(tmp_path, flavour):
    """LinearTask (gradient exactly 1): step 3's loss is 10**4 times larger, so its float16
    gradient (times the 2**15 scale) overflows. That step is skipped (weights and the optimizer's
    count unchanged) and the scale halves; the next step trains at the halved scale. A NaN guard
    of patience 1 does not count the overflow as a bad step (it would stop the run)."""

    class Linear(LinearTask):
        def every_steps(self):
            return {1: self.seen}

    m = np.ones(40, np.float32)
    m[16:24] = 1e4  # the rows of step 3 (batch 8)
    task = Linear(np.ones((40, 1)), m, flavour=flavour)
    task.seen = StepRecorder()
    out = run_experiment(
        task,
        str(tmp_path),
        mode="train",
        train_steps=4,
        global_batch_size=8,
        learning_rate=0.1,
        steps_per_loop=100,
        checkpoint_interval=None,
        progress=False,
        mixed_precision="mixed_float16",
        nan_guard=NanGuard(patience=1),
    )
    assert out["train"]["nonfinite_steps"] == 0
    scales = [logs["loss_scale"] for logs in task.seen.column("logs")]
    assert scales == [2.0**15, 2.0**15, 2.0**14, 2.0**14]
    assert task.seen.column("iterations") == [1, 2, 2, 3]
    moved = [float(w[0].item()) for w in task.seen.column("weights")]
    assert moved == pytest.approx([-0.1, -0.2, -0.2, -0.3], rel=1e-6)


def test_the_scale_doubles_after_growth_interval_finite_steps_and_restarts_its_count():
    """Growth interval 3: the scale doubles on the 3rd finite step in a row, the count restarts
    after a doubling and after an overflow (which halves the scale)."""
    scale = DynamicLossScale(initial=8.0, growth_interval=3)
    seen = []
    for nonfinite in [0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0]:
        scale.update(tf.constant(bool(nonfinite)))
        seen.append((float(scale.scale.numpy()), int(scale.good_steps.numpy())))
    assert seen == [
        (8, 1), (8, 2), (16, 0), (16, 1), (16, 2), (8, 0),
        (8, 1), (8, 2), (16, 0), (8, 0), (4, 0), (4, 1),
    ]  # fmt: skip
    floor = DynamicLossScale(initial=2.0, growth_interval=3)
    for _ in range(3):
        floor.update(tf.constant(True))
    assert float(floor.scale.numpy()) == 1.0  # halving stops at 1


def test_float16_scale_grows_after_2000_finite_steps_across_a_resume(tmp_path):
    """LinearTask (gradient exactly 1), float16: 1999 finite steps, then a resume. The restored
    count of finite steps makes step 2000 double the scale (2**15 -> 2**16); that scale
    overflows float16, so step 2001 halves it again and skips its update."""

    class Linear(LinearTask):
        def every_steps(self):
            return {1000: self.seen}

    def train(steps):
        task = Linear(np.ones((40, 1)))
        task.seen = StepRecorder()
        logs = run_experiment(
            task,
            str(tmp_path),
            mode="train",
            train_steps=steps,
            global_batch_size=8,
            learning_rate=1e-4,
            steps_per_loop=1000,
            checkpoint_interval=None,
            progress=False,
            mixed_precision="mixed_float16",
        )
        return task.seen.steps, logs["train"]

    def state():
        reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(tmp_path)))
        names = ("scale", "good_steps")
        return [
            reader.get_tensor(f"loss_scale/{n}/.ATTRIBUTES/VARIABLE_VALUE").item() for n in names
        ]

    seen, last = train(1999)
    assert seen[1000]["logs"]["loss_scale"] == last["loss_scale"] == 2.0**15
    assert state() == [2.0**15, 1999]
    seen, last = train(2001)
    assert seen[2000]["logs"]["loss_scale"] == 2.0**16
    assert seen[2000]["iterations"] == 2000
    assert last["loss_scale"] == 2.0**15
    assert state() == [2.0**15, 0]


class BigLoss(Rec):
    """A loss 1000 times larger: its float16 gradients times 2**15 overflow."""

    def build_losses(self):
        base = super().build_losses()
        return lambda loss_input: 1000.0 * base(loss_input)


def test_float16_overflow_skips_the_step_and_halves_the_scale(tmp_path):
    task = BigLoss()
    run_experiment(
        task,
        str(tmp_path),
        mode="train",
        train_steps=12,
        global_batch_size=8,
        progress=False,
        mixed_precision="mixed_float16",
        steps_per_loop=4,
    )
    scales = [logs["loss_scale"] for _, logs in task.rec.calls]
    assert scales[0] < 2.0**15 and scales == sorted(scales, reverse=True)
    assert scales[-1] >= 1.0
    for value in checkpoint_weights(TinyTask(), tmp_path):
        assert np.all(np.isfinite(value))


def test_bad_policy_name(tmp_path):
    with pytest.raises(ConfigError, match="`mixed_precision` must be None"):
        run_experiment(
            TinyTask(), str(tmp_path), mode="train", train_steps=1, mixed_precision="float8"
        )
