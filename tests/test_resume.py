"""A run stopped after K steps and started again continues from step K as if never stopped."""

import numpy as np
import pytest
import tensorflow as tf

from orbitask.trainers import run_experiment
from tests.helpers import Recorder, TinyTask


class Resumable(TinyTask):
    def __init__(self, **kwargs):
        super().__init__(shuffle=True, **kwargs)
        self.recorder = Recorder()

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        # The usual ending, which orbitask turns into a fixed prefetch (train_prefetch steps).
        ds = super().build_inputs(per_replica_batch_size, input_context, training)
        return ds.prefetch(tf.data.AUTOTUNE)

    def every_steps(self):
        return {1: self.recorder}

    def at_step(self):
        # A learning-rate change that only the checkpoint can carry across the restart.
        return {3: lambda t, c: c.lr.assign(0.02)}


def _run(model_dir, flavour, steps, strategy, async_checkpoints=False):
    task = Resumable(flavour=flavour)
    run_experiment(
        task,
        str(model_dir),
        mode="train",
        train_steps=steps,
        global_batch_size=8,
        learning_rate=0.05,
        steps_per_loop=4,
        checkpoint_interval=5,
        strategy=strategy,
        progress=False,
        async_checkpoints=async_checkpoints,
    )
    return task


def _state(model_dir):
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
    names = sorted(reader.get_variable_to_shape_map())
    return {n: reader.get_tensor(n) for n in names}


@pytest.mark.slow
@pytest.mark.parametrize("flavour", ["keras", "tf_keras"])
@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
@pytest.mark.parametrize("async_checkpoints", [False, True], ids=["sync", "async"])
def test_stop_and_restart_continues_from_step_k(tmp_path, flavour, strategy, async_checkpoints):
    # Async: every save (steps 5, 10 and the final one) is written by a background thread, and
    # the run that stops at step 5 exits right after starting its write.
    args = (flavour, 12, strategy, async_checkpoints)
    full = _run(tmp_path / "full", *args)
    _run(tmp_path / "split", flavour, 5, strategy, async_checkpoints)
    resumed = _run(tmp_path / "split", *args)

    assert [s for s, _ in resumed.recorder.calls] == list(range(6, 13))
    replicas = 2 if strategy == "mirrored" else 1
    assert full.recorder.replicas == resumed.recorder.replicas == {replicas}
    # Same losses after the restart as without one: same data position, weights, slots, lr.
    for (s1, l1), (s2, l2) in zip(full.recorder.calls[5:], resumed.recorder.calls, strict=True):
        assert s1 == s2
        np.testing.assert_allclose(l2["loss"], l1["loss"], rtol=1e-6, err_msg=f"step {s1}")
        assert l2["learning_rate"] == pytest.approx(0.02)
    a, b = _state(tmp_path / "full"), _state(tmp_path / "split")
    assert a.keys() == b.keys()
    slots = [n for n in a if n.startswith("optimizer/") and "iter" not in n]
    assert slots, "optimizer slots must be in the checkpoint"
    for name in a:
        if np.asarray(a[name]).dtype.kind == "f":
            np.testing.assert_allclose(b[name], a[name], rtol=1e-6, atol=1e-7, err_msg=name)
        elif name != "_CHECKPOINTABLE_OBJECT_GRAPH":
            np.testing.assert_array_equal(b[name], a[name], err_msg=name)


def test_plain_tensorflow_restores_the_model_from_train_model(tmp_path):
    _run(tmp_path, "keras", 5, "one_device")
    restored = TinyTask().build_model()
    path = tf.train.latest_checkpoint(str(tmp_path))
    status = tf.train.Checkpoint(train_model=restored).restore(path).expect_partial()
    status.assert_existing_objects_matched()
    fresh = TinyTask().build_model()
    pairs = zip(restored.weights, fresh.weights, strict=True)
    assert any(not np.array_equal(a, b) for a, b in pairs)  # the trained weights, not the initial


@pytest.mark.slow
@pytest.mark.parametrize("stop_at", [1, 2, 3, 4, 5, 6])
def test_a_restart_in_the_first_steps_is_bit_identical_with_tf_keras_nadam(tmp_path, stop_at):
    """tf_keras' Nadam keeps a Python counter in its traced update; a step traced first in a
    device loop and one traced in its body must still build the same update."""

    def run(model_dir, steps):
        run_experiment(
            TinyTask(shuffle=True, flavour="tf_keras"),
            str(model_dir),
            mode="train",
            train_steps=steps,
            global_batch_size=8,
            steps_per_loop=4,
            loop_seconds=None,
            progress=False,
        )

    run(tmp_path / "full", 12)
    run(tmp_path / "split", stop_at)
    run(tmp_path / "split", 12)
    a, b = _state(tmp_path / "full"), _state(tmp_path / "split")
    assert any("_u_product" in name for name in a)  # the default optimizer is tf_keras' Nadam
    for name in a:
        if name not in ("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter/.ATTRIBUTES/VARIABLE_VALUE"):
            np.testing.assert_array_equal(b[name], a[name], err_msg=name)


@pytest.mark.parametrize("steps", [5, 3])
def test_a_finished_run_says_it_has_nothing_to_train(tmp_path, capsys, steps):
    _run(tmp_path, "keras", 5, "one_device")
    capsys.readouterr()
    task = _run(tmp_path, "keras", steps, "one_device")
    out = capsys.readouterr().out
    assert f"orbitask: already at step 5 >= train_steps {steps}; nothing to train" in out
    assert task.recorder.calls == [] and tf.train.latest_checkpoint(str(tmp_path)).endswith("-5")
