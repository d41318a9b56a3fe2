"""How two of `orbitask verify`'s runs differ, how far rounding alone moves them apart, and the
cause their differences fit.

Weights are compared variable by variable, each difference over how far one device's training
moved the variable (from step 1 to the end); logs name by name, each difference over the log's
largest value. The tolerance is `FACTOR` times what moving the inputs by one float step does to
one device's run (`verify_runs.Variant(nudged=True)`), and at least the floors.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from orbitask.trainers.commands.verify_runs import Trained

FACTOR = 10.0  # rounding grows unevenly from run to run: ten times one measure of it
WEIGHTS_FLOOR = 1e-5  # of training's change
LOGS_FLOOR = 1e-5  # of the log's largest value
RATIO_RTOL = 1e-3  # a log's step-1 ratio that is N (or 1/N) up to rounding


@dataclasses.dataclass
class VariableDifference:
    """One variable's difference between two runs at the end: `relative`, its norm over the
    first run's change from step 1; `largest`, its largest entry."""

    name: str
    relative: float
    largest: float


@dataclasses.dataclass
class Tolerance:
    """The differences rounding alone explains: each variable's (as
    `VariableDifference.relative`) and each log's (as `log_differences`), by name."""

    weights: dict[str, float]
    logs: dict[str, float]
    measured: bool = True  # False: the nudged run equals one device's (no floating input)

    def variable(self, name: str) -> float:
        """The tolerance of the variable `name` (the floor for one the nudged run lacks)."""
        return self.weights.get(name, WEIGHTS_FLOOR)

    def log(self, name: str) -> float:
        """The tolerance of the log `name` (the floor for a log the nudged run lacks)."""
        return self.logs.get(name, LOGS_FLOOR)


def variable_differences(
    one: Trained, other: Trained, tol: Tolerance | None = None
) -> list[VariableDifference]:
    """Each variable both runs have (same name and shape), the largest difference first: the
    largest over its tolerance, given `tol`."""
    rows = []
    for name, value in one.last.items():
        theirs = other.last.get(name)
        if theirs is None or theirs.shape != value.shape:
            continue
        change = float(np.linalg.norm(value - one.first[name]))
        difference = float(np.linalg.norm(theirs - value))
        relative = difference / change if change > 0 else (0.0 if difference == 0 else np.inf)
        rows.append(VariableDifference(name, relative, float(np.max(np.abs(theirs - value)))))
    if tol is None:
        return sorted(rows, key=lambda r: -r.relative)
    return sorted(rows, key=lambda r: -r.relative / tol.variable(r.name))


def failing_variables(one: Trained, other: Trained, tol: Tolerance) -> list[VariableDifference]:
    """The variables whose difference exceeds their tolerance, the largest over it first."""
    return [r for r in variable_differences(one, other, tol) if r.relative > tol.variable(r.name)]


def log_differences(one: Trained, other: Trained, first_only: bool = False) -> dict[str, float]:
    """Each log both runs have: its largest difference over the steps both logged (only step
    1's when `first_only`), over the largest value the first run logged."""
    found = {}
    for name, values in one.logs.items():
        theirs = other.logs.get(name)
        steps = min(len(values), len(theirs or []), 1 if first_only else len(values))
        if not steps:
            continue
        a, b = np.array(values[:steps]), np.array(theirs[:steps])
        scale = float(np.nanmax(np.abs(np.array(values)))) or 1.0
        found[name] = float(np.nanmax(np.abs(b - a))) / scale if np.isfinite(a - b).all() else (
            0.0 if np.array_equal(a, b, equal_nan=True) else np.inf
        )  # fmt: skip
    return found


def tolerance(one: Trained, nudged: Trained) -> Tolerance:
    """What rounding explains: `FACTOR` times the nudged run's differences from one device's,
    at least the floors."""
    rows = variable_differences(one, nudged)
    weights = {r.name: max(FACTOR * r.relative, WEIGHTS_FLOOR) for r in rows}
    found = log_differences(one, nudged)
    logs = {k: max(FACTOR * v, LOGS_FLOOR) for k, v in found.items()}
    measured = any(r.relative > 0 for r in rows) or any(v > 0 for v in found.values())
    return Tolerance(weights, logs, measured)


