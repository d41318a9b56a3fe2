"""What a device loop's length is worth: the same steps as short loops or as one long one.

    .venv/bin/python benchmarks/loop_length.py [--workload mlp] [--rounds 40] [--long 1000]

One process, one shared iterator (as `benchmarks/overhead.py`). Each round runs `--long` steps
four ways, in a shuffled order: the hand-written loop (`contenders.reference_loop`) called for
100 steps at a time and once for all of them, and a default orbitask run's Controller loop
(`Controller._train_n_steps` with its schedule: callbacks, progress, summaries, checkpoint) for
100-step loops (`loop_seconds = None`) and for one loop of all of them (what `loop_seconds`
grows quick loops to; the harness's windows cut them at its window length). Prints each way's
steps/s and its ratio to the reference's 100-step calls (median over rounds, 95% bootstrap
interval), and orbitask's ratio to the reference at each length.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHORT = 100


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="mlp", choices=["mlp", "cnn", "input"])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--long", type=int, default=1000, help="steps per round (x100)")
    args = parser.parse_args(argv)
    if args.long % SHORT:
        parser.error(f"--long must be a multiple of {SHORT}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from benchmarks import contenders, workloads
    from benchmarks.overhead import build_orbitask, measure
    from benchmarks.table import median_interval

    workload = workloads.WORKLOADS[args.workload]
    total = args.long
    reference, shared = contenders.reference_loop(workload, replicas=1)
    with (
        tempfile.TemporaryDirectory() as model_dir,
        open(os.devnull, "w") as quiet,
        contextlib.redirect_stdout(quiet),  # progress display and print_loss
    ):
        controller = build_orbitask(workload, SHORT, model_dir)
        controller.trainer.set_train_iterator(shared)
        step = [int(controller.global_step.numpy())]

        def hand_written(length):
            steps = tf.constant(length)

            def run():
                for _ in range(total // length):
                    float(reference(shared, steps))

            return run

        def orbitask(length):
            def run():
                for _ in range(total // length):
                    controller._train_n_steps(length, step[0])  # noqa: SLF001 (with its schedule)
                    step[0] += length

            return run

        variants = {
            f"hand-written loop, {SHORT} steps/call": hand_written(SHORT),
            f"hand-written loop, {total} steps/call": hand_written(total),
            f"orbitask, {SHORT}-step loops": orbitask(SHORT),
            f"orbitask, one {total}-step loop": orbitask(total),
        }
        times = measure(variants, args.rounds, warm_up=2)
    names = list(times)
    print(f"{args.workload}: {args.rounds} rounds of {total} steps per variant, one iterator")
    print(f"{'variant':40s} {'median':>13s}  ratio to the first (95% interval)")
    for name in names:
        ratios = [b / v for b, v in zip(times[names[0]], times[name], strict=True)]
        low, high = median_interval(ratios)
        rate = total / statistics.median(times[name])
        print(
            f"{name:40s} {rate:7.0f} steps/s  "
            f"{statistics.median(ratios):.3f} ({low:.3f}-{high:.3f})"
        )
    for ref, orb in ((names[0], names[2]), (names[1], names[3])):
        ratios = [r / o for r, o in zip(times[ref], times[orb], strict=True)]
        low, high = median_interval(ratios)
        print(f"{orb} / {ref}: {statistics.median(ratios):.3f} ({low:.3f}-{high:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
