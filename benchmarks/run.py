"""Throughput benchmark: orbitask against a hand-written loop and Keras `fit`, same everything.

    .venv/bin/python benchmarks/run.py            # the full table (9 rounds, 9-14 min on 2 cores)
    .venv/bin/python benchmarks/run.py --quick    # fewer contenders, 3 rounds (~1 min)
    .venv/bin/python benchmarks/run.py --pooled   # one device, 5 processes a side (6-8 min)
    .venv/bin/python benchmarks/run.py --tiny     # 1 round of 20 steps: proves the harness works

Prints a Markdown table (steps/s after warm-up, compile excluded: median and min-max over
rounds, the ratio to the hand-written reference, peak RSS) and the targets met or missed.
`--out FILE` also writes it to FILE. Contenders run in separate processes, interleaved
(`benchmarks/harness.py`); workloads are in `benchmarks/workloads.py`.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import table, worker  # noqa: E402
from benchmarks.harness import Group, run_group  # noqa: E402

SINGLE = list(worker.CONTENDERS)
TWO = ("reference", "orbitask")
MODELS = ("mlp", "cnn")
PLANS = {
    # name: (rounds, steps_per_call, lead-in windows before each timed one, groups)
    "full": (
        9,
        100,
        1,
        [
            # Second processes of the reference (and of orbitask on the MLP, where the two are
            # closest) show the noise floor and are pooled into the ratios of the targets.
            Group("mlp", 1, [*SINGLE, "reference#2", "orbitask#2"]),
            Group("cnn", 1, [*(c for c in SINGLE if c != "reference-window"), "reference#2"]),
            Group("mlp", 2, ["reference", "orbitask", "keras3@N"]),
            Group("cnn", 2, ["reference", "orbitask", "keras3@N"]),
            Group("input", 1, ["reference", "orbitask", "keras3@N"]),
        ],
    ),
    "quick": (
        3,
        100,
        1,
        [
            Group(
                "mlp",
                1,
                ["reference", "reference-window", "orbitask", "orbitask-fixed", "keras3@N"],
                300,
            ),
            Group("cnn", 1, ["reference", "orbitask", "keras3@N"]),
            Group("mlp", 2, ["reference", "orbitask"], 300),
        ],
    ),
    # The one-device targets only, each side in 5 processes: a process keeps its own speed for
    # its whole life (1-5% from another of the same code), so processes, more than rounds,
    # narrow the interval.
    "pooled": (
        10,
        100,
        1,
        [
            Group(w, 1, [f"{c}#{k}" if k > 1 else c for c in TWO for k in range(1, 6)])
            for w in MODELS
        ],
    ),
    "tiny": (1, 10, 0, [Group("mlp", 1, ["reference", "reference-bounded", "orbitask"], 20)]),
}


def machine() -> str:
    """One line: date, CPU, cores, TensorFlow version."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    return (
        f"{datetime.date.today().isoformat()}, {cpu}, {os.cpu_count()} cores, no GPU used, "
        f"TensorFlow {importlib.metadata.version('tensorflow')}, "
        f"Keras {importlib.metadata.version('keras')}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="fewer contenders, 3 rounds")
    mode.add_argument("--tiny", action="store_true", help="1 round of 20 steps (a smoke test)")
    mode.add_argument(
        "--pooled", action="store_true", help="one device, reference and orbitask x5 processes"
    )
    parser.add_argument("--rounds", type=int, help="override the plan's number of rounds")
    parser.add_argument(
        "--lead_in", type=int, help="override the plan's untimed windows before each timed one"
    )
    parser.add_argument(
        "--no_freeze",
        action="store_true",
        help="let waiting contenders run (their input threads fill buffers off the clock)",
    )
    parser.add_argument("--only", help="comma-separated workloads to run, e.g. mlp,cnn")
    parser.add_argument("--out", help="also write the report (Markdown) to this file")
    parser.add_argument("--logs", help="keep the workers' logs in this folder")
    args = parser.parse_args(argv)
    plan = "tiny" if args.tiny else "quick" if args.quick else "pooled" if args.pooled else "full"
    rounds, steps_per_call, lead_in, groups = PLANS[plan]
    rounds = args.rounds or rounds
    lead_in = lead_in if args.lead_in is None else args.lead_in
    if args.only:
        groups = [g for g in groups if g.workload in args.only.split(",")]
    log_dir = args.logs or tempfile.mkdtemp(prefix="orbitask-bench-logs-")
    os.makedirs(log_dir, exist_ok=True)
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    _echo(
        f"benchmarks/run.py: plan {plan}, {rounds} round(s), {lead_in} lead-in window(s) a turn; "
        f"worker logs in {log_dir}"
    )
    results = [
        run_group(
            g,
            rounds,
            steps_per_call,
            log_dir,
            echo=_echo,
            lead_in=lead_in,
            freeze=not args.no_freeze,
        )
        for g in groups
    ]
    minutes = (time.monotonic() - started) / 60
    command = " ".join(["benchmarks/run.py", *(argv if argv is not None else sys.argv[1:])])
    report = "\n".join(
        [
            f"Measured {machine()}.",
            f"Command: `.venv/bin/python {command.strip()}` ({plan} plan, {rounds} rounds, "
            f"{lead_in} untimed lead-in window(s) before each timed one, "
            f"{'waiting contenders running' if args.no_freeze else 'waiting contenders frozen'}, "
            f"{minutes:.1f} min; load average {load_before:.1f} before, "
            f"{os.getloadavg()[0]:.1f} after).",
            "",
            table.markdown(results, steps_per_call),
            "",
            "Ratios are medians over rounds of the per-round ratio to the reference (its "
            "processes averaged), with a 95% bootstrap interval over rounds; contenders run "
            "interleaved.",
            "",
            *table.targets(results),
        ]
    )
    print(report)
    if args.out:
        Path(args.out).write_text(report + "\n")
    return 0


def _echo(text: str) -> None:
    print(text, flush=True)


if __name__ == "__main__":
    sys.exit(main())
