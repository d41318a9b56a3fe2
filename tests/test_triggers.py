"""`Trigger`: every N steps, every T seconds, at step N; steps until due; due steps in a range."""

from types import SimpleNamespace

import pytest
import tensorflow as tf

from orbitask.tasks import deferred
from orbitask.trainers.actions.callback_action import CallbackAction
from orbitask.trainers.actions.schedule import Periodic, Schedule
from orbitask.trainers.actions.summaries import LoopSummaryManager
from orbitask.trainers.actions.triggers import Trigger, steps_until_any


class Clock:
    """An injected clock: time moves only when the test says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_every_steps_is_due_at_multiples():
    trigger = Trigger(every_steps=5)
    assert [s for s in range(1, 21) if trigger.due(s)] == [5, 10, 15, 20]
    assert [trigger.steps_until_due(s) for s in (0, 3, 4, 5, 9)] == [5, 2, 1, 5, 1]
    assert not trigger.time_due()  # no seconds rule


def test_at_steps_are_due_once_each_and_none_after_the_last():
    trigger = Trigger(at_steps=[12, 3, 3])
    assert trigger.at_steps == (3, 12)
    assert [s for s in range(20) if trigger.due(s)] == [3, 12]
    assert [trigger.steps_until_due(s) for s in (0, 2, 3, 11)] == [3, 1, 9, 1]
    assert trigger.steps_until_due(12) is None
    assert trigger.steps_until_due(100) is None


def test_every_secs_counts_from_construction_and_fired_restarts_it():
    clock = Clock()
    trigger = Trigger(every_secs=10.0, clock=clock)
    clock.now = 9.9
    assert not trigger.due(7)
    clock.now = 10.0  # at least every_secs
    assert trigger.due(7) and trigger.time_due()
    assert trigger.due(7)  # asking changes nothing
    trigger.fired(7)
    assert trigger.last_step == 7 and trigger.last_time == 10.0
    assert not trigger.due(8)
    assert trigger.time_due(now=20.0) and not trigger.time_due(now=19.0)
    trigger.fired(now=25.0)  # no step: the time only
    assert trigger.last_step == 7 and not trigger.time_due(now=30.0)
    # The seconds rule has no step: it never ends a device loop.
    assert trigger.steps_until_due(7) is None
    assert trigger.due_steps(1, 100) == []


def test_a_trigger_without_rules_is_never_due():
    trigger = Trigger()
    assert not trigger.due(10, since=0)
    assert trigger.steps_until_due(0) is None
    assert trigger.due_steps(0, 10) == []


def test_combined_rules_take_the_nearest_due_point():
    clock = Clock()
    trigger = Trigger(every_steps=10, every_secs=60.0, at_steps=[4, 25], clock=clock)
    assert [s for s in range(1, 31) if trigger.due(s)] == [4, 10, 20, 25, 30]
    assert [trigger.steps_until_due(s) for s in (0, 4, 20, 24, 25, 30)] == [4, 6, 5, 1, 5, 10]
    clock.now = 60.0
    assert trigger.due(7) and not trigger.step_due(7)  # by the clock only
    trigger.fired(7)
    assert not trigger.due(7) and trigger.due(10)  # a step rule needs no time


def test_since_counts_a_due_point_that_a_loop_ran_past():
    trigger = Trigger(every_steps=10, at_steps=[15])
    assert not trigger.step_due(7)
    assert trigger.step_due(13, since=7)  # passed 10
    assert trigger.step_due(16, since=13)  # passed 15
    assert not trigger.step_due(19, since=16)
    assert trigger.step_due(20, since=19)  # reached 20
    assert not trigger.step_due(20, since=20)  # nothing new
    assert trigger.step_due(9, since=12)  # moved back behind 10 (a rollback)
    assert not Trigger(at_steps=[15]).step_due(30, since=15)


def test_due_steps_lists_step_due_points_in_a_closed_range():
    assert Trigger(every_steps=10).due_steps(5, 30) == [10, 20, 30]
    assert Trigger(every_steps=10).due_steps(10, 29) == [10, 20]
    assert Trigger(at_steps=[3, 8, 40]).due_steps(3, 39) == [3, 8]
    both = Trigger(every_steps=4, at_steps=[6, 8, 13])
    assert both.due_steps(1, 14) == [4, 6, 8, 12, 13]  # 8 once
    assert both.due_steps(9, 11) == []
    assert both.due_steps(20, 10) == []
    for step in range(0, 40):
        # Agrees with due() at every step, and steps_until_due finds the first one.
        listed = both.due_steps(step + 1, step + 30)
        assert listed == [s for s in range(step + 1, step + 31) if both.step_due(s)]
        assert both.steps_until_due(step) == listed[0] - step


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"every_steps": 0}, r"`Trigger\(every_steps=...\)` must be a positive integer.*0"),
        ({"every_steps": True}, r"every_steps.*received True"),
        ({"every_steps": 2.5}, r"every_steps.*received 2.5"),
        ({"every_secs": -1}, r"`Trigger\(every_secs=...\)` must be a number of seconds >= 0"),
        ({"every_secs": "10"}, r"every_secs.*received '10'"),
        ({"at_steps": [3, 0]}, r"`Trigger\(at_steps=...\)` must hold positive integers.*0"),
    ],
)
def test_bad_arguments_name_the_argument_and_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Trigger(**kwargs)


def test_steps_until_any_is_the_nearest_due_point():
    triggers = [Trigger(every_steps=100), Trigger(at_steps=[30]), Trigger(every_secs=1.0)]
    assert steps_until_any(triggers, 0) == 30
    assert steps_until_any(triggers, 30) == 70
    assert steps_until_any(triggers, 90) == 10
    assert steps_until_any([Trigger(every_secs=1.0)], 0) is None


class Tables:
    """A task's callback tables only (CallbackAction reads nothing else of it)."""

    def __init__(self, every=None, at=None):
        self.every, self.at = every or {}, at or {}

    def every_steps(self):
        return self.every

    def at_step(self):
        return self.at


