"""Helpers for fault-injection tests: run the real binary in a subprocess and kill it."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
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
    if replicas > 1:
        params += [
            "orbitask.run_experiment.strategy='mirrored'",
            f"orbitask.run_experiment.cpu_devices={replicas}",
        ]
    cmd = [
        sys.executable,
        "-m",
        "orbitask.trainers.train",
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


def wait_for_checkpoint(model_dir, proc, min_step=20, timeout=120):
    """Waits until a checkpoint at or past `min_step` exists (training is under way)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        latest = tf.train.latest_checkpoint(str(model_dir))
        if latest and int(latest.rsplit("-", 1)[1]) >= min_step:
            return latest
        if proc.poll() is not None:
            raise AssertionError(f"run ended early:\n{proc.stdout.read()}")
        time.sleep(0.02)
    raise AssertionError("no checkpoint appeared")


def kill_at_random(cmd, model_dir, rng: random.Random, sig=signal.SIGKILL, max_delay=0.5):
    """Starts the run, waits for training, sleeps a random time, sends `sig`; returns the proc."""
    proc = start(cmd)
    wait_for_checkpoint(model_dir, proc)
    time.sleep(rng.uniform(0.0, max_delay))
    proc.send_signal(sig)
    proc.wait(timeout=120)
    return proc


def final_state(model_dir) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
    out = {}
    for name, dtype in reader.get_variable_to_dtype_map().items():
        # save_counter counts saves (a SIGTERM adds one), not training state.
        bookkeeping = ("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter/.ATTRIBUTES/VARIABLE_VALUE")
        if dtype != tf.variant and name not in bookkeeping:
            out[name] = reader.get_tensor(name)
    return out


def assert_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys(), f"keys differ: {sorted(set(a) ^ set(b))}"
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
