"""Evaluation schedules survive restarts: evaluations fall on the multiples of `eval_interval`
counted from step 0, an evaluation not recorded in a checkpoint runs again on resume, and a run
with `ValidationControl` killed between or during evaluations ends as an uninterrupted one."""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import orbit
import pytest
import tensorflow as tf

from orbitask import run_experiment
from orbitask.trainers.actions.evaluation_points import evaluation_entry
from orbitask.trainers.actions.triggers import Trigger
from orbitask.trainers.run.controller import Controller
from orbitask.trainers.run.entries import evaluation_trigger
from orbitask.trainers.run.settings import EvalSettings
from tests import faults
from tests.helpers import StepTrainer, TinyTask


def eval_points(step, train_steps, interval):
    """The steps after `step` and up to `train_steps` the `evaluation` entry is due at."""
    when = Trigger(every_steps=interval, at_steps=(train_steps,))
    return evaluation_entry(None, when, train_steps).when.due_steps(step + 1, train_steps)


def last_eval_point(step, train_steps, interval):
    """The last evaluation point at or before `step` (0: none) the entry gives its `at_start`."""
    points = []
    when = Trigger(every_steps=interval, at_steps=(train_steps,))
    entry = evaluation_entry(None, when, train_steps, lambda _, p: points.append(p))
    entry.at_start(step)
    return points[0]


class _Evaluator(orbit.AbstractEvaluator):
    """Records the global step of each evaluation."""

    def __init__(self, global_step):
        self.global_step = global_step
        self.steps = []

    def evaluate(self, num_steps):
        self.steps.append(int(self.global_step.numpy()))
        return {"step": self.steps[-1]}


def _controller(start, evaluated=None, eval_actions=()):
    trainer = StepTrainer()
    trainer.global_step.assign(start)
    evaluator = _Evaluator(trainer.global_step)
    controller = Controller(
        trainer=trainer, evaluator=evaluator, global_step=trainer.global_step,
        steps_per_loop=50, evaluated_step=evaluated, eval_actions=list(eval_actions),
    )  # fmt: skip
    return controller, evaluator


def test_a_run_resumed_at_350_evaluates_at_400_600_800():
    controller, evaluator = _controller(350)
    controller.train_and_evaluate(800, eval_interval=200)
    assert evaluator.steps == [400, 600, 800]  # Orbit: 550, 750, 800
    assert list(eval_points(350, 800, 200)) == [400, 600, 800]
    assert list(eval_points(0, 1000, 300)) == [300, 600, 900, 1000]
    assert list(eval_points(3, 5, None)) == [5]


def test_an_evaluation_the_checkpoint_did_not_record_runs_first():
    # Restored at step 400, the checkpoint recording the evaluation of step 200 only.
    evaluated = tf.Variable(200, dtype=tf.int64)
    # An eval action (which may save a checkpoint) sees its own evaluation recorded.
    recorded = []
    record = lambda logs: recorded.append(int(evaluated.numpy()))  # noqa: E731
    controller, evaluator = _controller(400, evaluated, [record])
    controller.train_and_evaluate(800, eval_interval=200)
    assert evaluator.steps == recorded == [400, 600, 800]
    # Recorded: nothing runs again.
    controller, evaluator = _controller(350, tf.Variable(200, dtype=tf.int64))
    controller.train_and_evaluate(800, eval_interval=200)
    assert evaluator.steps == [400, 600, 800]
    # The final evaluation too.
    controller, evaluator = _controller(800, tf.Variable(600, dtype=tf.int64))
    controller.train_and_evaluate(800, eval_interval=200)
    assert evaluator.steps == [800]
    assert last_eval_point(799, 800, 200) == 600 and last_eval_point(900, 800, 200) == 800


def test_without_a_record_the_schedule_starts_at_the_restored_step():
    # A fresh run, or a checkpoint written by --mode=train (no record: -1), resumed at 300.
    evaluated = tf.Variable(-1, dtype=tf.int64)
    controller, evaluator = _controller(300, evaluated)
    controller.train_and_evaluate(340, eval_interval=20)
    assert evaluator.steps == [320, 340]
    assert int(evaluated.numpy()) == 340


