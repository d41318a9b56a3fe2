"""The schedule of work between device loops (trainers/actions/schedule.py): when each entry runs,
where device loops end, and that a run's periodic work is entries of one schedule."""

import orbit
import pytest

from orbitask import NanGuard, run_experiment
from orbitask.trainers.actions.schedule import AGREED, Periodic, Schedule
from orbitask.trainers.actions.triggers import Trigger
from orbitask.trainers.run.controller import Controller
from tests.helpers import StepTrainer, TinyTask


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _recording(ran, name, step=None):
    return lambda output: ran.append((name, step[0] if step else None))


def test_entries_run_in_order_each_when_its_trigger_is_due_in_the_loop():
    ran, step, tens = [], [12], Trigger(every_steps=10)
    schedule = Schedule(
        [
            Periodic("every_loop", _recording(ran, "every_loop", step)),
            Periodic("tens", _recording(ran, "tens", step), when=tens),
            Periodic("at_15", _recording(ran, "at_15", step), when=Trigger(at_steps=[15])),
            Periodic("last", _recording(ran, "last", step)),
        ],
        current_step=lambda: step[0],
    )
    schedule.run({}, start=5)  # the loop ran steps 6..12, past 10
    assert ran == [("every_loop", 12), ("tens", 12), ("last", 12)]
    ran.clear()
    step[0] = 15
    schedule.run({}, start=12)
    assert ran == [("every_loop", 15), ("at_15", 15), ("last", 15)]
    assert schedule.names == ["every_loop", "tens", "at_15", "last"]
    assert tens.last_step == 12  # fired at the step it ran


def test_an_entry_that_moves_the_step_back_makes_later_step_rules_wait():
    # A NaN rollback or `go_back` before the checkpoint and the evaluation: the loop 10 -> 20
    # reached 20, but the step is 10 (or 0) when they are asked; they are due when it is 20 again.
    ran, step = [], [20]

    def schedule(*first):
        save = Periodic("save", _recording(ran, "save", step), when=Trigger(every_steps=10))
        return Schedule([*first, save], current_step=lambda: step[0])

    for to in (10, 0):
        step[0] = 20
        schedule(Periodic("rollback", lambda output, to=to: step.__setitem__(0, to))).run({}, 10)
        assert ran == [] and step[0] == to
    step[0] = 20
    schedule().run({}, 10)  # the same loop without a rollback
    assert ran == [("save", 20)]


def test_a_seconds_rule_runs_on_every_worker_when_any_workers_clock_says_so():
    ran, votes, clock = [], [], _Clock()
    trigger = Trigger(every_secs=5.0, clock=clock)

    def another_worker_due(asked):  # another worker's clock passed 5 s
        votes.append(list(asked))
        return [1 for _ in asked]

    schedule = Schedule(
        [Periodic("timed", _recording(ran, "timed"), when=trigger)],
        current_step=lambda: 3,
        agree=another_worker_due,
    )
    clock.now = 1.0
    schedule.run({}, start=2)
    assert votes == [[(0, 2)]] and ran == [("timed", None)]
    assert trigger.last_time == 1.0  # its clock restarts when it runs
    clock.now = 7.0
    schedule.run({}, start=3)
    assert votes == [[(0, 2)], [(1, 2)]]


def test_after_a_loop_the_workers_agree_once_on_every_clock_and_vote():
    """One `agree` call (one collective) after each loop carries each shared seconds rule's
    clock and each entry's vote; every entry acts on the agreed values, a local clock on its
    own, and a voting entry gets its agreed value."""
    ran, asked, clock = [], [], _Clock()
    schedule = Schedule(
        [
            Periodic("save", _recording(ran, "save"), when=Trigger(every_secs=5.0, clock=clock)),
            Periodic("lines", _recording(ran, "lines"), when=Trigger(every_secs=1.0, clock=clock),
                     local=True),
            Periodic("signals", lambda out: ran.append(("signals", out)), vote=lambda: (1, 3)),
            Periodic("eval", _recording(ran, "eval"), when=Trigger(every_secs=60.0, clock=clock)),
        ],
        current_step=lambda: 3,
        agree=lambda votes: asked.append(list(votes)) or [0, 2, 1],  # the other workers' say
    )  # fmt: skip
    clock.now = 6.0  # the save's 5 s passed here, the evaluation's 60 s did not
    schedule.run({"loss": 0.5}, start=2)
    assert asked == [[(1, 2), (1, 3), (0, 2)]]
    assert ran == [("lines", None), ("signals", {"loss": 0.5, AGREED: 2}), ("eval", None)]
    alone = Schedule([Periodic("signals", ran.append, vote=lambda: (2, 3))], lambda: 3)
    alone.run({}, start=2)  # one process: no agreement, the entry reads its own state
    assert ran[-1] == {}


