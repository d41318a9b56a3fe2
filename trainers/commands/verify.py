"""`orbitask verify`: whether your experiment trains alike on one device and on N replicas.

    orbitask verify --gin_file=my_task.gin [--gin_params=...] [--replicas=2] [--steps=5]

Trains the experiment `--steps` steps on one device and on `--replicas` replicas (logical CPU
devices without GPUs) with the same global batch, seed 0, and the gradient accumulation the gin
files set, in temporary folders (nothing is written to any model directory of yours, and no
line names them). Then it compares each variable (its difference over how far training moved
it) and every log the step returns, by name, against tolerances measured on the run itself: a
third run on one device, its inputs one float step away, shows how far rounding grows
(`verify_compare`). Exit 0 when everything agrees; otherwise exit 1, the variables and logs that
differ, and the causes the differences fit; when the weights differ, a fourth run, one device
with its gradients times N, tells whether the loss is averaged per replica.
"""

from __future__ import annotations

import os
import sys
import tempfile

from absl import flags

from orbitask.trainers.commands import verify_compare as compare
from orbitask.trainers.commands import verify_runs as runs

FLAGS = flags.FlagValues()
flags.DEFINE_multi_string("gin_file", [], "Gin config file(s), in order.", flag_values=FLAGS)
flags.DEFINE_multi_string("gin_params", [], "Gin bindings.", flag_values=FLAGS)
flags.DEFINE_integer("replicas", 2, "Replicas of the second run.", lower_bound=2, flag_values=FLAGS)
flags.DEFINE_integer("steps", 5, "Steps each run trains.", lower_bound=2, flag_values=FLAGS)


def _runs(replicas: int, steps: int) -> tuple:
    """Trains one device, `replicas` replicas and one device on nudged inputs; when weights
    differ past their tolerance, also one device with its gradients times `replicas` (else, or
    when its optimizer cannot do that, None). Eager; returns `(one, many, tolerance, scaled)`."""
    with tempfile.TemporaryDirectory(prefix="orbitask-verify-") as folder:

        def run(name: str, count: int, variant: runs.Variant = runs.PLAIN) -> runs.Trained:
            return runs.train(count, steps, os.path.join(folder, name), variant)

        one, many = run("one", 1), run("many", replicas)
        tol = compare.tolerance(one, run("nudged", 1, runs.Variant(nudged=True)))
        scaled = None
        if compare.failing_variables(one, many, tol):
            try:
                scaled = run("scaled", 1, runs.Variant(gradient_factor=replicas))
            except Exception:  # noqa: BLE001 -- an optimizer that cannot scale: not measured
                scaled = None
    return one, many, tol, scaled


def _agree(one: runs.Trained, many: runs.Trained, tol: compare.Tolerance) -> bool:
    """Whether every variable and every log of the two runs agree within `tol`."""
    return not compare.failing_variables(one, many, tol) and not compare.failing_logs(
        one, many, tol
    )


def report(one, many, tol, scaled, replicas: int, steps: int) -> tuple[bool, list[str]]:
    """`(agree, lines)`: the comparison of one device's run with the N-replica run, each
    difference beside its tolerance, and when they differ, the variables and logs that differ
    most and the causes the differences fit."""
    rows = compare.variable_differences(one, many, tol)
    worst = rows[0] if rows else compare.VariableDifference("-", 0.0, 0.0)
    logs = compare.log_differences(one, many)
    lines = [
        f"{steps} steps on one device and on {replicas} replicas (same global batch, seed 0)",
        f"tolerance: {compare.FACTOR:g}x the differences one device's run shows when its "
        "inputs move by one float step (the rounding any other order of sums leaves)"
        + ("" if tol.measured else "; they move nothing (no floating tf.data input): the floors"),
        f"weights: largest difference {worst.relative:.2g} of training's change "
        f"({worst.name}); its tolerance {tol.variable(worst.name):.2g}",
        "logs (largest difference over the log's largest value; tolerance): "
        + (", ".join(f"{k} {v:.2g} ({tol.log(k):.2g})" for k, v in logs.items()) or "none"),
    ]
    if _agree(one, many, tol):
        return True, [*lines, f"OK: {replicas} replicas train as one device"]
    lines.append(
        "variables that differ most (difference over training's change; tolerance; largest |diff|):"
    )
    lines += [
        f"  {r.name}  {r.relative:.3g}  {tol.variable(r.name):.3g}  {r.largest:.3g}"
        for r in rows[:5]
    ]
    failing = compare.failing_logs(one, many, tol)
    if failing:
        lines.append(f"logs that differ: {', '.join(failing)}")
    causes = compare.likely_causes(one, many, scaled, tol, replicas)
    lines.append(f"FAILED: {replicas} replicas do not train as one device")
    lines += [f"likely cause: {c}" for c in causes] or [
        "no cause recognised: run a few steps with orbitask.run_experiment.run_eagerly = True "
        "and compare the step's values"
    ]
    return False, lines


def verify(replicas: int, steps: int) -> tuple[bool, str]:
    """Runs the trainings (gin already parsed) and returns `(agree, report)`. Eager."""
    one, many, tol, scaled = _runs(replicas, steps)
    agree, lines = report(one, many, tol, scaled, replicas, steps)
    return agree, "\n".join(lines)


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
