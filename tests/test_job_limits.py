"""A job's limits on 2 workers under the local launcher (the real binary): `max_time`, and
SIGUSR1 among `stop_signals` sent to one worker (SLURM's `--signal=USR1@90`), each stop both
workers after the same device loop; they save that step once and exit 75, as does the launcher.
The in-process tests of both are in test_time_budget.py."""

import os
import re
import signal

import pytest

from tests import faults, launching

STEPS = 5000  # more than either limit lets the job train
MAX_TIME = "orbitask.run_experiment.max_time=10"
SIGNALS = "orbitask.run_experiment.stop_signals=['SIGTERM', 'SIGINT', 'SIGHUP', 'SIGUSR1']"


@pytest.mark.slow
@pytest.mark.parametrize("limit", ["max_time", "SIGUSR1"])
def test_a_limit_stops_both_workers_at_one_step_saved_once_with_75(tmp_path, limit):
    model = tmp_path / "model"
    flags = launching.train_flags(model, STEPS, [MAX_TIME if limit == "max_time" else SIGNALS])
    proc = launching.start(["--workers", "2"], flags, tmp_path)
    try:
        if limit == "SIGUSR1":
            worker = launching.pid_of(tmp_path, "worker 1", proc)
            faults.wait_for_checkpoint(model, proc, min_step=40)
            os.kill(worker, signal.SIGUSR1)
        proc.wait(timeout=240)
    finally:
        launching.stop(proc)
    text = launching.output(tmp_path)
    assert proc.returncode == 75, text[-3000:]
    reason = r"max_time \(0:00:10\) reached" if limit == "max_time" else "SIGUSR1 received"
    line = rf"^\[worker (\d)\] orbitask: preempted: {reason}: saved checkpoint (\S+) at step (\d+);"
    stopped = re.findall(line, text, re.M)
    assert sorted(w for w, _, _ in stopped) == ["0", "1"], text[-3000:]
    (_, path, step), (_, other, same) = stopped
    assert (path, step) == (other, same) == (f"{model}/ckpt-{step}", step)
    assert int(step) < STEPS and launching.latest_step(model) == int(step)
