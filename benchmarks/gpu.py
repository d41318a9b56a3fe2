"""The GPU table: orbitask's steps/s on the throughput workloads, per precision, XLA and replicas.

    benchmarks/gpu.sh              # on a machine with a GPU: under 5 minutes on one
    benchmarks/gpu.sh --dry_run    # anywhere: a few steps of the MLP on the CPU, to prove it runs

Each row trains one workload (`benchmarks/workloads.py`: mlp, cnn, input) with every orbitask
default, in this process, under float32, mixed_float16 and mixed_bfloat16, with XLA
(`jit_compile`) off and on, on 1 replica and, where there are several GPUs, on all of them. A
row's figure is the median steps/s over its timed windows after a warm-up window (tracing and
compilation excluded). The table starts with the device's name and the TensorFlow version.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tensorflow as tf  # noqa: E402

from benchmarks import workloads  # noqa: E402
from benchmarks.bench_task import BenchTask  # noqa: E402
from orbitask.trainers import run_experiment  # noqa: E402

PRECISIONS = (None, "mixed_float16", "mixed_bfloat16")


def device_name() -> str:
    """The first GPU's name and the GPU count, or the CPU's model when there is none."""
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        return f"{details.get('device_name', 'GPU')} x{len(gpus)}"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        model = platform.processor() or "CPU"
    return f"CPU: {model}, {os.cpu_count()} cores (no GPU)"


def steps_per_second(name: str, replicas: int, precision, xla: bool, window: int, windows: int):
    """Trains `windows + 1` windows of `window` steps; returns the median steps/s of the timed
    ones (the first is the warm-up). Eager."""
    workload = workloads.WORKLOADS[name]
    marks: list[float] = []
    boundaries = [window * (k + 1) for k in range(windows + 1)]
    task = BenchTask(name, lambda: marks.append(time.perf_counter()), boundaries, callbacks=False)
    with tempfile.TemporaryDirectory(prefix="orbitask-gpu-") as model_dir:
        run_experiment(
            task=task, model_dir=model_dir, mode="train", train_steps=boundaries[-1],
            global_batch_size=workload.global_batch, strategy="mirrored" if replicas > 1 else
            "one_device", mixed_precision=precision, jit_compile=xla, progress=False,
            checkpoint_seconds=None, loggers=("tensorboard",),
        )  # fmt: skip
    return statistics.median(window / (b - a) for a, b in zip(marks, marks[1:], strict=False))


def rows(only: list[str], dry_run: bool) -> list[tuple]:
    """`(workload, replicas, precision, XLA, steps/s, examples/s)` of every configuration."""
    gpus = len(tf.config.list_physical_devices("GPU"))
    counts = [1] + ([gpus] if gpus > 1 else [])
    out = []
    for name in only:
        window = 20 if dry_run else workloads.WORKLOADS[name].window
        for replicas in counts:
            for precision in PRECISIONS:
                for xla in (False, True):
                    rate = steps_per_second(
                        name, replicas, precision, xla, window, 1 if dry_run else 3
                    )
                    batch = workloads.WORKLOADS[name].global_batch
                    out.append((name, replicas, precision or "float32", xla, rate, rate * batch))
                    print(f"  {out[-1][:4]}: {rate:.1f} steps/s", file=sys.stderr, flush=True)
    return out


def table(found: list[tuple]) -> str:
    """The Markdown table of `rows`, headed by the device and TensorFlow version."""
    lines = [
        f"Device: {device_name()}; TensorFlow {tf.__version__}",
        "",
        "| workload | replicas | precision | XLA | steps/s | examples/s |",
        "|---|---|---|---|---|---|",
    ]
    for name, replicas, precision, xla, rate, examples in found:
        on = "on" if xla else "off"
        lines.append(
            f"| {name} | {replicas} | {precision} | {on} | {rate:,.1f} | {examples:,.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry_run", action="store_true", help="a few MLP steps, any device")
    parser.add_argument("--only", default=None, help="workloads, e.g. mlp,cnn (default: all)")
    args = parser.parse_args(argv)
    only = (
        args.only.split(",")
        if args.only
        else (["mlp"] if args.dry_run else list(workloads.WORKLOADS))
    )
    started = time.perf_counter()
    print(table(rows(only, args.dry_run)))
    command = " ".join(["benchmarks/gpu.sh", *(sys.argv[1:] if argv is None else argv)])
    print(f"\n{time.perf_counter() - started:.0f} s; command: {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
