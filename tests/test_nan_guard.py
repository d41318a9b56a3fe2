"""The gin-enabled NaN guard: skip, count, roll back once, then stop with a clear error.

Runs with oneDNN off (conftest): oneDNN's fused kernels turn NaN into 0 in graph mode on CPU.
"""

from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from orbitask.trainers import NanGuard, NonFiniteLossError, run_experiment
from tests.helpers import LinearTask, Recorder, StepRecorder, TinyTask, checkpoint_weights, nan_rows

B = 8


class NanAt(TinyTask):
    """Examples of the given training steps (1-based, batch B, one device) are NaN."""

    def __init__(self, bad_steps, nan_forever_after=None, **kwargs):
        super().__init__(n=B * 40, **kwargs)
        self.x = self.x.copy()
        for step in bad_steps:
            self.x[(step - 1) * B : step * B] = np.nan
        if nan_forever_after is not None:
            self.x[nan_forever_after * B :] = np.nan
        self.recorder = Recorder()
        self.weights = {}

    def every_steps(self):
        return {1: [self.recorder, self._grab]}

    def _grab(self, task, ctx):
        self.weights[ctx.step] = [np.array(v) for v in ctx.model.weights]
        self.weights[ctx.step].append(int(ctx.optimizer.iterations.numpy()))
        self.replicas = ctx.strategy.num_replicas_in_sync


def _run(task, model_dir, guard, steps, strategy="one_device"):
    return run_experiment(
        task,
        str(model_dir),
        mode="train",
        train_steps=steps,
        global_batch_size=B,
        steps_per_loop=1,
        checkpoint_interval=5,
        strategy=strategy,
        progress=False,
        nan_guard=guard,
    )


def test_nonfinite_step_is_skipped_and_counted(tmp_path):
    task = NanAt(bad_steps=[3])
    logs = _run(task, tmp_path, NanGuard(patience=3), 5)
    losses = {s: logs_["loss"] for s, logs_ in task.recorder.calls}
    assert np.isnan(losses[3]) and np.isfinite(losses[4])
    before, after = task.weights[2], task.weights[3]
    for a, b in zip(before[:-1], after[:-1], strict=True):
        np.testing.assert_array_equal(a, b)  # weights and slots untouched by step 3
    assert before[-1] == after[-1] == 2  # the optimizer did not count the skipped step
    assert task.weights[4][-1] == 3
    assert logs["train"]["nonfinite_steps"] == 1


def test_without_guard_the_seed_default_takes_the_step(tmp_path):
    task = NanAt(bad_steps=[3])
    _run(task, tmp_path, None, 4)
    assert task.weights[3][-1] == 3  # the step was taken (NaN gradients zeroed)


def test_rolls_back_once_then_stops_with_a_clear_error(tmp_path, capsys):
    task = NanAt(bad_steps=[], nan_forever_after=6)
    with pytest.raises(NonFiniteLossError, match="not finite for 3 consecutive steps"):
        _run(task, tmp_path, NanGuard(patience=3, max_rollbacks=1), 30)
    out = capsys.readouterr().out
    assert out.count("rolled back to") == 1
    # Steps 7, 8, 9 went bad, the run rolled back to step 5 and replayed them once.
    steps = [s for s, _ in task.recorder.calls]
    assert steps == [1, 2, 3, 4, 5, 6, 7, 8, 9, 6, 7, 8, 9], (steps, out)
    # The good checkpoints survive and the latest is still the good step-5 state.
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-5")
    for value in checkpoint_weights(TinyTask(), tmp_path):
        assert np.all(np.isfinite(value))


def test_only_consecutive_bad_steps_roll_back_to_the_latest_of_several_checkpoints(
    tmp_path, capsys
):
    """Patience 2, bad steps 3, 5, 7, 9 (never two in a row), then 12 and 13. Only 12-13 trip
    the guard: it rolls back to ckpt-10 (not ckpt-5), replays 11-13, which go bad again, and
    stops."""
    task = NanAt(bad_steps=[3, 5, 7, 9, 12, 13])
    with pytest.raises(NonFiniteLossError, match="not finite for 2 consecutive steps"):
        _run(task, tmp_path, NanGuard(patience=2, max_rollbacks=1), 20)
    out = capsys.readouterr().out
    assert out.count("rolled back to") == 1 and "ckpt-10" in out, out
    steps = [s for s, _ in task.recorder.calls]
    assert steps == [*range(1, 14), 11, 12, 13], steps
    # The replay starts from step 10's weights and input position: step 11 gives the same loss.
    first, replayed = [logs["loss"] for s, logs in task.recorder.calls if s == 11]
    assert np.isfinite(first) and replayed == first


