"""What the depth of the training pipeline's final prefetch costs the hand-written loop.

    .venv/bin/python benchmarks/prefetch_depth.py [--workload mlp] [--rounds 300] [--reverse]

One process builds the hand-written loop (`contenders.reference_loop`) and one iterator of the
workload's pipeline per depth: its own `prefetch(AUTOTUNE)` (the reference) and fixed
`prefetch(d)` for each `--depths`, created in that order (`--reverse`: the fixed ones from the
deepest). Each round calls the loop once on every iterator, `--steps_per_call` steps, in a
shuffled order; a figure is the median over rounds of reference time / its time, with a 95%
bootstrap interval (`overhead.report`). orbitask's default bound
(`trainers/engine/prefetch.py`) gives the MLP's 32 KiB batches 32 elements and the CNN's 768 KiB
ones 4.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="mlp", choices=["mlp", "cnn"])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--steps_per_call", type=int, default=100)
    parser.add_argument("--depths", default="4,8,16,32")
    parser.add_argument("--reverse", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from benchmarks import contenders, overhead, workloads

    workload = workloads.WORKLOADS[args.workload]
    reference, autotuned = contenders.reference_loop(workload, replicas=1)
    num_steps = tf.constant(args.steps_per_call)

    def call(iterator):
        return lambda: float(reference(iterator, num_steps))

    calls = {"prefetch(AUTOTUNE) (reference)": call(autotuned)}
    depths = sorted((int(d) for d in args.depths.split(",")), reverse=args.reverse)
    for depth in depths:
        pipeline = workloads.dataset(workload.name, workload.global_batch, prefetch=depth)
        calls[f"prefetch({depth})"] = call(iter(pipeline))
    times = overhead.measure(calls, args.rounds)
    k = args.steps_per_call
    print(f"{args.workload}: {args.rounds} rounds of {k} steps per depth, the hand-written loop")
    print("\n".join(overhead.report(times, k)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
