"""Infinite losses and gradients: the default update keeps them out of the weights, and the NaN
guard skips a step whose loss or gradient is not finite before its update.

Runs with oneDNN off (conftest): oneDNN's fused kernels turn NaN into 0 in graph mode on CPU.
"""

import numpy as np
import pytest
import tensorflow as tf

from orbitask.tasks import Task
from orbitask.tasks.gradients import zero_nans_and_clip
from orbitask.trainers import NanGuard, run_experiment
from tests.helpers import LinearTask, StepRecorder, checkpoint_weights, nan_rows

B = 8
BIG = np.float32(3e38)  # finite in float32 (max 3.4e38); the square, or a sum of two, is not


@pytest.mark.parametrize(
    "gradients,clip,update,norm",
    [
        # Inf and NaN entries become 0; the rest is clipped with the norm of what is left.
        ([[np.inf, 3.0], [np.nan, -4.0]], 10.0, [[0.0, 3.0], [0.0, -4.0]], 5.0),
        ([[-np.inf, 30.0], [40.0]], 10.0, [[0.0, 6.0], [8.0]], 50.0),
        # Finite entries whose squares overflow: the true norm, the clip in the same direction.
        ([[1e30, -1e30], [0.0]], 10.0, [[10 / 2**0.5, -(10 / 2**0.5)], [0.0]], 2**0.5 * 1e30),
        ([[BIG, 1.0], [BIG]], 10.0, [[10 / 2**0.5, 0.0], [10 / 2**0.5]], np.inf),
        ([[BIG, np.inf], [-BIG]], 10.0, [[10 / 2**0.5, 0.0], [-(10 / 2**0.5)]], np.inf),
        ([[BIG, np.nan], [BIG]], None, [[BIG, 0.0], [BIG]], np.inf),
        ([[3.0, 4.0], [0.0]], 10.0, [[3.0, 4.0], [0.0]], 5.0),  # finite: unchanged
    ],
)
def test_fix_zeroes_every_non_finite_entry_and_clips_without_overflow(
    gradients, clip, update, norm
):
    """Traced, as in a step. `grad_norm` (the display norm) is the true norm of the display
    gradients: +Inf only when that norm exceeds float32's range. The display gradients are the
    fixed, unclipped ones; the update gradients are finite."""

    @tf.function
    def run(gs):
        up, display = zero_nans_and_clip(gs, clip)
        return up, list(display), display.global_norm

    up, display, got_norm = run([tf.constant(g, tf.float32) for g in gradients])
    for u, d, want, given in zip(up, display, update, gradients, strict=True):
        assert np.all(np.isfinite(u))
        np.testing.assert_allclose(u, want, rtol=1e-6)
        given = np.asarray(given, np.float32)
        np.testing.assert_array_equal(d, np.where(np.isfinite(given), given, 0.0))
    if np.isinf(norm):
        assert np.isposinf(got_norm)
    else:
        np.testing.assert_allclose(got_norm, norm, rtol=1e-6)


def test_the_rare_branch_is_one_function_call_in_the_step():
    """The fix of non-finite entries is one call node in the `tf.cond`'s untaken branch, kept
    out of line (`_noinline`): a step that does not take it visits one node, not its ~170."""
    specs = [tf.TensorSpec([3, 2]), tf.TensorSpec([2])]
    traced = tf.function(lambda g: zero_nans_and_clip(g, 10.0)[0]).get_concrete_function(specs)
    graph = traced.graph.as_graph_def()
    functions = {f.signature.name: f for f in graph.library.function}
    branch = next(n for n in graph.node if n.op in ("If", "StatelessIf"))
    rare = functions[branch.attr["else_branch"].func.name]
    calls = [n for n in rare.node_def if n.op in ("PartitionedCall", "StatefulPartitionedCall")]
    assert len(calls) == 1 and len(rare.node_def) < 10, [n.op for n in rare.node_def]
    assert functions[calls[0].attr["f"].func.name].attr["_noinline"].b


