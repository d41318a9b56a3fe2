"""The progress display: rate-limited lines in logs, one rewritten line on a terminal."""

import io
import sys

import pytest
import tensorflow as tf

from orbitask.trainers.actions.progress import ProgressAction
from orbitask.trainers.actions.schedule import Schedule


class Clock:
    """An injected clock: time moves only when the test says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def _progress(stream, total=100):
    step = tf.Variable(0, dtype=tf.int64)
    clock = Clock()
    action = ProgressAction(step, total, stream=stream, interval_s=10.0, clock=clock)
    _start(action, step)
    return action, step, clock


def _start(action, step):
    """What the Controller does before the first device loop: the schedule's start."""
    action.schedule = Schedule([action.entry()], current_step=lambda: int(step.numpy()))
    action.schedule.start(int(step.numpy()))


def _loop_end(action, step, clock, at_step, at_time, logs):
    """What the Controller does after a device loop: the step has moved, then the schedule runs
    the progress entry when its trigger is due."""
    start = int(step.numpy())
    step.assign(at_step)
    clock.now = at_time
    action.schedule.run(logs, start)


def test_log_stream_gets_rate_limited_lines_and_the_last_step():
    stream = io.StringIO()
    action, step, clock = _progress(stream)
    assert not action.tty
    _loop_end(action, step, clock, 10, 1.0, {"loss": 2.5})  # first loop: printed
    _loop_end(action, step, clock, 20, 2.0, {"loss": 2.0})  # 1 s later: skipped
    _loop_end(action, step, clock, 30, 11.0, {"loss": 1.5})  # 10 s later: printed
    _loop_end(action, step, clock, 40, 12.0, {})  # skipped
    _loop_end(action, step, clock, 100, 13.0, {"loss": 0.25})  # last step: always printed
    assert stream.getvalue().splitlines() == [
        "step 10/100 | 10.0 steps/s | ETA 0:00:09 | loss 2.5",
        "step 30/100 | 2.0 steps/s | ETA 0:00:35 | loss 1.5",  # rate from the first loop's end
        "step 100/100 | 7.5 steps/s | ETA 0:00:00 | loss 0.25",
    ]
    assert "\r" not in stream.getvalue()


def test_unknown_rate_and_missing_loss():
    action, step, clock = _progress(io.StringIO(), total=7200)
    assert action.line(0, {}) == "step 0/7200 | 0.0 steps/s | ETA ?"
    clock.now = 2.0
    assert action.line(4, {"loss": 1e-5}) == "step 4/7200 | 2.0 steps/s | ETA 0:59:58 | loss 1e-05"
    clock.now = 4.0
    assert action.line(4, {}).endswith("ETA 0:59:58")  # one figure a step: the first read's
    assert action.line(8, {}).endswith("ETA 0:59:56")


def test_resumed_run_measures_rate_from_the_restored_step():
    stream = io.StringIO()
    step = tf.Variable(50, dtype=tf.int64)
    clock = Clock()
    action = ProgressAction(step, 100, stream=stream, clock=clock)
    _start(action, step)
    _loop_end(action, step, clock, 60, 2.0, {"loss": 1.0})
    assert stream.getvalue() == "step 60/100 | 5.0 steps/s | ETA 0:00:08 | loss 1\n"


def test_terminal_gets_one_rewritten_line():
    stream = FakeTerminal()
    action, step, clock = _progress(stream)
    assert action.tty
    for i in range(1, 11):  # every loop updates, even 0.1 s apart
        _loop_end(action, step, clock, 10 * i, 0.1 * i, {"loss": 1.0 / i})
    text = stream.getvalue()
    assert text.count("\r") == 10
    assert text.endswith("\n") and text.count("\n") == 1  # a newline only after the last step
    updates = text.rstrip("\n").split("\r")[1:]
    assert [u.split(" | ")[0] for u in updates] == [f"step {10 * i}/100" for i in range(1, 11)]
    assert all(len(u) >= 79 for u in updates)  # padded: a shorter line hides a longer one
    assert updates[-1].rstrip() == "step 100/100 | 100.0 steps/s | ETA 0:00:00 | loss 0.1"


def test_prints_on_a_terminal_erase_the_progress_line_first(monkeypatch):
    terminal = FakeTerminal()
    monkeypatch.setattr("sys.stdout", terminal)
    step, clock = tf.Variable(0, dtype=tf.int64), Clock()
    action = ProgressAction(step, 20, interval_s=10.0, clock=clock)
    _start(action, step)
    with action.attached():
        _loop_end(action, step, clock, 10, 1.0, {"loss": 2.0})
        print("step 10: loss 2")  # what the seed's print_loss does between two device loops
        _loop_end(action, step, clock, 20, 2.0, {"loss": 1.0})
        print("done")
    text = terminal.getvalue()
    bar = "step 10/20 | 10.0 steps/s | ETA 0:00:01 | loss 2".ljust(79)
    assert text.startswith(f"\r{bar}\r\x1b[Kstep 10: loss 2\n\rstep 20/20 ")
    assert text.endswith("\ndone\n") and text.count("\x1b[K") == 1  # nothing left to erase
    assert sys.stdout is terminal  # restored on leaving


def test_stdout_is_restored_when_the_run_fails(monkeypatch):
    terminal = FakeTerminal()
    monkeypatch.setattr("sys.stdout", terminal)
    action = ProgressAction(tf.Variable(0, dtype=tf.int64), 20, clock=Clock())
    with pytest.raises(RuntimeError, match="user bug"), action.attached():
        assert sys.stdout is not terminal
        raise RuntimeError("user bug")
    assert sys.stdout is terminal