def test_the_last_checkpoint_records_the_last_evaluation(tmp_path):
    trainer, evaluated = StepTrainer(), tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(step=trainer.global_step, evaluated=evaluated)
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path), 5)
    controller = Controller(
        trainer=trainer, evaluator=_Evaluator(trainer.global_step),
        global_step=trainer.global_step, steps_per_loop=50, checkpoint_manager=manager,
        checkpoint_interval=200, evaluated_step=evaluated,
    )  # fmt: skip
    controller.train_and_evaluate(400, eval_interval=200)  # ckpt-400 is saved before its eval
    reader = tf.train.load_checkpoint(manager.latest_checkpoint)
    assert manager.latest_checkpoint.endswith("ckpt-400")
    assert reader.get_tensor("evaluated/.ATTRIBUTES/VARIABLE_VALUE") == 400


# A tiny deterministic run with validation control: its validation loss rises now and then
# (a large learning rate), so the rate is halved several times, the best checkpoint moves, and
# the run stops early (patience 2) before `train_steps`. `pause` stops the run for the test to
# kill it: after training step N ("train N") or inside the evaluation of step N ("eval N"),
# once (a marker file says it happened).
RUN = """
import os, sys, time
from orbitask.trainers import ValidationControl, run_experiment
from tests.helpers import TinyTask

model_dir, pause, marker = sys.argv[1], sys.argv[2], sys.argv[3]

def maybe_pause(where, step):
    if pause == f"{where} {step}" and not os.path.exists(marker):
        open(marker, "w").close()
        time.sleep(600)

class Task(TinyTask):
    def every_steps(self):
        return {1: lambda task, ctx: maybe_pause("train", ctx.step)}

    def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
        logs = super().reduce_aggregated_logs(aggregated_logs, global_step)
        maybe_pause("eval", int(global_step))
        return logs

logs = run_experiment(
    Task(), model_dir, mode="train_and_eval", train_steps=TRAIN_STEPS, global_batch_size=8,
    learning_rate=3.0, eval_interval=2, checkpoint_interval=1, progress=False, seed=7,
    validation_control=ValidationControl(metric="loss", early_stop_patience=2),
)
print("early_stop:", logs.get("early_stop"))
"""
TRAIN_STEPS = 30


def _command(model_dir, pause="none"):
    script = RUN.replace("TRAIN_STEPS", str(TRAIN_STEPS))
    return [sys.executable, "-c", script, str(model_dir), pause, str(model_dir) + ".paused"]


