"""Where each device loop's host time goes in a default orbitask run: every hook timed in place.

    .venv/bin/python benchmarks/host_attribution.py [--workload mlp] [--steps 6000]

Trains the workload with `configs/defaults.gin`-like settings (mode "train", progress on, the
default `print_loss`), wraps the loop function and each per-loop hook (the Controller's loop
driver and its schedule's run, the trainer's begin/end, the callback and progress actions,
summaries, the summary writer's context exits, the checkpoint check) with a timer, and prints the
median time per loop of each (median, and mean, which counts work done every few loops), after 5
warm-up loops. Unlike cProfile it does not slow Python down; the hooks overlap TensorFlow's
threads, so the figures are what a run really pays.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="mlp", choices=["mlp", "cnn", "input"])
    parser.add_argument("--steps", type=int, default=6000)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tensorflow.python.ops import summary_ops_v2  # the writer's `as_default` context

    from benchmarks import workloads
    from benchmarks.bench_task import BenchTask
    from orbitask.trainers import TaskTrainer, run_experiment
    from orbitask.trainers.actions.callback_action import CallbackAction
    from orbitask.trainers.actions.progress import ProgressAction
    from orbitask.trainers.actions.schedule import Schedule
    from orbitask.trainers.actions.summaries import LoopSummaryManager
    from orbitask.trainers.run.controller import Controller

    times: dict[str, list[float]] = {}

    def timed(name, fn):
        def wrapper(*a, **k):
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                times.setdefault(name, []).append(time.perf_counter() - start)

        return wrapper

    hooks = [
        (Controller, "_train_n_steps"),
        (Schedule, "run"),
        (TaskTrainer, "train"),
        (TaskTrainer, "train_loop_begin"),
        (TaskTrainer, "train_loop_end"),
        (CallbackAction, "__call__"),
        (ProgressAction, "__call__"),
        (LoopSummaryManager, "write_summaries"),
        (Controller, "_maybe_save_checkpoint"),
        (summary_ops_v2._SummaryContextManager, "__exit__"),  # noqa: SLF001
    ]
    for cls, name in hooks:
        setattr(cls, name, timed(f"{cls.__name__}.{name}", getattr(cls, name)))
    create = TaskTrainer.create_train_loop_fn
    TaskTrainer.create_train_loop_fn = lambda self: timed("loop function", create(self))

    task = BenchTask(args.workload, lambda: None, [], callbacks=True)
    batch = workloads.WORKLOADS[args.workload].global_batch
    with tempfile.TemporaryDirectory() as model_dir, contextlib.redirect_stdout(io.StringIO()):
        run_experiment(
            task=task,
            model_dir=model_dir,
            mode="train",
            train_steps=args.steps,
            global_batch_size=batch,
            progress=True,
        )
    loops = len(times["loop function"])
    print(f"{args.workload}: {args.steps} steps, {loops} device loops; per call (us):")
    print(f"  {'hook':42s} {'median':>9s} {'mean':>9s}  calls")
    for name, values in sorted(times.items()):
        values = values[5:] or values
        median, mean = statistics.median(values) * 1e6, statistics.fmean(values) * 1e6
        print(f"  {name:42s} {median:9.0f} {mean:9.0f}  {len(values)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
