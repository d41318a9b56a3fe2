"""Each default stage does what the seed says."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from orbitask.tasks import Task
from orbitask.trainers import run_experiment
from tests.helpers import LinearTask, Recorder, StepRecorder, TinyTask, checkpoint_weights, nan_rows


def test_update_pre_zeroes_nan_then_clips_global_norm_at_10():
    task = Task()
    g1 = tf.constant([np.nan, 12.0, 0.0])
    g2 = tf.constant([[16.0, np.nan]])
    update, display = task.update_pre([g1, g2, None], None, None, None, None, None, None, None)
    np.testing.assert_array_equal(display[0], [0.0, 12.0, 0.0])
    np.testing.assert_array_equal(display[1], [[16.0, 0.0]])
    assert display[2] is None and update[2] is None
    # Global norm of the non-NaN gradients is 20, so everything scales by 10/20.
    np.testing.assert_allclose(update[0], [0.0, 6.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(update[1], [[8.0, 0.0]], rtol=1e-6)
    assert tf.linalg.global_norm(update[:2]).numpy() == pytest.approx(10.0)


def test_update_pre_traced_zeroes_nan_only_when_present_sparse_gradients_too():
    """In a tf.function (where the NaN fix runs only when the global norm is NaN), with a
    sparse (IndexedSlices) embedding gradient next to a dense one."""
    task = Task()
    table, weight = tf.Variable(tf.ones([5, 3])), tf.Variable(tf.fill([3], 2.0))

    @tf.function
    def update_pre(poison):
        with tf.GradientTape() as tape:
            rows = tf.gather(table, [1, 3])
            loss = 3.0 * (tf.reduce_sum(rows * weight) + tf.reduce_sum(weight))
            loss += tf.where(poison, np.nan, 0.0) * rows[0, 0]  # NaN reaches table's row 1 only
        grads = tape.gradient(loss, [table, weight])
        assert isinstance(grads[0], tf.IndexedSlices)
        update, display = task.update_pre(grads, loss, None, None, None, None, None, None)
        return [tf.convert_to_tensor(g) for g in update + display]

    clean = [g.numpy() for g in update_pre(tf.constant(False))]
    np.testing.assert_allclose(clean[2][[1, 3]], 6.0)  # display: d loss / d rows = 3 weight
    np.testing.assert_allclose(clean[3], [9.0, 9.0, 9.0])  # 3 (two rows of ones, plus 1)
    scale = 10.0 / np.sqrt(6 * 36.0 + 3 * 81.0)  # global norm ~21.4 > 10: clipped
    np.testing.assert_allclose(clean[0], clean[2] * scale, rtol=1e-6)
    np.testing.assert_allclose(clean[1], clean[3] * scale, rtol=1e-6)
    poisoned = [g.numpy() for g in update_pre(tf.constant(True))]
    assert not any(np.isnan(g).any() for g in poisoned)
    np.testing.assert_allclose(poisoned[2][1], [0.0, 6.0, 6.0])  # the NaN entry set to 0
    np.testing.assert_allclose(poisoned[3], clean[3])
    scale = 10.0 / np.sqrt(5 * 36.0 + 3 * 81.0)  # the norm of what is left
    np.testing.assert_allclose(poisoned[0], poisoned[2] * scale, rtol=1e-6)


def test_update_pre_leaves_small_gradients_alone():
    update, _ = Task().update_pre([tf.constant([3.0, 4.0])], *[None] * 7)
    np.testing.assert_array_equal(update[0], [3.0, 4.0])


@pytest.mark.parametrize("flavour,module", [("keras", keras), ("tf_keras", tf_keras)])
def test_default_optimizer_is_nadam_eps_1e3_of_the_model_flavour(flavour, module):
    task = Task(keras_flavour=flavour)
    opt = task.build_optimizer(0.01)
    assert isinstance(opt, module.optimizers.Nadam)
    assert opt.epsilon == pytest.approx(1e-3)


def test_default_checkpoint_keeps_50(tmp_path):
    step = tf.Variable(0, dtype=tf.int64)
    ckpt, manager = Task().build_checkpoint(str(tmp_path), step=step, not_trackable=object())
    for i in range(53):
        step.assign(i)
        manager.save()
    assert len(manager.checkpoints) == 50
    assert len(tf.io.gfile.glob(str(tmp_path / "ckpt-*.index"))) == 50
    assert "not_trackable" not in str(ckpt._checkpoint_dependencies)  # noqa: SLF001


def test_default_input_and_loss_split_of_a_pair():
    task = TinyTask()
    model = task.build_model()
    x, y = tf.ones((2, 6)), tf.constant([0, 1])
    assert task.input_pre((x, y), None) is x
    out = model(x)
    loss_input = task.loss_pre(out, (x, y), model, None)
    assert loss_input[0] is out and loss_input[1] is y
    loss_per_batch, extra, variables = task.grad_pre(
        tf.constant(3.0), out, (x, y), model, None, None
    )
    assert float(loss_per_batch) == 3.0
    assert float(extra) == pytest.approx(float(tf.add_n(model.losses)))
    assert variables == model.trainable_variables
    weights = tf.constant([0.5, 2.0])
    assert task.input_pre((x, y, weights), None) is x  # a weighted batch
    assert task.loss_pre(out, (x, y, weights), model, None)[1] is y
    assert task.example_weights((x, y, weights)) is weights
    assert task.example_weights((x, y)) is None


class NanFirstBatch(TinyTask):
    """The first example of the data is NaN: its gradients are NaN on the first step."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.x = self.x.copy()
        self.x[0, :] = np.nan
        self.recorder = Recorder()

    def every_steps(self):
        return {1: self.recorder}


def test_nan_gradients_are_zeroed_and_the_step_is_taken(tmp_path):
    task = NanFirstBatch(l2=0.0)
    run_experiment(
        task,
        str(tmp_path),
        mode="train",
        train_steps=3,
        global_batch_size=8,
        steps_per_loop=1,
        progress=False,
        strategy="one_device",
    )
    steps = [s for s, _ in task.recorder.calls]
    assert steps == [1, 2, 3]
    assert np.isnan(task.recorder.calls[0][1]["loss"])  # the NaN really reached the loss
    assert np.isfinite(task.recorder.calls[1][1]["loss"])
    for value in checkpoint_weights(TinyTask(l2=0.0), tmp_path):
        assert np.all(np.isfinite(value))


def test_nan_gradients_are_zeroed_and_the_rest_of_the_step_is_applied(tmp_path):
    """Step 2's loss and w[1]'s gradient are NaN, w[0]'s gradient is exactly 1 (SGD, rate 0.1):
    the step is taken (the optimizer counts it) and moves w[0] by the rate, w[1] not at all."""

    class Linear(LinearTask):
        def every_steps(self):
            return {1: self.seen}

    task = Linear(nan_rows(24, slice(8, 16)))
    task.seen = StepRecorder()
    run_experiment(
        task,
        str(tmp_path),
        mode="train",
        train_steps=3,
        global_batch_size=8,
        learning_rate=0.1,
        steps_per_loop=1,
        checkpoint_interval=None,
        progress=False,
        strategy="one_device",
    )
    assert np.isnan(task.seen.steps[2]["logs"]["loss"])
    assert task.seen.column("iterations") == [1, 2, 3]
    moved = np.array([w[0][:, 0] for w in task.seen.column("weights")])
    np.testing.assert_allclose(moved, [[-0.1, -0.1], [-0.2, -0.1], [-0.3, -0.2]], rtol=1e-6)