def test_first_loop_state_and_local_clock_rules_and_the_start_of_each_entry():
    ran, votes, clock, step, tripped = [], [], _Clock(), [4], [False]
    guard = Trigger(condition=lambda: tripped[0])
    schedule = Schedule(
        [
            Periodic(
                "lines", _recording(ran, "lines", step), local=True,
                when=Trigger(every_secs=5.0, first=True, clock=clock),
                at_start=lambda at: ran.append(("lines start", at)),
            ),
            Periodic("guard", _recording(ran, "guard", step), when=guard),
            Periodic("window", print, at_start=lambda at: ran.append(("window start", at))),
        ],
        current_step=lambda: step[0],
        agree=lambda asked: votes.append(asked) or [1] * len(asked),  # another worker's says yes
    )  # fmt: skip
    schedule.start(2)
    assert ran == [("lines start", 2), ("window start", 2)]
    ran.clear()
    schedule.run({}, start=2)  # the first loop: "lines" is due once, before it first fired
    step[0], clock.now = 6, 1.0
    schedule.run({}, start=4)  # neither the local clock (1 s) nor the guard's state
    tripped[0], step[0], clock.now = True, 8, 6.0
    schedule.run({}, start=6)  # 6 s on this clock; the guard tripped
    assert ran == [("lines", 4), ("lines", 8), ("guard", 8)]
    assert votes == []  # a local rule asks no other worker


def test_only_loop_ending_entries_cut_device_loops():
    schedule = Schedule(
        [
            Periodic("sevens", print, when=Trigger(every_steps=7), ends_loop=True),
            Periodic("threes", print, when=Trigger(every_steps=3)),
        ],
        current_step=lambda: 0,
    )
    assert [schedule.steps_until_due(s) for s in (0, 5, 7)] == [7, 2, 7]
    extra = Periodic("at_2", print, when=Trigger(at_steps=[2]), ends_loop=True)
    with schedule.including(extra):
        assert schedule.names[-1] == "at_2" and schedule.steps_until_due(0) == 2
    assert schedule.steps_until_due(0) == 7 and "at_2" not in schedule.names


class _Evaluator(orbit.AbstractEvaluator):
    def __init__(self, global_step, names):
        self.global_step, self.names, self.steps = global_step, names, []

    def evaluate(self, num_steps):
        self.steps.append(int(self.global_step.numpy()))
        self.names.append(list(self.controller.schedule.names))
        return {}


class _Loops(Controller):
    def _train_n_steps(self, num_steps, start=None):
        self.loops.append(num_steps)
        return super()._train_n_steps(num_steps, start)


def test_a_new_periodic_feature_is_one_entry_of_the_controllers_schedule():
    trainer, ran, names = StepTrainer(), [], []
    evaluator = _Evaluator(trainer.global_step, names)
    sevens = Periodic(
        "sevens",
        lambda output: ran.append(int(trainer.global_step.numpy())),
        when=Trigger(every_steps=7),
        ends_loop=True,
    )
    controller = _Loops(
        trainer=trainer, evaluator=evaluator, global_step=trainer.global_step,
        steps_per_loop=5, periodic=[sevens],
    )  # fmt: skip
    evaluator.controller, controller.loops = controller, []
    assert controller.schedule.names == ["sevens", "train_actions", "summaries", "checkpoint"]
    controller.train(20)
    assert controller.loops == [5, 2, 5, 2, 5, 1] and ran == [7, 14]
    controller.train_and_evaluate(30, eval_interval=12)
    assert evaluator.steps == [24, 30] and ran == [7, 14, 21, 28]
    assert controller.loops[6:] == [1, 3, 4, 2]
    assert names[0][-1] == "evaluation" and "evaluation" not in controller.schedule.names


@pytest.mark.slow
def test_a_runs_periodic_work_is_the_controllers_schedule(tmp_path, monkeypatch):
    built = []

    class Kept(Controller):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            built.append(self)

    monkeypatch.setattr("orbitask.trainers.run.runner.Controller", Kept)
    run_experiment(
        TinyTask(), str(tmp_path), mode="train", train_steps=4, steps_per_loop=2,
        progress=True, profile_steps=(2, 3), checkpoint_interval=2, nan_guard=NanGuard(),
    )  # fmt: skip
    names = built[0].schedule.names
    assert names == [
        "callbacks", "metrics_window", "results", "progress", "profiler", "nan_guard",
        "preemption", "model_dir",
        "train_actions", "summaries", "summary_writes", "checkpoint",
    ]  # fmt: skip
    assert not built[0].train_actions  # every action is an entry
    # Each periodic thing's rule is its entry's trigger; only the callbacks keep theirs, one
    # per callback (`CallbackAction`), and progress on a terminal shows every loop.
    whens = {e.name: e.when for e in built[0].schedule.entries}
    timed = {"metrics_window", "progress", "profiler", "nan_guard", "summary_writes", "checkpoint"}
    assert {name for name, when in whens.items() if isinstance(when, Trigger)} == timed
