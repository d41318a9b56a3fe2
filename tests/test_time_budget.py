"""A job's limits in-process: `max_time` stops a training run at the last device loop that fits,
saves it and raises `Preempted` (exit 75), and the same call goes on for another `max_time`;
`stop_signals` adds SIGUSR1 (SLURM's early signal); `requeue` runs `scontrol requeue` after the
save (a stand-in `scontrol` on PATH). The 2-worker runs are in test_job_limits.py."""

import os
import signal
import stat
import time

import pytest
import tensorflow as tf

from orbitask.trainers import Preempted, run_experiment
from orbitask.trainers.actions import preemption
from orbitask.trainers.actions.time_budget import TimeBudget, seconds_of
from orbitask.trainers.commands.exits import EXIT_PREEMPTED, exit_status
from tests.helpers import TinyTask


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_budget_stops_when_one_more_loop_and_a_save_no_longer_fit():
    """After each loop: go on while elapsed + 2 x the longest span between loops' ends fits."""
    clock = FakeClock()
    budget = TimeBudget(60.0, clock)
    clock.now += 20  # building the model: not a span
    budget.training_starts(0)
    spans, spent = [5, 3, 4, 10, 2, 1], []
    for span in spans:
        clock.now += span
        spent.append(budget.spent())
    # elapsed 25, 28, 32, 42, 44, 45; longest 5, 5, 5, 10, 10, 10
    assert spent == [False, False, False, True, True, True]
    assert budget.longest == 10


def test_max_time_is_seconds_or_hh_mm_ss():
    """(A wrong value is one line: test_bad_input.py.)"""
    assert seconds_of("01:30:00") == 5400 and seconds_of("0:00:02.5") == 2.5
    assert seconds_of(90) == 90.0 and seconds_of(None) is None


def test_the_codes_put_max_time_lowest_and_sigint_highest():
    """Every worker decodes the agreement alike; the largest wins: Ctrl-C anywhere is 130."""
    names = ["SIGINT", "SIGUSR1", "SIGTERM", "SIGHUP"]
    codes = preemption.codes_of(preemption.stop_signals(names))
    assert codes == (None, "max_time", signal.SIGHUP, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)


class WaitsAt(TinyTask):
    """TinyTask whose callbacks at steps 3 and 6 wait until `self.until` (a monotonic time)."""

    until = 0.0

    def at_step(self):
        wait = lambda task, ctx: time.sleep(max(0.0, task.until - time.monotonic()))  # noqa: E731
        return {3: wait, 6: wait}


def _train(task, model_dir, **kwargs):
    return run_experiment(
        task, str(model_dir), mode="train", train_steps=20, global_batch_size=8,
        steps_per_loop=1, loop_seconds=None, progress=False, **kwargs,
    )  # fmt: skip


def _step_of(path) -> int:
    return int(tf.train.load_checkpoint(path).get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE"))


def test_max_time_saves_the_last_loop_that_fits_and_the_same_call_goes_on(tmp_path):
    """max_time 3 s: a callback at step 3 waits until 3 s after the call, so the run stops at
    step 3 at the latest (earlier on a slow start), saves it and raises `Preempted` (exit 75);
    the same call resumes there and stops again, later, within its own 3 s."""
    task, previous = WaitsAt(), signal.getsignal(signal.SIGTERM)
    stops = []
    for _ in range(2):
        task.until = time.monotonic() + 3.1
        with pytest.raises(Preempted, match=r"max_time \(0:00:03\) reached: saved checkpoint") as e:
            _train(task, tmp_path, max_time="00:00:03")
        assert exit_status(e.value) == EXIT_PREEMPTED
        latest = tf.train.latest_checkpoint(str(tmp_path))
        assert f"saved checkpoint {latest} at step {_step_of(latest)};" in str(e.value)
        stops.append(_step_of(latest))
        assert signal.getsignal(signal.SIGTERM) == previous  # a budget is not a signal
    assert 1 <= stops[0] <= 3 and stops[0] < stops[1] <= 6, stops


def _stand_in_scontrol(folder, model_dir):
    """An `scontrol` that records its arguments and the newest checkpoint when it ran."""
    folder.mkdir()
    script = folder / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" > {folder}/called\n'
        f"head -1 {model_dir}/checkpoint >> {folder}/called\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_sigusr1_as_a_stop_signal_saves_then_requeues_the_slurm_job(tmp_path, monkeypatch):
    """With 'SIGUSR1' among `stop_signals`, SIGUSR1 at step 7 saves ckpt-7 and raises
    `Preempted`; with `requeue`, the stand-in `scontrol requeue 4242` runs after that save."""
    bin_dir, model_dir = tmp_path / "bin", tmp_path / "model"
    _stand_in_scontrol(bin_dir, model_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.delenv("SLURM_PROCID", raising=False)

    class Usr1At7(TinyTask):
        def at_step(self):
            return {7: lambda task, ctx: signal.raise_signal(signal.SIGUSR1)}

    previous = signal.getsignal(signal.SIGUSR1)
    signals = ["SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1"]
    try:
        with pytest.raises(Preempted, match=r"SIGUSR1 received: saved checkpoint .*ckpt-7 at") as e:
            _train(Usr1At7(), model_dir, stop_signals=signals, requeue=True)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    line = str(e.value).splitlines()[0]
    assert line.endswith("SLURM job 4242 requeued (`scontrol requeue 4242`)."), line
    called = (bin_dir / "called").read_text().splitlines()
    assert called == ["requeue 4242", 'model_checkpoint_path: "ckpt-7"']  # after the save
