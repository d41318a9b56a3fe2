"""What the workers' agreements cost after each device loop under `multi_worker_mirrored`.

    .venv/bin/python benchmarks/worker_agreement.py [--workers 2] [--calls 30]

After every device loop the workers of a `multi_worker_mirrored` run agree, in one collective
(over 127.0.0.1 here), on the seconds rules' clocks and the signals received (the schedule's
`cluster.agreement`); after an evaluation on the signals alone (`cluster.signal_agreement`);
while the first loops grow, on growing them (`cluster.every_worker`). This starts `--workers`
local processes; each builds the strategy, calls each agreement once to warm up, then `--calls`
times; worker 0 prints the median milliseconds a call. `cluster.smallest` (a gather, which
TensorFlow traces anew at every call) is timed beside them, as what a gather would cost.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def worker(index: int, ports: list[int], calls: int) -> None:
    """One worker: builds the strategy, times each agreement; worker 0 prints the table."""
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
            "task": {"type": "worker", "index": index},
        }
    )
    sys.path.insert(0, str(REPO))
    import tensorflow as tf

    from orbitask.trainers.distribution import cluster

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    signals = cluster.signal_agreement(strategy)
    after_loop = cluster.agreement(strategy)
    agreements = {
        "after each loop, clocks and signals (`agreement`)": lambda k: after_loop(
            [(k % 2, 2), (k % 3, 3)]
        ),
        "signals alone, after an evaluation (`signal_agreement`)": lambda k: signals(k % 3),
        "loop growth, the first loops (`every_worker`)": lambda k: cluster.every_worker(
            strategy, True
        ),
        "a gather (`smallest`)": lambda k: cluster.smallest(strategy, k),
    }
    rows = []
    for name, agree in agreements.items():
        agree(0)
        times = []
        for k in range(calls):
            start = time.perf_counter()
            agree(k)
            times.append(time.perf_counter() - start)
        rows.append(f"| {name} | {1000 * statistics.median(times):.1f} |")
    if index == 0:
        print(f"{len(ports)} workers on 127.0.0.1, {calls} calls each, worker 0's times:")
        print("| agreement | ms a call (median) |\n|---|---|")
        print("\n".join(rows), flush=True)


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--index", type=int, help=argparse.SUPPRESS)  # a worker's own process
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.index is not None:
        worker(args.index, [int(p) for p in args.ports.split(",")], args.calls)
        return 0
    ports = ",".join(map(str, _free_ports(args.workers)))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
    command = [sys.executable, __file__, "--calls", str(args.calls), "--ports", ports]
    others = [
        subprocess.Popen([*command, "--index", str(i)], env=env, stderr=subprocess.DEVNULL)
        for i in range(1, args.workers)
    ]
    first = subprocess.run([*command, "--index", "0"], env=env, stderr=subprocess.DEVNULL)
    status = max([first.returncode] + [p.wait(timeout=120) for p in others])
    flags = argv if argv is not None else sys.argv[1:]
    print(f"Command: `{' '.join(['.venv/bin/python benchmarks/worker_agreement.py', *flags])}`")
    return status


if __name__ == "__main__":
    sys.exit(main())
