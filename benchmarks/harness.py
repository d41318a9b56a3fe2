"""Runs contenders in separate processes, interleaved: one timed window each per round.

A group is one workload at one replica count with its contenders. `run_group` starts one
`benchmarks.worker` process per contender; they warm up (import, build, trace, compile)
together, then the harness lets exactly one of them train at a time: round r runs one window
of every contender, in an order shuffled with seed r, so slow drifts of the machine's load hit
every contender alike and no contender always follows the same one (with a rotated order,
whatever a process does right after its window fell on the same neighbour every round). Each
window's time is measured inside its worker (`time.perf_counter` between the harness's `go`
and the window's last step), never including another process's work. Between its turns a
worker is frozen (SIGSTOP, then SIGCONT before its next turn): its input pipeline's threads
cannot fill buffers while the others train, so no contender's timed window gets batches made
off the clock, and its background threads (summaries, checkpoints) run on its own turns.

With a lead-in, a contender's turn is `lead_in` untimed windows and then the timed one, run
back to back. On these machines a process resumed after a pause runs its first few hundred MLP
steps markedly faster than it trains for long (benchmarks/RESULTS.md, Method), and an input
buffer refilled during the pause hands the next window batches made off the clock (more of
them the deeper the buffer); the lead-in spends both before the clock starts. A contender
named `name#k` is a k-th process of `name`: processes of the same code differ by a few percent
for their whole life, which no number of rounds averages away, so `benchmarks.table` pools them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass
class Group:
    """One workload at one replica count and the contenders compared on it."""

    workload: str
    replicas: int
    contenders: list[str]  # `name#k`: a k-th process of contender `name` (the noise floor)
    window: int | None = None  # steps per window; None: the workload's default


def base_name(contender: str) -> str:
    """The contender a process runs: `orbitask#2` (a second process of it) -> `orbitask`."""
    return contender.split("#")[0]


def start_order(contenders: list[str]) -> list[int]:
    """The order to start `contenders`' processes in: first processes first, then second ones,
    and so on (`reference, orbitask, reference#2, orbitask#2, ...`), so that no contender's
    processes are all started (and warmed up, and placed in memory) before another's."""
    return sorted(range(len(contenders)), key=lambda i: (copy_number(contenders[i]), i))


def copy_number(contender: str) -> int:
    """Which process of its contender this is: `orbitask` 1, `orbitask#2` 2."""
    _, _, copy = contender.partition("#")
    return int(copy) if copy else 1


@dataclasses.dataclass
class Result:
    """What one contender measured: steps/s of each round, steps per CPU-second of each round
    (all the process's threads; other processes' load barely moves it), peak RSS and extra
    figures."""

    group: Group
    contender: str
    rates: list[float] = dataclasses.field(default_factory=list)
    cpu_rates: list[float] = dataclasses.field(default_factory=list)
    peak_rss_mb: float | None = None
    extra: dict = dataclasses.field(default_factory=dict)


class Worker:
    """A `benchmarks.worker` process and the pipe it reports on. Eager, host side."""

    def __init__(
        self,
        group: Group,
        contender: str,
        rounds: int,
        steps_per_call: int,
        log_dir: str,
        lead_in: int = 0,
    ):
        read_fd, write_fd = os.pipe()
        command = [
            sys.executable,
            "-m",
            "benchmarks.worker",
            f"--contender={contender}",
            f"--workload={group.workload}",
            f"--replicas={group.replicas}",
            f"--windows={rounds * (lead_in + 1)}",
            f"--lead_in={lead_in}",
            f"--steps_per_call={steps_per_call}",
            f"--report_fd={write_fd}",
        ]
        if group.window:
            command.append(f"--window={group.window}")
        file_name = contender.replace("@", "_").replace("#", "-")
        name = f"{group.workload}-x{group.replicas}-{file_name}.log"
        self.log_path = os.path.join(log_dir, name)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
                env=env,
                text=True,
            )
        os.close(write_fd)
        self.reports = os.fdopen(read_fd)
        self.contender = contender

    def expect(self, event: str) -> dict:
        """Waits for the next report and checks it is `event`."""
        line = self.reports.readline()
        if not line:
            self.process.wait()
            with open(self.log_path) as log:
                tail = log.read()[-3000:]
            raise RuntimeError(
                f"benchmark worker {self.contender!r} exited with status "
                f"{self.process.returncode} before reporting {event!r}; its log "
                f"({self.log_path}) ends with:\n{tail}"
            )
        message = json.loads(line)
        if message.get("event") != event:
            raise RuntimeError(f"worker {self.contender!r}: expected {event!r}, got {message}")
        return message

    def freeze(self) -> None:
        """Stops every thread of the worker until `thaw` (SIGSTOP)."""
        os.kill(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """Lets a frozen worker run again (SIGCONT; harmless on one that runs)."""
        os.kill(self.process.pid, signal.SIGCONT)

    def go(self) -> None:
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def turn(self) -> dict:
        """Lets the worker run its lead-in windows and one timed window; returns the timed."""
        while True:
            self.go()
            window = self.expect("window")
            if window["timed"]:
                return window

    def close(self) -> None:
        if self.process.poll() is None:
            self.thaw()
            self.process.kill()
        self.process.wait()
        self.reports.close()


def run_group(
    group: Group,
    rounds: int,
    steps_per_call: int,
    log_dir: str,
    echo=print,
    lead_in: int = 0,
    freeze: bool = True,
) -> list[Result]:
    """Runs every contender of `group` for `rounds` interleaved turns; returns their results.

    A turn is `lead_in` untimed windows and one timed window of one contender; with `freeze`
    the others are stopped meanwhile (module docstring).
    """
    workers: list = [None] * len(group.contenders)
    for i in start_order(group.contenders):
        workers[i] = Worker(group, group.contenders[i], rounds, steps_per_call, log_dir, lead_in)
    results = [Result(group, c) for c in group.contenders]
    try:
        started = time.monotonic()
        for worker in workers:
            worker.expect("ready")
            if freeze:
                worker.freeze()
        echo(
            f"  {group.workload} x{group.replicas}: {len(workers)} contenders warmed up in "
            f"{time.monotonic() - started:.0f} s"
        )
        for r in range(rounds):
            order = list(range(len(workers)))
            random.Random(r).shuffle(order)
            for i in order:
                if freeze:
                    workers[i].thaw()
                window = workers[i].turn()
                if freeze:
                    workers[i].freeze()
                results[i].rates.append(window["steps"] / window["seconds"])
                results[i].cpu_rates.append(window["steps"] / max(window["cpu_seconds"], 1e-9))
            echo(f"  round {r + 1}/{rounds} done ({time.monotonic() - started:.0f} s)")
        finishing = time.monotonic()
        for worker in workers:
            worker.thaw()
            worker.go()  # all finish at once (orbitask saves its last checkpoint), untimed
        for worker, result in zip(workers, results, strict=True):
            done = worker.expect("done")
            result.peak_rss_mb = done.pop("peak_rss_mb")
            done.pop("event")
            result.extra = done
        for worker in workers:
            worker.process.wait(timeout=120)
        echo(f"  finished in {time.monotonic() - finishing:.0f} s")
    finally:
        for worker in workers:
            worker.close()
    return results
