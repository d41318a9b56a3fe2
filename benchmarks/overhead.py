"""orbitask's own cost per step against the hand-written loop: one process, one shared iterator.

    .venv/bin/python benchmarks/overhead.py [--workload mlp] [--rounds 500]

Separate processes of the same code differ by 1-5% for their whole life (benchmarks/RESULTS.md),
so the cross-process table (`benchmarks/run.py`) cannot resolve a cost of 2-3% on the MLP. Here
one process builds the reference loop and a default orbitask run (`configs/defaults.gin`,
trained for 2 loops first) and times, on ONE iterator that all of them read:

- the hand-written loop (`contenders.reference_loop`);
- orbitask's device-loop function (its step, the step counter, the history `print_loss` reads);
- the same without the history (the loop function of a run without deferred callbacks);
- `TaskTrainer.train`: that plus the trainer's host work of a loop;
- the Controller's loop body: that plus callbacks, progress display, summaries, checkpoint check;
- the same for a run with the default callbacks and the progress display off, which gives
  their cost (the `print_loss` history recorded in the loop included).

Each round calls every variant once for `--steps_per_call` steps, in a shuffled order. A
variant's figure is the median over rounds of reference time / its time, with a 95% bootstrap
interval, and its cost in microseconds per step. Sharing the iterator puts every variant on the
same input producer; what a pipeline costs is the cross-process table's to say.
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


def build_orbitask(workload, steps_per_call: int, model_dir: str, quiet: bool = False):
    """A default orbitask run of `workload`, trained 2 loops; returns its Controller. Eager.

    `quiet`: the default callbacks and the progress display off.
    """
    import gin

    import orbitask.trainers.run.experiment
    import orbitask.trainers.run.runner
    from benchmarks.bench_task import BenchTask
    from orbitask.trainers.commands.train import parse_gin

    built = []

    class Recorded(orbitask.trainers.run.runner.Controller):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            built.append(self)

    parse_gin(
        [os.path.join(os.path.dirname(__file__), "..", "configs", "defaults.gin")],
        [
            f"TRAIN_STEPS = {2 * steps_per_call}",
            f"orbitask.run_experiment.global_batch_size = {workload.global_batch}",
            f"orbitask.run_experiment.steps_per_loop = {steps_per_call}",
            f"orbitask.run_experiment.progress = {not quiet}",
        ],
    )
    original, orbitask.trainers.run.runner.Controller = (
        orbitask.trainers.run.runner.Controller,
        Recorded,
    )
    try:
        task = BenchTask(workload.name, lambda: None, [], callbacks=not quiet)
        orbitask.trainers.run.experiment.run_experiment(
            task=task, model_dir=model_dir, mode="train"
        )
    finally:
        orbitask.trainers.run.runner.Controller = original
        gin.clear_config()
    return built[0]


def measure(variants: dict, rounds: int, warm_up: int = 20) -> dict[str, list[float]]:
    """Calls each variant `warm_up` times, then once per round in a shuffled order; returns
    each variant's seconds per call."""
    for call in variants.values():
        for _ in range(warm_up):
            call()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds):
        order = list(variants)
        random.Random(r).shuffle(order)
        for name in order:
            start = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - start)
    return times


def report(times: dict[str, list[float]], steps: int) -> list[str]:
    """One line per variant: steps/s, ratio to the first (the reference) and cost per step."""
    from benchmarks.table import median_interval

    base = times[next(iter(times))]
    lines = []
    for name, values in times.items():
        ratios = [b / v for b, v in zip(base, values, strict=True)]
        low, high = median_interval(ratios)
        cost = (statistics.median(values) - statistics.median(base)) / steps * 1e6
        lines.append(
            f"{name:40s} {steps / statistics.median(values):7.0f} steps/s  "
            f"{statistics.median(ratios):.3f} ({low:.3f}-{high:.3f})  {cost:+6.1f} us/step"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="mlp", choices=["mlp", "cnn", "input"])
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--steps_per_call", type=int, default=100)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from benchmarks import contenders, workloads
    from benchmarks.table import median_interval

    workload = workloads.WORKLOADS[args.workload]
    k = args.steps_per_call
    num_steps = tf.constant(k)
    reference, shared = contenders.reference_loop(workload, replicas=1)
    with (
        tempfile.TemporaryDirectory() as model_dir,
        open(os.devnull, "w") as quiet,
        contextlib.redirect_stdout(quiet),  # progress display and print_loss
    ):
        default = build_orbitask(workload, k, os.path.join(model_dir, "default"))
        silent = build_orbitask(workload, k, os.path.join(model_dir, "quiet"), quiet=True)
        trainer = default.trainer
        loop_fn = trainer._loop_fn  # noqa: SLF001
        plain_fn = silent.trainer._loop_fn  # noqa: SLF001

        steps = {}  # controller -> its global step (one count for all its variants)
        for controller in (default, silent):
            steps[controller] = int(controller.global_step.numpy())
            controller.trainer.set_train_iterator(shared)

        def counted(controller, call):
            def run():
                call(steps[controller])
                steps[controller] += k

            return run

        def controller_loop(controller):  # the body of Controller.train's loop
            def run(step):
                controller._train_n_steps(k, step)  # noqa: SLF001 (with its schedule)

            return counted(controller, run)

        variants = {
            "hand-written loop (reference)": lambda: float(reference(shared, num_steps)),
            "orbitask loop function": counted(
                default, lambda _: float(loop_fn(shared, num_steps)["logs"]["loss"])
            ),
            "  the same without the history record": counted(
                silent, lambda _: float(plain_fn(shared, num_steps)["logs"]["loss"])
            ),
            "+ TaskTrainer.train (host work)": counted(default, lambda _: trainer.train(num_steps)),
            "+ Controller (callbacks, progress, ...)": controller_loop(default),
            "Controller, callbacks + progress off": controller_loop(silent),
        }
        times = measure(variants, args.rounds)
    print(f"{args.workload}: {args.rounds} rounds of {k} steps per variant, one shared iterator")
    print(f"{'variant':40s} {'median':>13s}  ratio (95% interval)  cost")
    print("\n".join(report(times, k)))
    on, off = (
        times["+ Controller (callbacks, progress, ...)"],
        times["Controller, callbacks + progress off"],
    )
    costs = [a / b - 1 for a, b in zip(on, off, strict=True)]
    low, high = median_interval(costs)
    print(
        f"cost of the default callbacks + progress: {100 * statistics.median(costs):+.1f}% "
        f"of the step time (95% interval {100 * low:+.1f}% to {100 * high:+.1f}%)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
