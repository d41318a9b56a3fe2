"""N replicas with per-replica batch B train like one device with batch N*B."""

import numpy as np
import pytest

from orbitask.trainers import run_experiment
from tests.helpers import Recorder, TinyTask


class RecordingTiny(TinyTask):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.recorder = Recorder()
        self.final = None

    def every_steps(self):
        return {1: self.recorder}

    def at_step(self):
        return {6: self._grab}

    def _grab(self, task, ctx):
        self.final = [np.array(v) for v in ctx.model.weights]


def _train(tmp_path, flavour, strategy, name):
    task = RecordingTiny(flavour=flavour, l2=0.05)
    run_experiment(
        task,
        str(tmp_path / name),
        mode="train",
        train_steps=6,
        global_batch_size=16,
        learning_rate=0.05,
        steps_per_loop=3,
        strategy=strategy,
        progress=False,
    )
    return task


@pytest.mark.parametrize("flavour", ["keras", "tf_keras"])
def test_two_replicas_equal_one_device_with_double_batch(tmp_path, flavour):
    one = _train(tmp_path, flavour, "one_device", "one")
    two = _train(tmp_path, flavour, "mirrored", "two")
    assert one.recorder.replicas == {1} and two.recorder.replicas == {2}
    steps_one = [s for s, _ in one.recorder.calls]
    assert steps_one == [1, 2, 3, 4, 5, 6]
    for (s1, l1), (s2, l2) in zip(one.recorder.calls, two.recorder.calls, strict=True):
        assert s1 == s2
        np.testing.assert_allclose(l1["loss"], l2["loss"], rtol=1e-5, err_msg=f"loss @{s1}")
        np.testing.assert_allclose(l1["grad_norm"], l2["grad_norm"], rtol=1e-5)
    # The L2 term must be counted once, not once per replica: the loss includes it.
    assert one.recorder.calls[0][1]["loss"] > 0
    for w1, w2 in zip(one.final, two.final, strict=True):
        np.testing.assert_allclose(w1, w2, rtol=1e-5, atol=1e-6)
    # Training moved the weights (the comparison is not of two untouched models).
    fresh = RecordingTiny(flavour=flavour).build_model()
    assert any(
        not np.allclose(a, np.array(b)) for a, b in zip(one.final, fresh.weights, strict=True)
    )


@pytest.mark.parametrize(
    "strategy, line",
    [
        ("one_device", "orbitask: OneDeviceStrategy, 1 replica (CPU:0)"),
        ("mirrored", "orbitask: MirroredStrategy, 2 replicas (CPU:0, CPU:1)"),
    ],
)
def test_the_run_names_its_strategy_and_replicas_at_start(tmp_path, capsys, strategy, line):
    run_experiment(
        TinyTask(), str(tmp_path), mode="train", train_steps=1, global_batch_size=8,
        strategy=strategy, progress=False,
    )  # fmt: skip
    assert capsys.readouterr().out.splitlines()[0] == line
