"""The lines a run prints on stdout, each prefixed `orbitask:`: what it runs on, how many steps
it trains, its evaluations, its early stop and where its results are."""

from __future__ import annotations

from typing import Any

from orbitask.trainers.distribution import cluster
from orbitask.trainers.run import numeric_defaults


def say(text: str) -> None:
    """Prints `orbitask: <text>` and flushes stdout. Eager; returns None."""
    print(f"orbitask: {text}", flush=True)


def run_start(strategy: Any, task: Any, settings: Any, training: bool) -> None:
    """Says the strategy, and for a training run the numeric defaults' notice if any and, without
    a seed, what a resume then reproduces. Eager; returns None."""
    say(cluster.describe(strategy))
    if not training:
        return
    notice = numeric_defaults.line(task, settings.features.nan_guard)
    if notice:
        print(notice, flush=True)
    if settings.loop.seed is None:
        say(
            "no seed: a resumed run equals an uninterrupted one up to float rounding, as "
            "TensorFlow's ops may sum in another order; orbitask.run_experiment.seed = 0 makes "
            "it bit-identical (it turns on op determinism)"
        )


def layer_draws(layers: list[str]) -> None:
    """Says which tf_keras layers draw from saved generators, and how to draw as tf_keras does.
    Eager; returns None."""
    shown = ", ".join(layers[:4]) + (f" and {len(layers) - 4} more" if len(layers) > 4 else "")
    say(
        f"{len(layers)} tf_keras layer(s) draw their masks from generators the checkpoint saves "
        f"({shown}), so a resumed run draws as the uninterrupted one; tf_keras elsewhere (Model "
        "Garden's train_lib) draws others, unsaved: orbitask.Task.save_layer_draws = False "
        "draws as it does"
    )


def epochs(epochs: int, steps_per_epoch: float, steps: int) -> None:
    """Says the train steps `epochs` epochs of `steps_per_epoch` steps come to. Eager."""
    say(f"{epochs} epoch(s) = {steps} train steps ({float(steps_per_epoch):.4g} steps per epoch)")


def eval_line(step: int, logs: dict) -> str | None:
    """The report line of an evaluation at `step` (its scalar logs), or None without any."""
    scalars = {k: v for k, v in logs.items() if isinstance(v, (int, float))}
    if not scalars:
        return None
    text = ", ".join(f"{k} {v:.4g}" for k, v in sorted(scalars.items()))
    return f"eval at step {step}: {text}"


def run_end(folder: str, training: bool, logdir: str | None = None) -> None:
    """Says where the checkpoints (`training`) or the evaluation's summaries are (each
    evaluation said its line), and TensorBoard's folder (`logdir`; None: `folder`). Eager;
    returns None."""
    written = "checkpoints" if training else "eval summaries"
    say(f"{written} in {folder}; TensorBoard: --logdir {logdir or folder}")
