"""Deferred callbacks (the default `print_loss`) see each due step's logs without ending loops."""

import glob
import os

import keras
import pytest
import tensorflow as tf

from orbitask.tasks import callbacks, deferred
from orbitask.trainers import TaskTrainer, run_experiment
from orbitask.trainers.actions.schedule import Periodic, Schedule
from orbitask.trainers.actions.summaries import LoopSummaryManager
from orbitask.trainers.commands.report import read_events
from orbitask.trainers.run.controller import Controller
from tests.helpers import Recorder, TinyTask


class Both(TinyTask):
    """A callback every 3 steps (deferred or not) and an ordinary one every 7."""

    def __init__(self, defer, **kwargs):
        super().__init__(**kwargs)
        self.every3, self.every7 = Recorder(), Recorder()
        if defer:
            deferred(self.every3)

    def every_steps(self):
        return {3: self.every3, 7: self.every7}


def _train(task, model_dir, **kwargs):
    settings = dict(mode="train", train_steps=23, global_batch_size=8, progress=False)
    settings.update(kwargs)
    return run_experiment(task, str(model_dir), **settings)


@pytest.fixture
def loops(monkeypatch):
    """Counts device loops (calls of `TaskTrainer.train`)."""
    counter = {"loops": 0}
    train = TaskTrainer.train

    def counting(self, num_steps):
        counter["loops"] += 1
        return train(self, num_steps)

    monkeypatch.setattr(TaskTrainer, "train", counting)
    return counter


@pytest.mark.parametrize("use_tf_while_loop", [True, False])
def test_deferred_callback_sees_the_same_steps_and_logs_in_fewer_loops(
    tmp_path, loops, use_tf_while_loop
):
    exact = Both(defer=False, shuffle=True)
    _train(exact, tmp_path / "exact", use_tf_while_loop=use_tf_while_loop)
    exact_loops = loops["loops"]
    lazy = Both(defer=True, shuffle=True)
    _train(lazy, tmp_path / "lazy", use_tf_while_loop=use_tf_while_loop)
    # Loops end at 3, 6, 7, 9, 12, 14, 15, 18, 21, 23 vs at 7, 14, 21, 23.
    assert (exact_loops, loops["loops"] - exact_loops) == (10, 4)
    assert [s for s, _ in lazy.every3.calls] == [3, 6, 9, 12, 15, 18, 21]
    assert [s for s, _ in lazy.every7.calls] == [7, 14, 21]
    for (step, want), (_, got) in zip(exact.every3.calls, lazy.every3.calls, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6), step
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-6), step
    assert lazy.every7.calls[0][1]["loss"] == pytest.approx(exact.every7.calls[0][1]["loss"])
    # Every call sees the metrics and the learning rate; metrics accumulate from the start of
    # the device loop: both runs' first loops start at step 1, so step 3 agrees, and at step 21
    # (a loop end) the deferred call sees what the ordinary one does.
    for _, logs in lazy.every3.calls:
        assert set(logs) == {"loss", "grad_norm", "accuracy", "learning_rate"}, logs
    first_exact, first_lazy = exact.every3.calls[0][1], lazy.every3.calls[0][1]
    assert first_lazy["accuracy"] == pytest.approx(first_exact["accuracy"], rel=1e-6)
    assert first_lazy["learning_rate"] == pytest.approx(first_exact["learning_rate"])


class Examples(keras.metrics.Metric):
    """Counts the examples seen since the last reset."""

    def __init__(self):
        super().__init__(name="examples")
        self.count = self.add_weight(name="count", initializer="zeros")

    def update_state(self, labels, outputs, sample_weight=None):
        self.count.assign_add(tf.cast(tf.shape(labels)[0], tf.float32))

    def result(self):
        return tf.identity(self.count)


class CountingExamples(Both):
    def build_metrics(self, training=True):
        return [Examples()]