def test_rollback_at_a_checkpoint_step_saves_no_checkpoint_under_that_number(tmp_path):
    """Steps 8, 9, 10 go bad: the guard rolls back to step 5 right where the interval (5) is
    due. The step after the rollback is 5 again, so no checkpoint "10" holding step 5's state
    may appear, and the replay counts its steps from 5."""
    task = NanAt(bad_steps=[], nan_forever_after=7)
    with pytest.raises(NonFiniteLossError):
        _run(task, tmp_path, NanGuard(patience=3, max_rollbacks=1), 30)
    steps = [s for s, _ in task.recorder.calls]
    assert steps == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 6, 7, 8, 9, 10], steps
    state = tf.train.get_checkpoint_state(str(tmp_path))
    assert [p.rsplit("-", 1)[1] for p in state.all_model_checkpoint_paths] == ["5"]


def test_the_binary_exits_3_in_one_line_when_the_guard_stops(tmp_path, capsys):
    """A learning rate of 1e38 sends the weights to Inf after one step: every later step is
    bad, and with no checkpoint to roll back to the guard stops the run."""
    from orbitask.trainers.commands import train

    repo = Path(__file__).resolve().parents[1]
    params = [
        "TRAIN_STEPS = 20",
        "orbitask.run_experiment.learning_rate = 1e38",
        "orbitask.run_experiment.nan_guard = @orbitask.NanGuard()",
        "orbitask.run_experiment.mode = 'train'",
        "orbitask.run_experiment.progress = False",
    ]
    status = train.main(
        [f"--gin_file={repo}/experiments/digits.gin", f"--model_dir={tmp_path / 'run'}"]
        + [f"--gin_params={p}" for p in params]
    )
    err = capsys.readouterr().err
    assert status == 3, err
    assert err.startswith("orbitask: error: ") and err.count("\n") == 1, err
    assert "not finite for 3 consecutive steps" in err and "no checkpoint to roll back" in err


class WideNanAt(NanAt):
    """NanAt with three 4096 x 4096 kernels (a ~580 MiB checkpoint with Nadam's slots), so
    that an async write is still under way when the next step ends."""

    def build_model(self):
        wide = [keras.layers.Dense(4096) for _ in range(4)]
        return keras.Sequential([keras.Input((6,)), *wide, keras.layers.Dense(3)])


@pytest.mark.slow
def test_rollback_waits_for_the_async_save_under_way(tmp_path, capsys):
    """Steps 6 on go bad right after step 5's async save started: the rollback waits for it
    and goes back to ckpt-5 (not "no checkpoint to roll back to")."""
    task = WideNanAt(bad_steps=[], nan_forever_after=5)
    with pytest.raises(NonFiniteLossError, match="after 1 rollback"):
        run_experiment(
            task, str(tmp_path), mode="train", train_steps=30, global_batch_size=B,
            steps_per_loop=1, checkpoint_interval=5, progress=False, async_checkpoints=True,
            nan_guard=NanGuard(patience=1, max_rollbacks=1),
        )  # fmt: skip
    out = capsys.readouterr().out
    assert out.count("rolled back to") == 1 and f"rolled back to {tmp_path / 'ckpt-5'}" in out
    assert [s for s, _ in task.recorder.calls] == [1, 2, 3, 4, 5, 6, 6]


def test_guard_settings_are_checked():
    with pytest.raises(ValueError, match="patience"):
        NanGuard(patience=0)


@pytest.mark.parametrize("strategy", ["mirrored"])
def test_guard_under_two_replicas(tmp_path, strategy):
    task = NanAt(bad_steps=[3])
    _run(task, tmp_path, NanGuard(patience=3), 4, strategy=strategy)
    assert task.replicas == 2
    assert task.weights[3][-1] == task.weights[2][-1]


