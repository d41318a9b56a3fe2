"""`orbitask verify`: whether your experiment trains alike on one device and on N replicas.

    orbitask verify --gin_file=my_task.gin [--gin_params=...] [--replicas=2] [--steps=5]

Trains the experiment `--steps` steps on one device and on `--replicas` replicas (logical CPU
devices without GPUs) with the same global batch, seed 0, and the gradient accumulation the gin
files set, in temporary folders (nothing is written to any model directory of yours). Then it
compares the weights (each variable's difference over how far training moved it) and the logged
losses. Exit 0 when they agree within float rounding; otherwise exit 1, the variables that
differ most, and the likely cause.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import tempfile

import numpy as np
from absl import flags

FLAGS = flags.FlagValues()
flags.DEFINE_multi_string("gin_file", [], "Gin config file(s), in order.", flag_values=FLAGS)
flags.DEFINE_multi_string("gin_params", [], "Gin bindings.", flag_values=FLAGS)
flags.DEFINE_integer("replicas", 2, "Replicas of the second run.", lower_bound=2, flag_values=FLAGS)
flags.DEFINE_integer("steps", 5, "Steps each run trains.", lower_bound=2, flag_values=FLAGS)

WEIGHTS_RTOL = 1e-3  # a variable's difference over its change in training
LOSS_RTOL = 1e-4


@dataclasses.dataclass
class Trained:
    """What one run of `verify` left: its weights at step 1 and at the end, and its losses."""

    first: dict[str, np.ndarray]
    last: dict[str, np.ndarray]
    losses: list[float]


def train(replicas: int, steps: int, folder: str) -> Trained:
    """Trains the gin-bound experiment `steps` steps on `replicas` replicas into `folder`.
    Eager; returns its weights and losses."""
    from orbitask.trainers.commands.train import build_task
    from orbitask.trainers.run.experiment import run_experiment
    from orbitask.trainers.run.saved_model import restored_model
    from orbitask.trainers.state import metrics_file

    one = replicas == 1
    run_experiment(
        task=build_task(), model_dir=folder, mode="train", train_steps=steps, seed=0,
        strategy="one_device" if one else "mirrored", cpu_devices=None if one else replicas,
        steps_per_loop=1, loop_seconds=None, checkpoint_interval=1, checkpoint_seconds=None,
        max_to_keep=None, progress=False, export_at_end=False, loggers=("tensorboard", "jsonl"),
    )  # fmt: skip

    def weights(step: int) -> dict[str, np.ndarray]:
        path = os.path.join(folder, f"ckpt-{step}")
        model, _ = restored_model(build_task(), path, False, None, 1)
        models = model.items() if isinstance(model, dict) else [("", model)]
        found = [(f"{key}{getattr(v, 'path', None) or v.name}", v.numpy())
                 for key, one in models for v in one.trainable_weights]  # fmt: skip
        # Each build numbers its layers anew (dense_3, ...): a variable is its place and name.
        return {f"{i}:{re.sub(r'_[0-9]+(?=/|:|$)', '', n)}": v for i, (n, v) in enumerate(found)}

    rows = metrics_file.read(os.path.join(folder, metrics_file.NAME))
    losses = [float(r["loss"]) for r in rows if r["split"] == "train" and "loss" in r]
    return Trained(weights(1), weights(steps), losses)


def compare(one: Trained, many: Trained) -> list[tuple[str, float, float, float]]:
    """Each variable's `(name, difference over training's change, largest difference, ratio of
    the two runs' changes)`, the largest difference first."""
    rows = []
    for name, value in one.last.items():
        change = np.linalg.norm(value - one.first[name])
        other = many.last.get(name)
        if other is None or other.shape != value.shape:
            continue
        scale = change if change > 0 else 1.0
        moved = np.linalg.norm(other - many.first[name])
        ratio = float(moved / change) if change > 0 else 1.0
        diff = np.abs(other - value)
        rows.append((name, float(np.linalg.norm(other - value) / scale), float(diff.max()), ratio))
    return sorted(rows, key=lambda r: -r[1])


