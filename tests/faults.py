"""Helpers for fault-injection tests: run the real binary in a subprocess and kill it."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

REPO = Path(__file__).resolve().parents[1]


def command(model_dir, replicas=1, steps=600, extra=()):
    """The orbitask binary on the digits experiment, deterministic, shuffled, 2 checkpoints/s."""
    params = [
        f"TRAIN_STEPS={steps}",
        "orbitask.run_experiment.seed=7",
        "orbitask.run_experiment.steps_per_loop=10",
        "orbitask.run_experiment.checkpoint_interval=20",
        "orbitask.run_experiment.progress=False",
        "orbitask.DigitsClassification.hidden_units=(32,)",
    ]
    if replicas > 1:  # strategy 'auto' (the default) mirrors over the logical CPUs
        params += [f"orbitask.run_experiment.cpu_devices={replicas}"]
    cmd = [
        sys.executable,
        "-m",
        "orbitask.trainers.commands.train",
        "--gin_file=experiments/digits.gin",
        f"--model_dir={model_dir}",
        "--mode=train",
    ]
    return cmd + [f"--gin_params={p}" for p in [*params, *extra]]


def env():
    e = dict(os.environ)
    e.update(TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    return e


def run(cmd, timeout=300):
    return subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=timeout)


def start(cmd):
    return subprocess.Popen(
        cmd, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def wait_for_checkpoint(model_dir, proc, min_step=20, timeout=180):
    """Waits until a checkpoint at or past `min_step` exists (training is under way): on the
    file, up to `timeout` seconds in all."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        latest = tf.train.latest_checkpoint(str(model_dir))
        if latest and int(latest.rsplit("-", 1)[1]) >= min_step:
            return latest
        if proc.poll() is not None:
            output = proc.stdout.read() if proc.stdout else "(see the launcher's log)"
            raise AssertionError(f"run ended early (exit {proc.returncode}):\n{output}")
        time.sleep(0.02)
    raise AssertionError(f"no checkpoint at step >= {min_step} within {timeout} s")


def replicas_in(output: str) -> list[int]:
    """The replica counts in the runs' start lines (`orbitask: MirroredStrategy, 2 replicas
    (...)`, printed by the chief) found in `output`, in order."""
    return [int(n) for n in re.findall(r"orbitask: \w+Strategy, (\d+) replicas? \(", output)]


def kill_after_line(
    cmd, rng: random.Random, sig=signal.SIGKILL, steps=(30, 50, 70), timeout=180, line=None
):
    """Starts the run, waits for its `step N: loss` line (N drawn from `steps`: training is under
    way, past the first checkpoint at step 20) or for a line starting with `line`, sends `sig`
    and waits for the exit.

    Waits on the output, not on a clock: up to `timeout` seconds in all, for a slow machine.
    Returns `(proc, output)`, the output being everything the run printed.
    """
    target = line or f"step {rng.choice(steps)}: loss"
    proc = start(cmd)
    lines, seen = [], threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(target):
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    try:
        while not seen.wait(0.05):
            if not reader.is_alive() or time.monotonic() > deadline:
                raise AssertionError(
                    f"no line {target!r} (exit {proc.poll()}):\n{''.join(lines)[-3000:]}"
                )
        proc.send_signal(sig)
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=30)
    return proc, "".join(lines)


def final_state(model_dir) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
    out = {}
    for name, dtype in reader.get_variable_to_dtype_map().items():
        # save_counter counts saves (a SIGTERM adds one), not training state; the input
        # position's record (a string) follows from the step and the cluster's shape.
        bookkeeping = ("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter/.ATTRIBUTES/VARIABLE_VALUE")
        if dtype not in (tf.variant, tf.string) and name not in bookkeeping:
            out[name] = reader.get_tensor(name)
    return out


def assert_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys(), f"keys differ: {sorted(set(a) ^ set(b))}"
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
