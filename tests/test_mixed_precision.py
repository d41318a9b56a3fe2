"""mixed_bfloat16 and mixed_float16 (with dynamic loss scaling) for both Keras flavours."""

import numpy as np
import pytest

from orbitask.trainers import ConfigError, run_experiment
from tests.helpers import Recorder, TinyTask, checkpoint_weights


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