@pytest.mark.parametrize("strategy,replicas", [("one_device", 1), ("mirrored", 2)])
@pytest.mark.parametrize("guarded", [False, True], ids=["seed_default", "nan_guard"])
def test_default_applies_the_finite_gradients_the_guard_applies_nothing(
    tmp_path, strategy, replicas, guarded
):
    """Step 3's loss and w[1]'s gradient are NaN (only on the second replica under mirrored);
    w[0]'s gradient is exactly 1 (LinearTask, SGD, rate 0.1). The seed's default takes the step
    with the NaN zeroed: w[0] moves by the rate, w[1] stays. The guard skips it: nothing moves
    and the optimizer does not count it."""

    class Linear(LinearTask):
        def every_steps(self):
            return {1: self.seen}

    task = Linear(nan_rows(B * 5, slice(2 * B + B // 2, 3 * B)))
    task.seen = StepRecorder()
    logs = run_experiment(
        task,
        str(tmp_path),
        mode="train",
        train_steps=4,
        global_batch_size=B,
        learning_rate=0.1,
        steps_per_loop=1,
        checkpoint_interval=None,
        strategy=strategy,
        progress=False,
        nan_guard=NanGuard(patience=3) if guarded else None,
    )
    assert task.seen.column("replicas") == [replicas] * 4
    assert np.isnan(task.seen.steps[3]["logs"]["loss"])
    moved = np.array([w[0][:, 0] for w in task.seen.column("weights")])
    if guarded:
        assert task.seen.column("iterations") == [1, 2, 2, 3]
        expected = [[-0.1, -0.1], [-0.2, -0.2], [-0.2, -0.2], [-0.3, -0.3]]
        assert logs["train"]["nonfinite_steps"] == 1
    else:
        assert task.seen.column("iterations") == [1, 2, 3, 4]
        expected = [[-0.1, -0.1], [-0.2, -0.2], [-0.3, -0.2], [-0.4, -0.3]]
    np.testing.assert_allclose(moved, expected, rtol=1e-6)


class SpikeAt(TinyTask):
    """TinyTask whose loss is each example's cross-entropy times a weight: 1, and
    `spikes[step]` for the examples of that training step (1-based, batch B)."""

    def __init__(self, spikes, record=True):
        super().__init__(n=B * 40)
        self.scale = np.ones(len(self.x), np.float32)
        for step, factor in spikes.items():
            self.scale[(step - 1) * B : step * B] = factor
        self.seen = StepRecorder() if record else None

    def every_steps(self):
        return {1: self.seen} if self.seen else {}

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ds = tf.data.Dataset.from_tensor_slices((self.x, (self.y, self.scale)))
        return ds.repeat().batch(per_replica_batch_size, drop_remainder=True)

    def build_losses(self):
        def loss_fn(loss_input):
            logits, (labels, scale) = loss_input
            losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
            return tf.reduce_sum(losses * scale)

        return loss_fn


def _spike_guard():
    return NanGuard(patience=3, max_rollbacks=1, spike_factor=10.0, spike_warmup=3)


@pytest.mark.parametrize("strategy,replicas", [("one_device", 1), ("mirrored", 2)])
def test_loss_spike_is_skipped_after_warm_up_and_repeats_roll_back(
    tmp_path, capsys, strategy, replicas
):
    """A 30x loss at step 2, inside the warm-up of 3 accepted steps: taken (it joins the average,
    about 6 by step 6). A 1000x loss at step 7: skipped and counted (weights, slots, iterations
    unchanged). At 11, 12, 13: three in a row roll back to ckpt-10; the replay spikes again and
    the run stops."""
    task = SpikeAt({2: 30.0, 7: 1000.0, 11: 1000.0, 12: 1000.0, 13: 1000.0})
    with pytest.raises(NonFiniteLossError, match=r"over 10 x its recent average"):
        _run(task, tmp_path, _spike_guard(), 20, strategy=strategy)
    out = capsys.readouterr().out
    assert out.count("rolled back to") == 1 and "ckpt-10" in out, out
    seen = task.seen.steps
    assert seen[1]["replicas"] == replicas
    iterations = [seen[s]["iterations"] for s in range(1, 8)]
    assert iterations == [1, 2, 3, 4, 5, 6, 6], iterations  # step 2 taken, step 7 skipped
    loss = {s: seen[s]["logs"]["loss"] for s in seen}
    assert loss[2] > 20 * loss[1] and loss[7] > 500 * loss[6]
    for a, b in zip(seen[6]["weights"], seen[7]["weights"], strict=True):
        np.testing.assert_array_equal(a, b)
    assert seen[10]["logs"]["nonfinite_steps"] == 1
    assert seen[13]["iterations"] == 9  # the last of the three spikes before the rollback


def test_spike_average_resumes_exactly(tmp_path):
    """A run killed after step 6 and resumed to 10 skips the spike at step 8 and ends with the
    weights and recent average of an uninterrupted run. Resumed without the saved average, it
    would be warming up again at step 8 and take the spike."""
    ends = {}
    for name, stops in (("whole", [10]), ("resumed", [6, 10])):
        for steps in stops:
            run_experiment(
                SpikeAt({8: 1000.0}, record=False),
                str(tmp_path / name),
                mode="train",
                train_steps=steps,
                global_batch_size=B,
                steps_per_loop=10,
                strategy="one_device",
                progress=False,
                nan_guard=_spike_guard(),
            )
        reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(tmp_path / name)))
        names = reader.get_variable_to_shape_map()
        values = [k for k in names if k.endswith("VARIABLE_VALUE") and "save_counter" not in k]
        ends[name] = {key: reader.get_tensor(key) for key in values}
    whole, resumed = ends["whole"], ends["resumed"]
    for key, value in whole.items():  # weights, slots, iterations, the guard's state
        np.testing.assert_array_equal(value, resumed[key], err_msg=key)
    assert sorted(whole) == sorted(resumed)
    assert whole["nan_guard/skipped/.ATTRIBUTES/VARIABLE_VALUE"] == 1  # step 8
    assert 0 < whole["nan_guard/loss_average/.ATTRIBUTES/VARIABLE_VALUE"] < 10


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"spike_factor": 1.0}, r"`NanGuard.spike_factor` must be greater than 1"),
        ({"spike_factor": "10"}, r"Received: spike_factor='10' .*orbitask.NanGuard.spike_factor"),
        ({"spike_warmup": 0}, r"Received: spike_warmup=0 .*orbitask.NanGuard.spike_warmup"),
    ],
)
def test_spike_settings_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        NanGuard(**kwargs)