def test_fix_handles_indexed_slices():
    @tf.function
    def run():
        rows = tf.IndexedSlices(
            tf.constant([[np.inf, BIG], [1.0, np.nan]]), tf.constant([0, 2]), tf.constant([3, 2])
        )
        up, display = zero_nans_and_clip([rows, None, tf.constant([BIG])], 10.0)
        return up[0].values, up[0].indices, up[1] is None, display[0].values

    values, indices, none_kept, shown = run()
    r = 10 / 2**0.5
    np.testing.assert_allclose(values, [[0.0, r], [0.0, 0.0]], rtol=1e-6, atol=1e-30)
    np.testing.assert_array_equal(indices, [0, 2])
    assert none_kept
    np.testing.assert_array_equal(shown, [[0.0, BIG], [1.0, 0.0]])


def rows(case: str) -> tuple[np.ndarray, np.ndarray]:
    """LinearTask data, 5 steps of B rows; the second half of step 3's batch is bad.

    Column 0 is 1 everywhere, so w[0]'s gradient is the batch mean of `m` (1 on good steps).
    inf_loss: column 1 is 1 and -Inf at the bad rows; w[1] < 0 there, so the loss is +Inf and
      w[1]'s gradient -Inf (w[0]'s stays 1).
    inf_gradient: columns 1, 2 are 0 (w[1], w[2] stay 0, the loss stays finite) but 3e38 at the
      bad rows of w[1], with `m` = 4 there: w[1]'s gradient sums past float32 to +Inf; w[0]'s is
      (4 + 16) / 8 = 2.5.
    overflow: columns 1 and 2 are 3e38 at the bad rows, `m` = 2: both gradients are 3e38, every
      entry finite, the global norm 4.2e38 beyond float32; w[0]'s (1.5) is negligible beside.
    """
    x = np.zeros((B * 5, 3), np.float32)
    x[:, 0] = 1.0
    m = np.ones(B * 5, np.float32)
    bad = slice(2 * B + B // 2, 3 * B)
    if case == "inf_loss":
        x[:, 1] = 1.0
        x[bad, 1] = -np.inf
    elif case == "inf_gradient":
        x[bad, 1], m[bad] = BIG, 4.0
    else:
        x[bad, 1], x[bad, 2], m[bad] = BIG, BIG, 2.0
    return x, m


R = 10 / 2**0.5  # the overflow step's gradient, clipped to norm 10 along (0, 1, 1)
# w after steps 1-4 (SGD, rate 0.1, clip norm 10); the guard's where it differs
EXPECTED = {
    "inf_loss": [[-0.1, -0.1, 0], [-0.2, -0.2, 0], [-0.3, -0.2, 0], [-0.4, -0.3, 0]],
    "inf_gradient": [[-0.1, 0, 0], [-0.2, 0, 0], [-0.45, 0, 0], [-0.55, 0, 0]],
    "overflow": [
        [-0.1, 0, 0],
        [-0.2, 0, 0],
        [-0.2, -0.1 * R, -0.1 * R],
        [-0.3, -0.1 * R, -0.1 * R],
    ],
}
GUARDED = {
    "inf_loss": [[-0.1, -0.1, 0], [-0.2, -0.2, 0], [-0.2, -0.2, 0], [-0.3, -0.3, 0]],
    "inf_gradient": [[-0.1, 0, 0], [-0.2, 0, 0], [-0.2, 0, 0], [-0.3, 0, 0]],
    "overflow": EXPECTED["overflow"],  # every entry finite: a good step, applied clipped
}
STEP3 = {  # step 3's logged loss and grad_norm (the norm of the fixed, unclipped gradient)
    "inf_loss": (np.inf, 1.0),
    "inf_gradient": (-0.2 * 2.5, 2.5),
    "overflow": (-0.2 * 1.5, np.inf),
}


class Linear(LinearTask):
    def every_steps(self):
        return {1: self.seen}


def _run(task, model_dir, guarded, strategy="one_device"):
    return run_experiment(
        task,
        str(model_dir),
        mode="train",
        train_steps=4,
        global_batch_size=B,
        learning_rate=0.1,
        steps_per_loop=1,
        checkpoint_interval=4,
        strategy=strategy,
        progress=False,
        nan_guard=NanGuard(patience=3) if guarded else None,
    )


@pytest.mark.parametrize(
    "case,strategy",
    [
        ("inf_loss", "one_device"),
        ("inf_gradient", "one_device"),
        ("overflow", "one_device"),
        ("inf_gradient", "mirrored"),  # the bad rows on the second replica only
    ],
)
@pytest.mark.parametrize("guarded", [False, True], ids=["default", "nan_guard"])
def test_infinite_loss_and_gradients(tmp_path, case, strategy, guarded):
    """The default update: the non-finite entries never reach the weights (w[1] stays where a
    zero gradient leaves it) and an overflowing norm clips the others along their direction.
    The guard: a non-finite loss or gradient skips the step before its update (weights and
    iterations as after step 2); finite entries with an overflowing norm are a good step."""
    task = Linear(*rows(case))
    task.seen = StepRecorder()
    logs = _run(task, tmp_path, guarded, strategy)
    loss, grad_norm = STEP3[case]
    step3 = task.seen.steps[3]["logs"]
    np.testing.assert_allclose(step3["loss"], loss, rtol=1e-6)
    if not guarded:
        np.testing.assert_allclose(step3["grad_norm"], grad_norm, rtol=1e-6)
    moved = np.array([w[0][:, 0] for w in task.seen.column("weights")])
    skipped = guarded and case != "overflow"
    expected = GUARDED[case] if guarded else EXPECTED[case]
    np.testing.assert_allclose(moved, expected, rtol=1e-6, atol=1e-7)
    assert task.seen.column("iterations") == ([1, 2, 2, 3] if skipped else [1, 2, 3, 4])
    if skipped:  # not even rounding: the weights after step 3 are those after step 2
        np.testing.assert_array_equal(task.seen.steps[3]["weights"], task.seen.steps[2]["weights"])
    if guarded:
        assert logs["train"]["nonfinite_steps"] == (1 if skipped else 0)


class NadamLinear(LinearTask):
    """The same data under the default optimizer (Nadam: slots that a NaN would fill)."""

    build_optimizer = Task.build_optimizer


@pytest.mark.parametrize("case", ["inf_loss", "inf_gradient", "overflow"])
def test_default_update_leaves_every_weight_and_slot_finite(tmp_path, case):
    task = NadamLinear(*rows(case))
    _run(task, tmp_path, guarded=False)
    path = tf.train.latest_checkpoint(str(tmp_path))
    assert path.endswith("ckpt-4")
    floats = {}
    for name, _ in tf.train.list_variables(path):
        value = tf.train.load_variable(path, name)
        if isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.floating):
            floats[name] = value
    slots = [n for n, v in floats.items() if "optimizer/_variables" in n and v.shape == (3, 1)]
    assert len(slots) == 2, sorted(floats)  # Nadam's two moments of the kernel
    for name, value in floats.items():
        assert np.all(np.isfinite(value)), (name, value)
    (kernel,) = checkpoint_weights(task, tmp_path)
    if case == "inf_gradient":
        assert kernel[1, 0] == 0.0  # its only gradient was +Inf, zeroed: Nadam never moved it
    if case == "overflow":
        assert kernel[1, 0] == kernel[2, 0] < 0  # moved, along the clipped direction