def test_a_deferred_callback_sees_the_metrics_of_its_own_step(tmp_path):
    """Loops end at 7, 14, 21, 23 (the ordinary callback); the deferred one, due at 3, 6, ...,
    sees the examples counted to its own step (8 per step): from the start of the metrics'
    window of 10 steps, or without a window from its loop's start."""
    task = CountingExamples(defer=True)
    _train(task, tmp_path, metrics_window=10)  # loops also end at 10 and 20
    seen = {step: logs["examples"] for step, logs in task.every3.calls}
    assert seen == {3: 24, 6: 48, 9: 72, 12: 16, 15: 40, 18: 64, 21: 8}
    task = CountingExamples(defer=True)
    _train(task, tmp_path / "loops", metrics_window=None)
    seen = {step: logs["examples"] for step, logs in task.every3.calls}
    assert seen == {3: 24, 6: 48, 9: 16, 12: 40, 15: 8, 18: 32, 21: 56}


def test_deferred_callback_runs_before_an_ordinary_one_due_at_the_same_step(tmp_path):
    task = Both(defer=True)
    order = []
    task.every3 = deferred(lambda t, c: order.append((c.step, "every3")))
    task.every7 = lambda t, c: order.append((c.step, "every7"))
    _train(task, tmp_path)
    three, seven = "every3", "every7"
    assert order == [
        (3, three), (6, three), (7, seven), (9, three), (12, three), (14, seven),
        (15, three), (18, three), (21, three), (21, seven),
    ]  # fmt: skip


def test_default_print_loss_prints_and_writes_every_10_steps_without_ending_loops(
    tmp_path, loops, capsys
):
    _train(TinyTask(), tmp_path, train_steps=30)
    assert loops["loops"] == 1  # steps_per_loop 100; print_loss (every 10) is deferred
    printed = [line for line in capsys.readouterr().out.splitlines() if ": loss " in line]
    assert [line.split(":")[0] for line in printed] == ["step 10", "step 20", "step 30"]
    (events,) = glob.glob(os.path.join(tmp_path, "train", "events.out.tfevents.*"))
    points = {step: value for tag, step, _, value in read_events(events) if tag == "loss"}
    assert sorted(points) == [10, 20, 30]
    for line in printed:
        step = int(line.split()[1].rstrip(":"))
        assert points[step] == pytest.approx(float(line.split()[-1]), rel=1e-5)


def test_every_loops_train_scalars_reach_tensorboard_though_written_in_batches(tmp_path):
    # Loops of 10 steps (never grown); the kept points are written at 100 (10 loops) and at
    # the end.
    _train(TinyTask(), tmp_path, train_steps=130, steps_per_loop=10, loop_seconds=None)
    (events,) = glob.glob(os.path.join(tmp_path, "train", "events.out.tfevents.*"))
    by_tag, values = {}, {}
    for tag, step, _, value in read_events(events):
        by_tag.setdefault(tag, []).append(step)
        values[tag, step] = value
    assert values["learning_rate", 130] == pytest.approx(1e-3)
    for tag in ("grad_norm", "learning_rate", "steps_per_second", "loss"):
        # One point a step: the loop's `loss` is kept by the summaries and by print_loss (every
        # 10 steps, here each loop's end), at 100 in different batches.
        assert by_tag[tag] == list(range(10, 131, 10)), tag


def test_a_worker_without_summaries_keeps_no_points():
    # A non-chief worker's manager has no directory; print_loss still keeps points for its
    # (no-op) writer, and they must be dropped each loop, not pile up for the whole run.
    manager = LoopSummaryManager(None, None, tf.Variable(0, dtype=tf.int64), interval=1000)
    manager.scalars.keep("loss", [(10, 1.0), (20, 0.5)])
    manager.write_summaries({"loss": 0.5})
    assert manager.scalars.write_kept() is False