def _action(task, step, **kwargs):
    writer = tf.summary.create_noop_writer()
    make_context = lambda s, logs: SimpleNamespace(step=s, logs=dict(logs))  # noqa: E731
    return CallbackAction(task, None, make_context, writer, current_step=lambda: step[0], **kwargs)


def test_callback_action_runs_triggered_rules_between_every_steps_and_at_step():
    calls, clock, step = [], Clock(), [0]

    def record(name):
        return lambda task, ctx: calls.append((ctx.step, name))

    timed = Trigger(every_secs=30.0, clock=clock)
    task = Tables(every={4: record("every4")}, at={8: record("at8")})
    action = _action(task, step, triggered=[(timed, [record("timed")])])
    assert [action.steps_until_due(s) for s in (0, 4, 7, 8)] == [4, 4, 1, 4]  # not the clock
    for end, now in ((4, 10.0), (6, 31.0), (8, 40.0), (10, 70.0)):
        step[0], clock.now = end, now
        action({"loss": 1.0})
    assert calls == [(4, "every4"), (6, "timed"), (8, "every4"), (8, "at8"), (10, "timed")]
    assert timed.last_step == 10 and timed.last_time == 70.0


def test_deferred_callbacks_run_once_per_due_step_of_their_triggers():
    seen = []

    def keep(task, ctx):
        seen.append((ctx.step, ctx.logs["loss"]))

    deferred(keep)
    history = (11, {"loss": [float(s) for s in range(11, 31)]})  # a loop of steps 11..30
    step = [30]
    action = _action(
        Tables(every={4: keep}, at={13: keep}),
        step,
        history=lambda: history,
        triggered=[(Trigger(at_steps=[25]), [keep])],
    )
    assert action.steps_until_due(10) is None  # deferred: no loop ends for them
    action({"loss": 30.0})
    assert [s for s, _ in seen] == [12, 13, 16, 20, 24, 25, 28]
    assert all(loss == s for s, loss in seen)  # each with its own step's logs


def test_loop_summaries_write_after_the_first_loop_a_passed_multiple_or_max_seconds(tmp_path):
    clock, step = Clock(), tf.Variable(0, dtype=tf.int64)
    manager = LoopSummaryManager(
        str(tmp_path), None, step, interval=100, max_seconds=30.0, clock=clock
    )
    keep = Periodic("summaries", manager.write_summaries)
    schedule = Schedule([keep, manager.entry()], current_step=lambda: int(step.numpy()))
    written, start = [], 0
    for end, now in ((40, 1.0), (80, 2.0), (120, 3.0), (160, 34.0), (170, 35.0), (200, 36.0)):
        step.assign(end)
        clock.now = now
        schedule.run({"loss": 1.0}, start)
        written.append(manager.trigger.last_step)
        start = end
    # first loop; 80: same block; 120 passed 100; 160 by the clock; 170 neither; 200 reached
    assert written == [40, 40, 120, 160, 160, 200]
    manager.write_pending()
    assert manager._thread is None