def failing_logs(one: Trained, many: Trained, tol: Tolerance) -> dict[str, float]:
    """The logs whose difference exceeds their tolerance, by name, the largest first."""
    found = {k: v for k, v in log_differences(one, many).items() if v > tol.log(k)}
    return dict(sorted(found.items(), key=lambda kv: -kv[1]))


def _log_cause(name: str, one: Trained, many: Trained, replicas: int) -> str | None:
    """The cause of the log `name`'s difference when its step-1 value (same weights on both
    runs) is N or 1/N times one device's; else None."""
    a, b = one.logs[name][0], many.logs[name][0]
    if not a or not np.isfinite(a) or not np.isfinite(b):
        return None
    ratio = b / a
    if abs(ratio * replicas - 1) <= RATIO_RTOL:
        return (
            f"`{name}` is 1/{replicas} of one device's from step 1: each replica's value is "
            "already a share of the global batch's mean (a Keras 3 loss object's result, "
            "tf.nn.compute_average_loss) and the replicas' values are averaged; declare "
            f"Task.replica_logs = {{'{name}': 'sum'}}"
        )
    if abs(ratio / replicas - 1) <= RATIO_RTOL:
        return (
            f"`{name}` is {replicas}x one device's from step 1: the replicas' values are summed "
            f"while each is its own batch's mean; declare Task.replica_logs = {{'{name}': 'mean'}}"
        )
    return None


def _update_cause(many: Trained, scaled: Trained, tol: Tolerance, n: int) -> str:
    """The cause of the weights' difference when the N-replica run moves as one device with its
    gradients times N (`scaled`) does; else ""."""
    if not failing_variables(scaled, many, tol):
        return (
            f"each variable moves as on one device with its gradients times {n}: the loss is its "
            f"replica's mean (a plain tf.reduce_mean) and the optimizer sums the {n} replicas' "
            "gradients; sum the per-example losses and divide by global_batch_size "
            "(tf.nn.compute_average_loss), or use a Keras 3 loss object, which divides by the "
            "replicas itself"
        )
    return ""


def likely_causes(
    one: Trained, many: Trained, scaled: Trained | None, tol: Tolerance, replicas: int
) -> list[str]:
    """The causes the differences between one device's run and the N-replica run fit: logs off
    by N at step 1, a loss averaged per replica (`scaled`: one device's run with its gradients
    times N, or None when not measured), what the model computes differently on each replica,
    a loss whose terms are scaled unlike each other; empty when none fits."""
    by_log = {k: _log_cause(k, one, many, replicas) for k in failing_logs(one, many, tol)}
    causes = [c for c in by_log.values() if c]
    weights_differ = bool(failing_variables(one, many, tol))
    update = _update_cause(many, scaled, tol, replicas) if scaled and weights_differ else ""
    if update:
        return [*causes, update]
    first_step = log_differences(one, many, first_only=True)
    forward = [k for k, v in first_step.items() if v > tol.log(k) and not by_log.get(k)]
    if not forward:
        return causes
    shown = ", ".join(f"`{k}`" for k in forward) + (" differs" if len(forward) == 1 else " differ")
    if one.unsynchronized_norms:
        causes.append(
            f"per-replica batch statistics: {shown} at step 1 and the model's "
            f"{', '.join(one.unsynchronized_norms)} normalises each replica's own share of the "
            "batch; BatchNormalization(synchronized=True) normalises over all replicas"
        )
    if one.random_layers:
        causes.append(
            f"random layers ({', '.join(one.random_layers)}) draw their own masks or noise on "
            f"each replica: {shown} at step 1"
        )
    if weights_differ and not one.unsynchronized_norms and not one.random_layers:
        causes.append(
            f"{shown} at step 1, where both runs have the same weights and the model "
            "nothing that differs per replica: the loss adds terms scaled unlike each other on "
            f"replicas, a Keras 3 loss object's result (divided by the {replicas} replicas) and "
            "a plain tf.reduce_mean (not divided), so the optimizer's sum over replicas weighs "
            f"the plain mean {replicas}x; sum each term's per-example values and divide by "
            "global_batch_size"
        )
    return causes