def test_periodic_writes_run_on_a_background_thread_and_write_pending_waits_for_them(tmp_path):
    # Interval 10: the loops ending at 10, 20, 30 each start a background write of what is
    # kept; write_pending waits for them, writes the rest (step 35) and stops the thread.
    step = tf.Variable(0, dtype=tf.int64)
    manager = LoopSummaryManager(str(tmp_path), None, step, interval=10)
    keep = Periodic("summaries", manager.write_summaries)
    schedule = Schedule([keep, manager.entry()], current_step=lambda: int(step.numpy()))
    for start, end in ((0, 10), (10, 20), (20, 30), (30, 35)):
        step.assign(end)
        manager.scalars.keep("loss", [(end - 5, 1.0 / end)])
        schedule.run({"grad_norm": float(end)}, start)
        if end < 35:
            assert manager._pending  # handed to the writer thread
    manager.write_pending()
    manager.flush()

    assert manager._thread is None
    (events,) = glob.glob(os.path.join(tmp_path, "events.out.tfevents.*"))
    by_tag = {}
    for tag, at, _, value in read_events(events):
        by_tag.setdefault(tag, {})[at] = value
    assert sorted(by_tag["grad_norm"]) == [10, 20, 30, 35]
    assert by_tag["loss"] == pytest.approx({5: 0.1, 15: 0.05, 25: 1 / 30, 30: 1 / 35})


class ExtraLogs(TinyTask):
    """The default step plus an int32 log, a float64 log and a vector log; `every` sets
    `every_steps`."""

    def __init__(self, every, **kwargs):
        super().__init__(**kwargs)
        self.every = every

    def every_steps(self):
        return self.every

    def train_step(self, batch, model, optimizer, metrics=None, **kwargs):
        logs = super().train_step(batch, model, optimizer, metrics, **kwargs)
        pair = tf.stack([logs["loss"], 2 * logs["loss"]])
        third = tf.cast(logs["loss"], tf.float64) / 3  # a float32 row would round it
        return {**logs, "seven": tf.constant(7, tf.int32), "third": third, "pair": pair}


@pytest.mark.slow
@pytest.mark.parametrize("steps", [1, 23])
def test_a_recording_loop_returns_the_last_steps_logs_like_a_plain_one(tmp_path, steps):
    # A loop that records each step's logs for deferred callbacks returns the same last logs.
    recorded = _train(
        ExtraLogs({3: callbacks.print_loss}), tmp_path / "r", seed=1, train_steps=steps
    )
    plain = _train(ExtraLogs({}), tmp_path / "p", seed=1, train_steps=steps)
    assert recorded["train"]["loss"] == plain["train"]["loss"]
    assert recorded["train"]["grad_norm"] == plain["train"]["grad_norm"]
    assert recorded["train"]["seven"] == plain["train"]["seven"] == 7
    assert recorded["train"]["third"] == plain["train"]["third"]
    loss = recorded["train"]["loss"]
    assert recorded["train"]["pair"].tolist() == pytest.approx([loss, 2 * loss])


class _Built(Controller):
    """The Controller, kept for the test to reach its trainer."""

    built: list = []

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        _Built.built.append(self)


def test_a_recording_loop_carries_only_the_logs_its_rows_cannot_give_back(tmp_path, monkeypatch):
    """The loop reads its float32 scalar logs back from the last history row instead of also
    carrying them from step to step (which costs about 2% of a small model's step:
    benchmarks/RESULTS.md); the float64 and vector logs it carries."""
    monkeypatch.setattr("orbitask.trainers.run.runner.Controller", _Built)
    _Built.built = []
    _train(ExtraLogs({3: callbacks.print_loss}), tmp_path, train_steps=3)
    trainer = _Built.built[-1].trainer
    traced = trainer._loop_fn.get_concrete_function(trainer._iterator, tf.constant(3))
    graph = traced.graph.as_graph_def()
    (loop,) = [n for n in graph.node if n.op in ("While", "StatelessWhile")]
    carried = [tf.dtypes.as_dtype(t) for t in loop.attr["T"].list.type]
    assert carried.count(tf.float32) == 1, carried  # "pair", a vector; not "loss", "grad_norm"
    assert carried.count(tf.float64) == 1, carried  # "third"


class MethodCallback(TinyTask):
    """A bound method, marked deferred (a method takes no attributes: it comes back wrapped)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.steps = []

    def note(self, task, ctx):
        self.steps.append(ctx.step)

    def every_steps(self):
        return {3: deferred(self.note)}


def test_a_bound_method_can_be_deferred(tmp_path, loops):
    task = MethodCallback()
    _train(task, tmp_path, steps_per_loop=100, loop_seconds=None)
    assert task.steps == [3, 6, 9, 12, 15, 18, 21]
    assert loops["loops"] == 1  # deferred: no loop ended at its steps
