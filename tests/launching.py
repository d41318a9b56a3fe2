"""Helpers for multi-process tests: run the local launcher on the digits experiment.

Every process runs on the CPU (CUDA_VISIBLE_DEVICES=''), quietly, with its temporary folder under
the test's tmp_path (so a test can see that non-chief workers cleaned up after themselves). The
launcher starts in its own session, so `stop` kills it and every process it started.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import tensorflow as tf

from tests import faults

REPO = Path(__file__).resolve().parents[1]
# Run as a script, the launcher imports no TensorFlow (`python -m orbitask.trainers.commands.launch`
# imports the package, hence TensorFlow: seconds of CPU per job on a 2-core machine).
LAUNCHER = REPO / "trainers" / "commands" / "launch.py"


def train_flags(model_dir, steps, extra=(), mode="train") -> list[str]:
    """The binary's flags: digits, seed 7, loops of 10 steps, a checkpoint every 20 steps."""
    return [*faults.command(model_dir, steps=steps, extra=extra)[3:], f"--mode={mode}"]


def env(tmp) -> dict:
    e = faults.env()
    tmp = Path(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    e.update(TMPDIR=str(tmp), PYTHONPATH=str(REPO))
    return e


def start(launch_args, flags, tmp) -> subprocess.Popen:
    """Starts the launcher; its output (all processes, prefixed) is written to tmp/launch.log."""
    Path(tmp).mkdir(parents=True, exist_ok=True)
    log = open(Path(tmp) / "launch.log", "w")  # noqa: SIM115 -- closed with the process
    return subprocess.Popen(
        [sys.executable, str(LAUNCHER), *launch_args, "--", *flags],
        cwd=REPO,
        env=env(Path(tmp) / "tmp"),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def output(tmp) -> str:
    return (Path(tmp) / "launch.log").read_text(errors="replace")


def stop(proc: subprocess.Popen) -> None:
    """Kills the launcher and every process it started (its whole session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def stop_with(proc: subprocess.Popen, pid: int, tmp, sig=signal.SIGTERM) -> str:
    """Sends `sig` to `pid` (the launcher's or a worker's; minus the launcher's: its process
    group, as a terminal's Ctrl-C), waits for the job to end (then kills what is left); returns
    its output."""
    try:
        os.kill(pid, sig)
        proc.wait(timeout=120)
    finally:
        stop(proc)
    return output(tmp)


def preempted(text: str, rest: str, how: str = "preempted: SIGTERM") -> list:
    """The groups of each `[worker N] orbitask: <how> received: <rest>` line of `text` (`rest`
    a regular expression), the worker's number first."""
    line = rf"^\[worker (\d)\] orbitask: {how} received: {rest}"
    return re.findall(line, text, re.M)


def run(launch_args, flags, tmp, timeout=240) -> tuple[int, str]:
    """Runs a job to the end (bounded); returns (exit status, output)."""
    proc = start(launch_args, flags, tmp)
    try:
        proc.wait(timeout=timeout)
    finally:
        stop(proc)
    return proc.returncode, output(tmp)


def pid_of(tmp, role: str, proc, timeout=120) -> int:
    """The pid the launcher reported for `role` ("worker 1"), waiting for its start line."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = re.findall(rf"started {role} \(pid (\d+)\)", output(tmp))
        if found:
            return int(found[-1])
        if proc.poll() is not None:
            raise AssertionError(f"launcher ended early:\n{output(tmp)[-3000:]}")
        time.sleep(0.05)
    raise AssertionError(f"{role} never started")


def latest_step(model_dir) -> int | None:
    latest = tf.train.latest_checkpoint(str(model_dir))
    return int(latest.rsplit("-", 1)[1]) if latest else None


def eval_scalars(model_dir, tag) -> dict[int, float]:
    """`{step: value}` of one scalar in the eval summaries (the chief writes them)."""
    out = {}
    for path in tf.io.gfile.glob(os.path.join(model_dir, "eval", "events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
            event = tf.compat.v1.Event.FromString(record)
            for value in event.summary.value:
                if value.tag == tag:
                    out[event.step] = float(tf.make_ndarray(value.tensor))
    return out


def listening(pid: int | str) -> set[int]:
    """The TCP ports in LISTEN state in the network namespace of process `pid` ("self")."""
    ports = set()
    for name in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{name}") as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == "0A":
                    ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports
