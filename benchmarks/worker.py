"""One contender in its own process, paced by the harness (`benchmarks/run.py` starts these).

    python -m benchmarks.worker --contender orbitask --workload mlp --replicas 1 --windows 5 \
        --report_fd 5

Protocol: at every window boundary the worker writes one JSON line to `--report_fd`
(`{"event": "ready"}` after warm-up, then `{"event": "window", "seconds": ..., "cpu_seconds":
..., "steps": ..., "timed": ...}`, `cpu_seconds` the process's CPU time over the window, all its
threads; with `--lead_in k` only every (k+1)-th window is timed) and
blocks reading stdin until the harness writes `go`. At the end it writes
`{"event": "done", "peak_rss_mb": ..., ...}`. The contender's own output (progress lines,
`print_loss`) goes to stdout, which the harness sends to a log file, as a CI log would be.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

CONTENDERS = (
    "reference",
    "reference-window",
    "reference-bounded",
    "orbitask",
    "orbitask-fixed",
    "orbitask-quiet",
    "orbitask-lean",
    "orbitask-xla",
    "orbitask-autotune",
    "keras3@1",
    "keras3@N",
    "tf_keras@1",
    "tf_keras@N",
)


class Gate:
    """Reports each window's time and blocks until the harness says `go`. Eager, host side.

    With `lead_in` k, each turn is k untimed windows, then a timed one: the contender trains
    on without a pause, so its input buffers reach the level they keep while training (with
    `run.py --no_freeze`, a buffer refilled while other contenders ran would hand the timed
    window batches made off the clock) and its own start-up work after a pause is done. Every
    window is reported, the timed ones with `timed: true`.
    """

    def __init__(self, report, steps: int, lead_in: int = 0):
        self.report = report
        self.steps = steps
        self.lead_in = lead_in
        self.start: float | None = None
        self.cpu_start = 0.0
        self.count = 0  # windows ended so far
        self.windows: list[tuple[float, float]] = []  # the timed ones

    def in_window(self, moment: float) -> bool:
        """Whether `moment` (a `time.perf_counter()` value) fell inside a timed window."""
        return any(start <= moment <= end for start, end in self.windows)

    def timed_seconds(self) -> float:
        return sum(end - start for start, end in self.windows)

    def send(self, **message) -> None:
        self.report.write(json.dumps(message) + "\n")
        self.report.flush()

    def __call__(self) -> None:
        now, cpu = time.perf_counter(), time.process_time()
        if self.start is None:
            self.send(event="ready")
        else:
            self.count += 1
            timed = self.count % (self.lead_in + 1) == 0
            if timed:
                self.windows.append((self.start, now))
            self.send(
                event="window",
                seconds=now - self.start,
                cpu_seconds=cpu - self.cpu_start,
                steps=self.steps,
                timed=timed,
            )
        command = sys.stdin.readline().strip()
        if command != "go":
            raise SystemExit(f"worker: expected 'go' from the harness, got {command!r}")
        self.start, self.cpu_start = time.perf_counter(), time.process_time()


def peak_rss_mb() -> float:
    """This process's peak resident set size in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--contender", required=True, help="one of CONTENDERS; `name#k`: its k-th process"
    )
    parser.add_argument("--workload", required=True)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--windows", type=int, required=True, help="all windows, lead-ins too")
    parser.add_argument("--lead_in", type=int, default=0, help="untimed windows before each")
    parser.add_argument("--window", type=int, help="steps per window (default: the workload's)")
    parser.add_argument("--steps_per_call", type=int, default=100)
    parser.add_argument("--report_fd", type=int, required=True)
    args = parser.parse_args(argv)
    report = os.fdopen(args.report_fd, "w")
    from benchmarks.harness import base_name

    name = base_name(args.contender)
    if name not in CONTENDERS:
        parser.error(f"--contender: {name!r} is not one of {', '.join(CONTENDERS)}")

    import dataclasses

    import tensorflow as tf

    if args.replicas > 1:  # before anything initialises TensorFlow's devices
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(args.replicas)]
        )
    from benchmarks import contenders, workloads

    workload = workloads.WORKLOADS[args.workload]
    if args.window:
        workload = dataclasses.replace(workload, window=args.window)
    gate = Gate(report, workload.window, args.lead_in)
    common = dict(workload=workload, replicas=args.replicas, gate=gate, windows=args.windows)
    n = args.steps_per_call
    if name == "reference":
        extra = contenders.run_reference(**common, steps_per_call=n)
    elif name == "reference-window":  # loops as long as orbitask's grown ones, cut at windows
        extra = contenders.run_reference(**common, steps_per_call=workload.window)
    elif name == "reference-bounded":  # orbitask's default bound on the final prefetch
        depth = contenders.orbitask_depth(workload, args.replicas)
        extra = contenders.run_reference(**common, steps_per_call=n, prefetch=depth)
    elif name.startswith("orbitask"):
        extra = contenders.run_orbitask(
            **common,
            callbacks=name not in ("orbitask-quiet", "orbitask-lean"),
            jit_compile=name == "orbitask-xla",
            checkpoints=name != "orbitask-lean",
            keep_autotune=name == "orbitask-autotune",
            fixed_loops=name == "orbitask-fixed",
        )
    else:
        flavour, spe = name.split("@")
        extra = contenders.run_keras_fit(
            **common,
            flavour="tf_keras" if flavour == "tf_keras" else "keras",
            steps_per_execution=n if spe == "N" else int(spe),
        )
    gate.send(event="done", peak_rss_mb=peak_rss_mb(), **extra)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip TensorFlow's teardown (seconds per process); everything is reported


if __name__ == "__main__":
    main()
