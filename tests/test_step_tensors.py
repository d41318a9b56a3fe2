"""Callbacks marked `with_step_tensors` see their due step's outputs, batch and gradients, on one
device and on 2 replicas; the steps between run as before, and training is unchanged."""

import keras
import numpy as np
import pytest

from orbitask import DigitsClassification, run_experiment, with_step_tensors
from orbitask.trainers.actions.callback_action import CallbackAction
from tests.helpers import checkpoint_weights


class Looking(DigitsClassification):
    """Digits, with a callback every 3 steps that keeps what the step's tensors say."""

    def __init__(self, look=True):
        super().__init__(hidden_units=(16,))
        self.seen = []
        self.look = look

    def every_steps(self):
        table = super().every_steps()
        return {**table, 3: with_step_tensors(self.record)} if self.look else table

    def record(self, task, ctx):
        local = ctx.strategy.experimental_local_results
        outputs = [o.numpy() for o in local(ctx.outputs)]
        labels = [y.numpy() for y in local(ctx.batch[1])]
        gradients = [np.asarray(local(g)[0]) for g in ctx.gradients]
        self.seen.append((ctx.step, ctx.logs["loss"], outputs, labels, gradients))


def _train(task, model_dir, strategy):
    return run_experiment(task, str(model_dir), mode="train", train_steps=7, global_batch_size=16,
                          strategy=strategy, seed=0, progress=False, steps_per_loop=5,
                          loop_seconds=None)  # fmt: skip


@pytest.mark.slow  # two runs each
@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_a_callback_sees_its_steps_outputs_batch_and_gradients(tmp_path, strategy):
    task = Looking()
    _train(task, tmp_path / "looked", strategy)
    assert [seen[0] for seen in task.seen] == [3, 6]
    replicas = 1 if strategy == "one_device" else 2
    for step, loss, outputs, labels, gradients in task.seen:
        assert [len(o) for o in outputs] == [16 // replicas] * replicas
        # The step's logged loss is the mean loss of these outputs on these labels.
        crossentropy = keras.losses.sparse_categorical_crossentropy
        total = sum(
            float(np.sum(crossentropy(y, o, from_logits=True)))
            for o, y in zip(outputs, labels, strict=True)
        )
        assert total / 16 == pytest.approx(loss, rel=1e-5), step
        assert len(gradients) == 4
    # Training is the same as without the callback: the due steps run apart, not otherwise.
    plain = Looking(look=False)
    _train(plain, tmp_path / "plain", strategy)
    for a, b in zip(checkpoint_weights(Looking(), tmp_path / "looked"),
                    checkpoint_weights(Looking(), tmp_path / "plain"), strict=True):  # fmt: skip
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow  # two runs
def test_one_device_and_two_replicas_see_the_same_gradients(tmp_path):
    one, two = Looking(), Looking()
    _train(one, tmp_path / "one", "one_device")
    _train(two, tmp_path / "two", "mirrored")
    for a, b in zip(one.seen, two.seen, strict=True):
        for g1, g2 in zip(a[4], b[4], strict=True):  # the all-reduced sum is one device's
            np.testing.assert_allclose(g2, g1, rtol=1e-4, atol=1e-7)


def test_no_callback_asking_means_no_kept_step():
    task = Looking(look=False)
    action = CallbackAction(task, None, None, None, current_step=lambda: 0)
    assert not action.asks_step_tensors and not action.tensors_due(3)
    asking = CallbackAction(Looking(), None, None, None, current_step=lambda: 0)
    assert asking.asks_step_tensors and asking.tensors_due(3) and not asking.tensors_due(4)