def _kill_at_pause(model_dir, pause, timeout=180):
    """Starts the run, SIGKILLs it once it paused at `pause`; returns the latest checkpoint."""
    proc = subprocess.Popen(
        _command(model_dir, pause), cwd=faults.REPO, env=faults.env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    marker = faults.Path(str(model_dir) + ".paused")
    deadline = time.monotonic() + timeout
    try:
        while not marker.exists():
            assert proc.poll() is None, f"ended before {pause!r}:\n{proc.stderr.read()[-3000:]}"
            assert time.monotonic() < deadline, f"no pause at {pause!r} in {timeout} s"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return tf.train.latest_checkpoint(str(model_dir))


def _run(model_dir):
    done = faults.run(_command(model_dir))
    assert done.returncode == 0, done.stderr[-3000:]
    stops = [x for x in done.stdout.splitlines() if x.startswith("early_stop:")]
    return stops[-1]


def _best(model_dir):
    """best/'s info.json and its checkpoint's state."""
    info = json.loads((model_dir / "best" / "info.json").read_text())
    return info, faults.final_state(model_dir / "best")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("eval_schedule") / "uninterrupted"
    stop = _run(model_dir)
    # The case the kills below must reproduce: halvings, a moved best, an early stop.
    assert stop.startswith("early_stop: early stop at step "), stop
    state = faults.final_state(model_dir)
    rate = "lr/.ATTRIBUTES/VARIABLE_VALUE"
    assert state[rate] < 3.0 / 4, state[rate]
    return model_dir, stop


def _assert_as_reference(reference, model_dir, stop):
    ref_dir, ref_stop = reference
    assert stop == ref_stop
    faults.assert_identical(faults.final_state(ref_dir), faults.final_state(model_dir))
    (info, best), (ref_info, ref_best) = _best(model_dir), _best(ref_dir)
    assert info == ref_info
    faults.assert_identical(ref_best, best)


@pytest.mark.slow
def test_killed_between_evaluations_resumes_on_the_same_schedule(reference, tmp_path):
    """Killed after step 20, before its save: resumed from step 19, it evaluates at 20, 22, ...
    (not 21, 23, ...)."""
    model_dir = tmp_path / "killed"
    latest = _kill_at_pause(model_dir, "train 20")
    assert latest.endswith("ckpt-19"), latest
    # What a kill between the best export and the checkpoint's save leaves: best/ written by
    # evaluations the checkpoint does not hold. Decisions follow the checkpoint.
    ref_info = (reference[0] / "best" / "info.json").read_text()
    (model_dir / "best" / "info.json").write_text(ref_info)
    _assert_as_reference(reference, model_dir, _run(model_dir))


@pytest.mark.slow
def test_killed_during_an_evaluation_evaluates_again_on_resume(reference, tmp_path):
    """Killed inside the evaluation of step 22, after the checkpoint of step 22 was saved."""
    model_dir = tmp_path / "killed"
    latest = _kill_at_pause(model_dir, "eval 22")
    assert latest.endswith("ckpt-22"), latest
    _assert_as_reference(reference, model_dir, _run(model_dir))


class _SlowTrainer(orbit.AbstractTrainer):
    """Each device loop takes `seconds` and adds its steps to the global step."""

    def __init__(self, seconds):
        self.global_step = orbit.utils.create_global_step()
        self.seconds = seconds

    def train(self, num_steps):
        time.sleep(self.seconds)
        self.global_step.assign_add(int(num_steps))


class _SlowEvaluator(_Evaluator):
    def evaluate(self, num_steps):
        time.sleep(0.5)
        return super().evaluate(num_steps)


@pytest.mark.parametrize(
    "eval_seconds, interval, expected",
    [
        (0.6, None, [100, 200, 300]),  # 2 loops of 0.4 s pass 0.6 s; evaluation time not counted
        (1000.0, None, [300]),  # the clock never says so: the end only
        (0.6, 150, [100, 150, 250, 300]),  # beside the step rule, each restarting the clock
    ],
)
def test_eval_seconds_evaluates_after_the_loop_that_passes_that_much_training(
    eval_seconds, interval, expected
):
    trainer = _SlowTrainer(0.4)
    evaluator = _SlowEvaluator(trainer.global_step)
    controller = Controller(
        trainer=trainer, evaluator=evaluator, global_step=trainer.global_step, steps_per_loop=50
    )
    controller.train_and_evaluate(300, eval_interval=interval, eval_seconds=eval_seconds)
    assert evaluator.steps == expected


def _evaluated_steps(model_dir) -> list[int]:
    """The steps of the eval loss summaries under `model_dir`/eval, in order."""
    steps = set()
    for path in glob.glob(os.path.join(model_dir, "eval", "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            if any(value.tag == "loss" for value in event.summary.value):
                steps.add(event.step)
    return sorted(steps)


def test_eval_seconds_reaches_the_controller_from_run_experiment(tmp_path):
    """Every device loop lasts more than a microsecond: an evaluation after each one."""
    run_experiment(
        TinyTask(), str(tmp_path), mode="train_and_eval", train_steps=6, global_batch_size=8,
        steps_per_loop=2, loop_seconds=None, eval_interval=None, eval_seconds=1e-6,
        strategy="one_device", progress=False,
    )  # fmt: skip
    assert _evaluated_steps(tmp_path) == [2, 4, 6]


def test_eval_at_steps_evaluates_at_those_steps_and_at_the_end(tmp_path):
    """eval_at_steps=[3, 7] with eval_interval None on a 10-step run: evaluations at 3 and 7,
    and at train_steps (the last step always evaluates); with an interval, at its multiples too."""
    run_experiment(
        TinyTask(), str(tmp_path), mode="train_and_eval", train_steps=10, global_batch_size=8,
        steps_per_loop=10, loop_seconds=None, eval_interval=None, eval_at_steps=[3, 7],
        eval_steps=1, checkpoint_seconds=None, strategy="one_device", progress=False,
    )  # fmt: skip
    assert _evaluated_steps(tmp_path) == [3, 7, 10]
    evaluation = EvalSettings(eval_interval=4, eval_at_steps=(3, 7))
    assert evaluation_trigger(10, evaluation).due_steps(1, 10) == [3, 4, 7, 8, 10]
