"""Hook order, and callbacks at exact steps whatever `steps_per_loop` is, also across a resume."""

import numpy as np
import pytest
import tensorflow as tf

from orbitask.trainers import run_experiment
from tests.helpers import LinearTask, Recorder, StepRecorder, TinyTask

STAGES = ("input_pre", "loss_pre", "grad_pre", "process_metrics", "update_pre")
BUILDERS = (
    "build_model",
    "build_losses",
    "build_optimizer",
    "build_metrics",
    "build_inputs",
    "make_batches",
    "build_checkpoint",
)


class RecordingTask(TinyTask):
    """Records every builder call (eager) and every stage call (at trace time, in order)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.events = []

    def __getattribute__(self, name):
        attr = super().__getattribute__(name)
        if name in STAGES + BUILDERS or name in ("train_step", "validation_step"):
            events = super().__getattribute__("events")

            def wrapped(*args, **kwargs):
                events.append(name)
                return attr(*args, **kwargs)

            return wrapped
        return attr


def test_recording_task_sees_builders_then_stages_in_order(tmp_path):
    task = RecordingTask()
    run_experiment(
        task,
        str(tmp_path),
        mode="train_and_eval",
        train_steps=4,
        global_batch_size=8,
        steps_per_loop=4,
        eval_interval=4,
        progress=False,
    )
    events = task.events
    first_step = events.index("train_step")
    assert events[:first_step] == [
        "build_model",
        "build_losses",
        "build_optimizer",
        "build_metrics",
        "build_metrics",
        "build_inputs",
        "make_batches",
        # The pre-flight check: one eager pass over a batch of zeros of the data's spec, then
        # the loss of that batch and of the batch twice over (is it a sum or a mean?).
        "input_pre",
        "loss_pre",
        "loss_pre",
        "loss_pre",
        "build_checkpoint",
        "build_inputs",
        "make_batches",
        # The validation pre-flight: the first validation batch through validation_step.
        "validation_step",
        "input_pre",
        "loss_pre",
        "process_metrics",
    ]
    # One trace of the default train step calls the stages in the seed's order.
    assert events[first_step : first_step + 6] == ["train_step", *STAGES]
    assert "validation_step" in events[first_step + 6 :]


def test_default_steps_give_process_metrics_the_labels(tmp_path):
    """Model Garden's signature: `process_metrics(metrics, labels, model_outputs)`, where the
    default train and validation steps pass the `gt` of the `(inputs, gt)` batch."""

    class Seen(TinyTask):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.seen = []

        def process_metrics(self, metrics, labels, model_outputs, **kwargs):
            self.seen.append((labels.dtype, labels.shape.as_list(), model_outputs.shape.as_list()))
            super().process_metrics(metrics, labels, model_outputs, **kwargs)

    task = Seen()
    logs = run_experiment(
        task,
        str(tmp_path),
        mode="train_and_eval",
        train_steps=2,
        global_batch_size=8,
        eval_interval=2,
        progress=False,
    )
    assert (tf.int32, [8], [8, 3]) in task.seen  # the train step's trace
    assert all(dtype == tf.int32 and len(shape) == 1 for dtype, shape, _ in task.seen)
    assert 0.0 <= logs["train"]["accuracy"] <= 1.0 and 0.0 <= logs["eval"]["accuracy"] <= 1.0


class Callbacks(TinyTask):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.r4, self.r5, self.a6, self.a22, self.order = (Recorder() for _ in range(5))

    def every_steps(self):
        return {4: [self.r4, lambda t, c: self.order.calls.append((c.step, "every4"))], 5: self.r5}

    def at_step(self):
        return {6: [self.a6, lambda t, c: self.order.calls.append((c.step, "at6"))], 22: self.a22}


@pytest.mark.parametrize("steps_per_loop", [1, 3, 7, 100])
def test_callbacks_fire_at_exact_steps_for_any_loop_length(tmp_path, steps_per_loop):
    task = Callbacks()
    run_experiment(
        task,
        str(tmp_path),
        mode="train",
        train_steps=23,
        global_batch_size=8,
        steps_per_loop=steps_per_loop,
        checkpoint_interval=None,
        progress=False,
    )
    assert [s for s, _ in task.r4.calls] == [4, 8, 12, 16, 20]
    assert [s for s, _ in task.r5.calls] == [5, 10, 15, 20]
    assert [s for s, _ in task.a6.calls] == [6]
    assert [s for s, _ in task.a22.calls] == [22]
    # The callback sees the logs of the step it is due at.
    assert all("loss" in logs for _, logs in task.r4.calls)


def test_every_steps_before_at_step_on_the_same_step(tmp_path):
    class Same(Callbacks):
        def every_steps(self):
            return {6: lambda t, c: self.order.calls.append((c.step, "every6"))}

    task = Same()
    run_experiment(
        task,
        str(tmp_path),
        mode="train",
        train_steps=6,
        global_batch_size=8,
        steps_per_loop=100,
        progress=False,
    )
    assert task.order.calls == [(6, "every6"), (6, "at6")]


def test_at_step_passed_before_a_restart_does_not_fire_again(tmp_path):
    first = Callbacks()
    run_experiment(
        first,
        str(tmp_path),
        mode="train",
        train_steps=10,
        global_batch_size=8,
        steps_per_loop=100,
        checkpoint_interval=5,
        progress=False,
    )
    assert [s for s, _ in first.a6.calls] == [6]
    second = Callbacks()
    run_experiment(
        second,
        str(tmp_path),
        mode="train",
        train_steps=23,
        global_batch_size=8,
        steps_per_loop=100,
        checkpoint_interval=5,
        progress=False,
    )
    assert second.a6.calls == []
    assert [s for s, _ in second.a22.calls] == [22]
    assert [s for s, _ in second.r4.calls] == [12, 16, 20]


def test_callback_changes_learning_rate_and_it_reaches_the_optimizer(tmp_path):
    class Halve(TinyTask):
        seen = StepRecorder()

        def every_steps(self):
            return {1: self.seen}

        def at_step(self):
            return {3: lambda t, c: c.lr.assign(c.lr * 0.5)}

    task = Halve()
    run_experiment(
        task,
        str(tmp_path),
        mode="train",
        train_steps=5,
        global_batch_size=8,
        learning_rate=0.01,
        steps_per_loop=100,
        progress=False,
    )
    expected = [0.01, 0.01, 0.01, 0.005, 0.005]
    logged = [logs["learning_rate"] for logs in task.seen.column("logs")]
    assert logged == pytest.approx(expected)
    # The optimizer's own rate, read after each step: the one the update used.
    assert task.seen.column("optimizer_lr") == pytest.approx(expected)
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(tmp_path)))
    assert reader.get_tensor("lr/.ATTRIBUTES/VARIABLE_VALUE") == pytest.approx(0.005)


@pytest.mark.parametrize(
    "flavour,strategy,replicas",
    [("keras", "one_device", 1), ("tf_keras", "one_device", 1), ("keras", "mirrored", 2)],
)
def test_rate_assigned_by_a_callback_moves_sgd_weights_by_exactly_that_rate(
    tmp_path, flavour, strategy, replicas
):
    """A weight whose gradient is exactly 1 (LinearTask) moves by minus the rate at each step."""

    class Assign(LinearTask):
        def every_steps(self):
            return {1: self.seen}

        def at_step(self):
            return {2: lambda t, c: c.lr.assign(0.25)}

    task = Assign(np.ones((32, 1)), flavour=flavour)
    task.seen = StepRecorder()
    run_experiment(
        task,
        str(tmp_path),
        mode="train",
        train_steps=4,
        global_batch_size=8,
        learning_rate=0.1,
        steps_per_loop=100,
        checkpoint_interval=None,
        strategy=strategy,
        progress=False,
    )
    assert task.seen.column("replicas") == [replicas] * 4
    assert task.seen.column("optimizer_lr") == pytest.approx([0.1, 0.1, 0.25, 0.25])
    moved = [float(w[0].item()) for w in task.seen.column("weights")]
    assert moved == pytest.approx([-0.1, -0.2, -0.45, -0.7], rel=1e-6)


class Hooked(TinyTask):
    """Records the hooks and a callback every 2 steps, in the order they run."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.events = []

    def every_steps(self):
        return {2: lambda task, ctx: self.events.append(("every_steps", ctx.step))}

    def on_train_begin(self, ctx):
        self.events.append(("on_train_begin", ctx.step))

    def on_train_end(self, ctx):
        assert "loss" in ctx.logs
        self.events.append(("on_train_end", ctx.step))

    def on_evaluation_end(self, ctx):
        assert "accuracy" in ctx.logs
        self.events.append(("on_evaluation_end", ctx.step))

    def on_checkpoint_saved(self, ctx):
        assert ctx.checkpoint_path.endswith(f"ckpt-{ctx.step}")
        self.events.append(("on_checkpoint_saved", ctx.step))


def _hooked(task, model_dir, steps, mode="train_and_eval"):
    run_experiment(task, str(model_dir), mode=mode, train_steps=steps, global_batch_size=8,
                   steps_per_loop=2, loop_seconds=None, checkpoint_interval=2,
                   checkpoint_seconds=None, eval_interval=2, progress=False)  # fmt: skip
    return task.events


def test_hooks_run_in_order_once_each_also_across_a_resume(tmp_path):
    loop = [("every_steps", 2), ("on_checkpoint_saved", 2), ("on_evaluation_end", 2)]
    loop += [("every_steps", 4), ("on_checkpoint_saved", 4), ("on_evaluation_end", 4)]
    assert _hooked(Hooked(), tmp_path, 4) == [
        ("on_train_begin", 0), *loop, ("on_train_end", 4),
    ]  # fmt: skip
    assert _hooked(Hooked(), tmp_path, 6) == [
        ("on_train_begin", 4),
        ("every_steps", 6), ("on_checkpoint_saved", 6), ("on_evaluation_end", 6),
        ("on_train_end", 6),
    ]  # fmt: skip
    assert _hooked(Hooked(), tmp_path, 6, mode="eval") == [("on_evaluation_end", 6)]