def _scalars(folder, tag: str) -> dict:
    """`{step: value}` of the scalar `tag` in the event files of `folder`."""
    found = {}
    for path in tf.io.gfile.glob(str(folder / "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == tag:
                    found[event.step] = float(tf.make_ndarray(value.tensor))
    return found


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_steps_with_zeroed_gradients_are_counted_and_said(tmp_path, capsys, strategy):
    """NaN in 3 of 96 rows, in steps 2, 3 and 10 (one replica's half on two): the default update
    zeroes those entries and trains on; the first device loop that had one says so, the end of
    the run says how many steps had them (once per step, not per replica), and `train/` holds
    the count after each device loop that added to it."""
    task = LinearTask(nan_rows(96, [9, 20, 77]))
    run_experiment(
        task, str(tmp_path), mode="train", train_steps=12, global_batch_size=B,
        steps_per_loop=4, learning_rate=0.1, strategy=strategy, progress=False,
    )  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    said = [x for x in out if "non-finite gradients" in x]
    assert said == [
        "orbitask: warning: non-finite gradients (NaN or Inf) by step 4: their entries were set "
        "to 0 and the steps taken; the count is said at the end "
        "(orbitask.run_experiment.nan_guard = @orbitask.NanGuard() skips such steps)",
        "orbitask: 3 steps had non-finite gradients, zeroed",
    ]
    assert _scalars(tmp_path / "train", "nonfinite_gradient_steps") == {4: 2.0, 12: 3.0}