def likely_cause(rows: list, losses: tuple[list, list], replicas: int, model_text: str) -> str:
    """Names the likeliest reason N replicas train differently from one device."""
    ratios = [r[3] for r in rows if r[1] > WEIGHTS_RTOL]
    one, many = (np.array(x[: min(map(len, losses))]) for x in losses)
    loss_ratio = float(np.median(many / one)) if len(one) and np.all(one != 0) else 1.0
    if ratios and abs(np.median(ratios) - replicas) < 0.3 * replicas:
        return (
            f"each variable moves about {replicas}x as far on {replicas} replicas: the loss is "
            "averaged per replica while the optimizer sums the gradients over replicas; divide "
            "the summed per-example losses by the global batch (tf.nn.compute_average_loss), or "
            "return per-example losses to the default step"
        )
    if abs(loss_ratio - replicas) < 0.1 * replicas or abs(loss_ratio - 1 / replicas) < 0.1:
        return (
            f"the logged loss is {loss_ratio:.3g}x one device's: each replica's loss is a share "
            "of the global mean, but the logs add or average them as if it were not "
            "(Task.replica_logs)"
        )
    if "BatchNormalization" in model_text:
        return (
            "per-replica batch statistics (BatchNorm): each replica normalises its own share of "
            "the batch, one device the whole batch; keras.layers.BatchNormalization("
            "synchronized=True) normalises over all replicas"
        )
    if "Dropout" in model_text or "Noise" in model_text:
        return "random layers (Dropout, noise) draw their own masks on each replica"
    return "not recognised: run a few steps with orbitask.run_experiment.run_eagerly = True"


def verify(replicas: int, steps: int) -> tuple[bool, str]:
    """Runs both trainings (gin already parsed) and returns `(agree, report)`. Eager."""
    with tempfile.TemporaryDirectory(prefix="orbitask-verify-") as folder:
        one = train(1, steps, os.path.join(folder, "one"))
        many = train(replicas, steps, os.path.join(folder, "many"))
        with open(os.path.join(folder, "one", "model_summary.txt"), encoding="utf-8") as f:
            model_text = f.read()
    rows = compare(one, many)
    pairs = list(zip(one.losses, many.losses, strict=False))  # as many as both logged
    loss_diff = max((abs(b - a) / max(abs(a), 1e-12) for a, b in pairs), default=0.0)
    worst = rows[0] if rows else ("-", 0.0, 0.0, 1.0)
    agree = worst[1] <= WEIGHTS_RTOL and loss_diff <= LOSS_RTOL
    head = f"{steps} steps on one device and on {replicas} replicas (same global batch, seed 0)"
    lines = [
        f"weights: largest difference {worst[1]:.2g} of training's change ({worst[0]}); losses: "
        f"largest relative difference {loss_diff:.2g}"
    ]
    if agree:
        return True, "\n".join([head, *lines, f"OK: {replicas} replicas train as one device"])
    lines.append("variables that differ most (difference over training's change, largest |diff|):")
    lines += [f"  {name}  {rel:.3g}  {top:.3g}" for name, rel, top, _ in rows[:5]]
    cause = likely_cause(rows, (one.losses, many.losses), replicas, model_text)
    lines.append(f"FAILED: {replicas} replicas do not train as one device; likely cause: {cause}")
    return False, "\n".join([head, *lines])


def main(argv: list[str]) -> int:
    """`orbitask verify` on `argv` (flags only): 0 when the runs agree, 1 when not, 2 for a
    mistake in the flags or gin files. Eager."""
    from orbitask.trainers.commands.exits import fail, run_reported

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    FLAGS.unparse_flags()
    if {"-h", "--help", "--helpfull"} & set(argv):
        print(f"usage: orbitask verify --gin_file=... [FLAGS]\n\n{FLAGS.get_help().strip()}")
        return 0
    try:
        FLAGS(["orbitask verify", *argv])
    except flags.Error as e:
        return fail(f"{e}. See `orbitask verify --help`.")
    if not FLAGS.gin_file:
        return fail("--gin_file is required: the experiment to verify.")
    from orbitask.trainers.distribution.strategies import logical_cpus

    logical_cpus(FLAGS.replicas)  # before TensorFlow starts: the replicas of the second run
    from orbitask.trainers.commands.train import parse_gin

    result: list[bool] = []

    def work() -> None:
        parse_gin(FLAGS.gin_file, FLAGS.gin_params)
        agree, text = verify(FLAGS.replicas, FLAGS.steps)
        print("\n".join(f"orbitask verify: {line}" for line in text.splitlines()), flush=True)
        result.append(agree)

    status = run_reported(work)
    return status if status or not result else (0 if result[0] else 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
