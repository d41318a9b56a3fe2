"""Small ports of public custom-training-loop examples to orbitask, each beside its original.

Each module holds `original()`, the example's own loop with only its sizes and data changed,
and an orbitask `Task` written from the README and docs. Both return a `Run`: the losses the
example logs at each step and the final weights. `tests/test_ports.py` compares them.

Shared here: the `Run` record, the callback that records each step's logs, and `train`, which
runs a port through `orbitask.run_experiment` as a user would.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

import orbitask

EXAMPLES = 100  # not a multiple of the batch: each epoch ends with a batch of 4
BATCH_SIZE = 32
EPOCHS = 2
STEPS = EPOCHS * -(-EXAMPLES // BATCH_SIZE)  # 8: four steps an epoch, the fourth partial
SEED = 0


@dataclasses.dataclass
class Run:
    """What a run logged and where it ended.

    Attributes:
      losses: `{name: [value at step 1, step 2, ...]}` as the example logs them.
      weights: the final weights of every model, in a fixed order.
    """

    losses: dict[str, list[float]]
    weights: list[np.ndarray]


class StepLogs:
    """An `every_steps` callback recording each step's scalar logs (eager, on the host)."""

    def __init__(self):
        self.steps: dict[int, dict[str, float]] = {}

    def __call__(self, task: Any, ctx: Any) -> None:
        del task
        self.steps[ctx.step] = {k: float(v) for k, v in ctx.logs.items() if np.ndim(v) == 0}

    def column(self, name: str) -> list[float]:
        return [self.steps[s][name] for s in sorted(self.steps)]


def weights_of(*models: Any) -> list[np.ndarray]:
    """Every weight (trainable or not) of `models`, as NumPy arrays, in order."""
    return [np.array(w) for model in models for w in model.get_weights()]


def train(task: Any, model_dir: str, replicas: int = 1) -> None:
    """Trains `task` for `STEPS` steps of `BATCH_SIZE` examples on 1 device or on `replicas` CPU
    replicas (`strategy="mirrored"`, `cpu_devices=replicas`). Eager; returns None."""
    distribution = (
        {"strategy": "mirrored", "cpu_devices": replicas}
        if replicas > 1
        else {"strategy": "one_device"}
    )
    orbitask.run_experiment(
        task,
        model_dir,
        mode="train",
        train_steps=STEPS,
        global_batch_size=BATCH_SIZE,
        progress=False,
        steps_per_loop=STEPS,  # one device loop: the recorder is deferred and ends none
        loop_seconds=None,
        **distribution,
    )
