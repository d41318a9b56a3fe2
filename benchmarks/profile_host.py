"""Where a default orbitask run spends its time: cProfile of the steps after warm-up.

    .venv/bin/python benchmarks/profile_host.py [--workload mlp] [--steps 2000] [--quiet]

Trains the workload with `configs/defaults.gin` (mode "train"), profiles `--steps` steps after a
200-step warm-up, and prints the wall time of the profiled part and the functions with the
largest cumulative time: the device loops (`TaskTrainer.train`), checkpoint saves
(`CheckpointManager.save`), summaries, callbacks. `--quiet` drops the default callbacks and the
progress display. cProfile slows Python down, so read shares, not absolute times.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WARM_UP = 200


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="mlp", choices=["mlp", "cnn", "input"])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--quiet", action="store_true", help="default callbacks + progress off")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    from benchmarks import workloads
    from benchmarks.bench_task import BenchTask
    from orbitask.trainers import run_experiment
    from orbitask.trainers.commands.train import parse_gin

    profile = cProfile.Profile()
    started = []

    def start() -> None:
        started.append(time.perf_counter())
        profile.enable()

    workload = workloads.WORKLOADS[args.workload]
    parse_gin(
        [os.path.join(os.path.dirname(__file__), "..", "configs", "defaults.gin")],
        [
            f"TRAIN_STEPS = {WARM_UP + args.steps}",
            f"orbitask.run_experiment.global_batch_size = {workload.global_batch}",
            f"orbitask.run_experiment.progress = {not args.quiet}",
        ],
    )
    task = BenchTask(args.workload, start, [WARM_UP], callbacks=not args.quiet)
    with tempfile.TemporaryDirectory() as model_dir, contextlib.redirect_stdout(io.StringIO()):
        run_experiment(task=task, model_dir=model_dir, mode="train")
        profile.disable()
        seconds = time.perf_counter() - started[0]
    print(f"{args.steps} steps of {args.workload} in {seconds:.2f} s under cProfile")
    stats = io.StringIO()
    pstats.Stats(profile, stream=stats).sort_stats("cumulative").print_stats(args.top)
    print(stats.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
