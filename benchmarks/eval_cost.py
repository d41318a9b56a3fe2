"""The cost of one evaluation step: orbitask against Keras 3 `evaluate`, in one process.

    .venv/bin/python benchmarks/eval_cost.py [--workloads mlp cnn] [--rounds 5] [--quick]

For each workload, one process builds an orbitask run of `benchmarks.bench_task.BenchTask`
(every default, `train_and_eval`; and the same with a Python-side `aggregate_logs`, whose steps
run in device loops that hand the host every step's outputs) and the same Keras 3 model compiled
with `steps_per_execution` 1 and 50 (loss only, as the task has no metrics). Each round
evaluates every contender for `--short` and `--long` steps, in a shuffled order; a contender's
cost per step is `(time(long) - time(short)) / (long - short)`, which leaves out what an
evaluation costs once (iterator creation, the first call). The figures are medians over rounds,
and orbitask's ratio to Keras at its best `steps_per_execution` is the median of the per-round
ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build_orbitask(workload, model_dir: str, own_aggregate: bool = False):
    """A default orbitask `train_and_eval` run of `workload`, trained 2 steps; returns its
    trainer (which is also its evaluator). With `own_aggregate`, the task folds the logs in with
    a Python-side `aggregate_logs` (the default's arithmetic, on the host). Eager."""
    import gin

    import orbitask.trainers.run.experiment
    import orbitask.trainers.run.runner
    from benchmarks.bench_task import BenchTask
    from orbitask.tasks import eval_logs
    from orbitask.trainers.commands.train import parse_gin

    class OwnAggregate(BenchTask):
        def aggregate_logs(self, state, step_logs):
            return eval_logs.aggregate(state, step_logs)

    built = []

    class Recorded(orbitask.trainers.run.runner.Controller):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            built.append(self)

    parse_gin(
        [os.path.join(os.path.dirname(__file__), "..", "configs", "defaults.gin")],
        [
            "TRAIN_STEPS = 2",
            f"orbitask.run_experiment.global_batch_size = {workload.global_batch}",
            "orbitask.run_experiment.eval_steps = 2",
            "orbitask.run_experiment.progress = False",
        ],
    )
    original, orbitask.trainers.run.runner.Controller = (
        orbitask.trainers.run.runner.Controller,
        Recorded,
    )
    try:
        task = (OwnAggregate if own_aggregate else BenchTask)(
            workload.name, lambda: None, [], callbacks=False
        )
        orbitask.trainers.run.experiment.run_experiment(
            task=task, model_dir=model_dir, mode="train_and_eval"
        )
    finally:
        orbitask.trainers.run.runner.Controller = original
        gin.clear_config()
    return built[0].trainer


def build_keras(workload, steps_per_execution: int):
    """The workload's Keras 3 model compiled for evaluation; returns `evaluate(steps)`. Eager."""
    import keras

    from benchmarks import workloads

    model = workloads.build_model(workload.name)
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=steps_per_execution,
        jit_compile=False,
    )
    data = workloads.dataset(workload.name, workload.global_batch)

    def evaluate(steps: int) -> None:
        model.evaluate(data, steps=steps, verbose=0)

    return evaluate


def measure(contenders: dict, short: int, long: int, rounds: int) -> dict[str, list[float]]:
    """Seconds per evaluation step of each contender, one value per round."""
    for evaluate in contenders.values():  # warm-up: traces and first iterators
        evaluate(short)
        evaluate(long)
    costs: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(rounds):
        order = list(contenders)
        random.Random(r).shuffle(order)
        for name in order:
            seconds = {}
            for steps in (short, long):
                start = time.perf_counter()
                contenders[name](steps)
                seconds[steps] = time.perf_counter() - start
            costs[name].append((seconds[long] - seconds[short]) / (long - short))
    return costs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["mlp", "cnn"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--short", type=int, default=100)
    parser.add_argument("--long", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 10 and 60 steps")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.short, args.long = 2, 10, 60

    import tensorflow as tf

    from benchmarks import workloads

    print(
        "| workload | orbitask ms/step | Keras spe=1 | Keras spe=50 | orbitask / best Keras "
        "| orbitask, own aggregate_logs |"
    )
    print("|---|---|---|---|---|---|")
    for name in args.workloads:
        workload = workloads.WORKLOADS[name]
        with tempfile.TemporaryDirectory() as model_dir, open(os.devnull, "w") as quiet:
            with contextlib.redirect_stdout(quiet):
                trainer = build_orbitask(workload, os.path.join(model_dir, "default"))
                own = build_orbitask(workload, os.path.join(model_dir, "own"), own_aggregate=True)
            contenders = {
                "orbitask": lambda steps, t=trainer: t.evaluate(tf.constant(steps)),
                "orbitask_own": lambda steps, t=own: t.evaluate(tf.constant(steps)),
                "keras1": build_keras(workload, 1),
                "keras50": build_keras(workload, 50),
            }
            costs = measure(contenders, args.short, args.long, args.rounds)
        for contender, values in costs.items():
            rounded = " ".join(f"{1000 * v:.3f}" for v in values)
            print(f"{name} {contender} ms/step by round: {rounded}", file=sys.stderr)
        best = min(("keras1", "keras50"), key=lambda k: statistics.median(costs[k]))
        ratios = [o / k for o, k in zip(costs["orbitask"], costs[best], strict=True)]
        ms = {k: 1000 * statistics.median(v) for k, v in costs.items()}
        print(
            f"| {name} | {ms['orbitask']:.3f} | {ms['keras1']:.3f} | {ms['keras50']:.3f} | "
            f"{statistics.median(ratios):.2f} (vs {best}) | {ms['orbitask_own']:.3f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
