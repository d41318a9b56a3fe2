"""The local launcher: runs one orbitask job as a cluster of processes on 127.0.0.1.

    orbitask launch --workers 2 -- --gin_file=experiments/digits.gin --model_dir=runs/mw
    orbitask launch --workers 2 --ps 1 -- --gin_file=... --model_dir=...   # parameter server
    python -m orbitask.trainers.commands.launch ...                         # the same

For tests and for trying a cluster configuration on one machine. It only starts processes (the
usual binary, each with its TF_CONFIG and free ports, detached from the terminal and, on Linux,
dying with the launcher), prefixes their output (`relay.py`), relays SIGTERM / SIGHUP / SIGINT (a
terminal's Ctrl-C reaches the launcher alone) and restarts; all training logic stays in the
binary. It binds `run_experiment.strategy` to the cluster it starts: `multi_worker_mirrored`
(N workers, worker 0 is the chief) or, with `--ps P`, `parameter_server` (a chief that
coordinates, N workers and P parameter servers).

Exit status: 0 when the job succeeded; 75 (130) when SIGTERM or SIGHUP (SIGINT) to the launcher
or any worker stopped the job: every worker saved the same step and stopped together, and the same
command resumes it; otherwise the first failure's status (128 + signal for a process killed by a
signal), after killing the other processes. With `--max_restarts K`, a failed job is stopped and
started again from its last checkpoint, up to K times (a stopped one is not). Under
`parameter_server`, a dead worker does not stop the job (the coordinator carries on with the
others); it is restarted in place while restarts remain.

Loopback only: TensorFlow's gRPC servers listen on every interface (`0.0.0.0`, fixed in
`grpc_server_lib.cc`) and its cluster runtime is unauthenticated, so the launcher first moves
itself, and so every process it starts, into a new network namespace whose only interface is
its own loopback (`unshare(CLONE_NEWNET)`; not root: with `CLONE_NEWUSER`, where user namespaces
are allowed). No other process and no other machine reaches the job's ports; the job reaches no
network either (a `gs://` model directory needs `--allow_open_ports`). When no namespace can be
made the launcher stops with one line (exit 2); `--allow_open_ports` runs the job on this
machine's network instead.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time

from orbitask.trainers.commands.exits import EXIT_INTERRUPTED, EXIT_PREEMPTED, EXIT_USAGE
from orbitask.trainers.commands.network import free_ports, loopback_only
from orbitask.trainers.commands.relay import Relay

STOPPED = (EXIT_PREEMPTED, EXIT_INTERRUPTED)  # saved on a signal: resume, do not restart
GRACE_S = 60.0  # how long processes get to save and exit after a relayed SIGTERM
_PR_SET_PDEATHSIG = 1  # prctl(2)


class UsageError(Exception):
    """A bad launcher flag."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="orbitask launch", add_help=True)
    p.add_argument("--workers", type=int, required=True, help="worker processes (N >= 1)")
    p.add_argument("--ps", type=int, default=0, help="parameter servers (0: multi-worker)")
    p.add_argument("--max_restarts", type=int, default=0, help="job restarts after a failure")
    p.add_argument(
        "--allow_open_ports",
        action="store_true",
        help="run on this machine's network (ports open on every interface) when the job "
        "cannot have a loopback-only network namespace of its own",
    )
    return p


def cluster_roles(workers: int, ps: int) -> list[tuple[str, int]]:
    """The (task type, index) of every process: the program's processes first."""
    if ps == 0:
        return [("worker", i) for i in range(workers)]
    return [("chief", 0)] + [("worker", i) for i in range(workers)] + [("ps", i) for i in range(ps)]


def cluster_spec(roles: list[tuple[str, int]], ports: list[int]) -> dict:
    """`{task type: ["127.0.0.1:port", ...]}` for TF_CONFIG."""
    spec: dict = {}
    for (kind, _), port in zip(roles, ports, strict=True):
        spec.setdefault(kind, []).append(f"127.0.0.1:{port}")
    return spec


def _detached_dying_with(launcher: int):
    """A job process's `preexec_fn`: detached from the terminal (`setsid()`: no controlling
    terminal), so that a terminal's Ctrl-C (sent to its foreground process group) reaches the
    launcher alone, which relays it once per Ctrl-C, while the process still reads the terminal
    (`breakpoint()`; a background process group of the terminal would be stopped by SIGTTIN);
    and, on Linux, SIGKILL when the launcher dies (`prctl(PR_SET_PDEATHSIG)`), so that no
    process of the job outlives it."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        prctl = None

    def preexec() -> None:
        os.setsid()
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != launcher:  # the launcher died before the line above
                os._exit(1)

    return preexec


def _status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _name(role: tuple[str, int]) -> str:
    return "chief" if role[0] == "chief" else f"{role[0]} {role[1]}"


class Launcher:
    """Starts, watches, stops and restarts the processes of one job.

    Args:
      workers, ps, max_restarts: the launcher's flags.
      train_argv: the binary's flags, passed to every process.
      out: where prefixed output goes.
    """

    def __init__(self, workers: int, ps: int, max_restarts: int, train_argv: list[str], out=None):
        self.roles = cluster_roles(workers, ps)
        self.ps_mode = ps > 0
        self.max_restarts = max_restarts
        self.restarts_left = max_restarts
        strategy = "parameter_server" if self.ps_mode else "multi_worker_mirrored"
        self.command = [
            sys.executable,
            "-m",
            "orbitask.trainers.commands.train",
            *train_argv,
            f"--gin_params=orbitask.run_experiment.strategy = '{strategy}'",
        ]
        self.out = out or sys.stdout
        self.lock = threading.Lock()
        self.relay = Relay(self.out, self.lock)
        self.signal_received = None
        self.procs: dict[tuple[str, int], subprocess.Popen] = {}
        self.relays: dict[int, threading.Thread] = {}  # by pid
        self.spec: dict = {}

    # ------------------------------------------------------------------------------ processes

    def say(self, text: str) -> None:
        with self.lock:
            self.relay.close_line()
            self.out.write(f"orbitask launch: {text}\n")
            self.out.flush()

    def _relay_output(self, role, proc) -> None:
        self.relay.follow(f"[{_name(role)}] ", proc.stdout)

    def start(self, role: tuple[str, int]) -> None:
        """Starts the process of `role` with its TF_CONFIG; its output is relayed, prefixed."""
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["TF_CONFIG"] = json.dumps(
            {"cluster": self.spec, "task": {"type": role[0], "index": role[1]}}
        )
        proc = subprocess.Popen(
            self.command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=_detached_dying_with(os.getpid()),
        )
        self.procs[role] = proc
        relay = threading.Thread(target=self._relay_output, args=(role, proc), daemon=True)
        relay.start()
        self.relays[proc.pid] = relay
        self.say(f"started {_name(role)} (pid {proc.pid})")

    def stop(self, roles=None, sig=signal.SIGKILL, grace: float = 0.0) -> None:
        """Sends `sig` to the running processes of `roles` (all by default); waits, then kills."""
        procs = [p for r, p in self.procs.items() if roles is None or r in roles]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(sig)
        deadline = time.monotonic() + grace
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for proc in procs:
            self.relays[proc.pid].join(timeout=5)  # the last lines of its output

    # ------------------------------------------------------------------------------------ job

    def run_job(self) -> int:
        """Runs the job once; returns 0, or the status of its first failure (others killed)."""
        self.spec = cluster_spec(self.roles, free_ports(len(self.roles)))
        self.procs = {}
        for role in self.roles:
            self.start(role)
        try:
            return self._watch()
        finally:
            self.stop()

    def _watch(self) -> int:
        program = [r for r in self.roles if r[0] == "chief"] if self.ps_mode else self.roles
        while True:
            if self.signal_received is not None:
                return self._relay_signal(program)
            done = {r: p.returncode for r, p in self.procs.items() if p.poll() is not None}
            for role, code in done.items():
                if code == 0 and role in program:
                    continue
                if self.ps_mode and role[0] == "worker":
                    self._worker_died(role, code)
                    continue
                if role in program and code in STOPPED:  # the others are saving the same step
                    self.say(f"{_name(role)} stopped with status {code}; waiting for the others")
                    self.stop(program, signal.SIGTERM, grace=GRACE_S)
                    return code
                status = _status(code) or 1  # a server task never ends by itself
                self.say(f"{_name(role)} exited with status {_status(code)}; stopping the job")
                return status
            if all(r in done for r in program):
                return 0
            time.sleep(0.1)

    def _worker_died(self, role, code) -> None:
        """PS mode: the coordinator re-runs the worker's work elsewhere; restart it if allowed."""
        if self.restarts_left > 0:
            self.restarts_left -= 1
            self.say(f"{_name(role)} exited with status {_status(code)}; restarting it in place")
            self.start(role)
            return
        self.say(f"{_name(role)} exited with status {_status(code)}; continuing without it")
        del self.procs[role]
        if not any(r[0] == "worker" for r in self.procs):
            raise _NoWorkers(_status(code))

    def _relay_signal(self, program) -> int:
        """Relays the signal to the program's processes (they save and exit), then stops the
        rest."""
        name = signal.Signals(self.signal_received).name
        self.say(f"{name} received; relaying it")
        self.stop(program, self.signal_received, grace=GRACE_S)
        codes = [_status(self.procs[r].returncode) for r in program]
        return next((c for c in codes if c), 0)

    def run(self) -> int:
        """Runs the job, restarting it after a failure while restarts remain; returns the status."""
        stops = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)  # as `actions.preemption`
        handlers = {s: signal.signal(s, self._on_signal) for s in stops}
        try:
            while True:
                try:
                    status = self.run_job()
                except _NoWorkers as e:
                    self.say("no worker left; stopping the job")
                    status = e.status
                if status in (0, *STOPPED) or self.signal_received is not None:
                    return self._ended(status)
                if self.restarts_left <= 0:
                    return self._ended(status)
                self.restarts_left -= 1
                used = self.max_restarts - self.restarts_left
                self.say(
                    f"restarting the job from its last checkpoint ({used}/{self.max_restarts})"
                )
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)

    def _ended(self, status: int) -> int:
        """Says how the job ended, as the launcher's last line; returns `status`."""
        if status == 0:
            self.say("the job finished")
        elif status in STOPPED:
            self.say(
                f"the job stopped and saved (status {status}); run the same command again to "
                "resume it"
            )
        else:
            self.say(f"the job failed with status {status}")
        return status

    def _on_signal(self, signum, frame) -> None:
        del frame
        if signum == signal.SIGINT and self.signal_received == signal.SIGINT:
            for proc in self.procs.values():  # a second Ctrl-C: the processes quit at once
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)
        if self.signal_received is None:
            self.signal_received = signum


class _NoWorkers(Exception):
    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


def main(argv: list[str], isolate=loopback_only) -> int:
    """Runs `orbitask launch` on `argv` (without the program name); returns the exit status.

    `isolate` gives the job its loopback-only network (`loopback_only`); it raises OSError when
    it cannot."""
    split = argv.index("--") if "--" in argv else len(argv)
    own, train_argv = argv[:split], argv[split + 1 :]
    try:
        args, unknown = _parser().parse_known_args(own)
        train_argv = unknown + train_argv
        for name, low in (("workers", 1), ("ps", 0), ("max_restarts", 0)):
            if getattr(args, name) < low:
                raise UsageError(f"--{name} must be >= {low}; received {getattr(args, name)}")
        if not train_argv:
            raise UsageError("give the training flags after --, e.g. -- --gin_file=... ")
    except UsageError as e:
        print(f"orbitask launch: error: {e}. See `orbitask launch --help`.", file=sys.stderr)
        return EXIT_USAGE
    if not args.allow_open_ports:
        try:
            isolate()
        except OSError as e:
            print(
                f"orbitask launch: error: cannot give the job a loopback-only network namespace "
                f"({e.strerror or e}), and TensorFlow's workers listen on every interface, "
                "unauthenticated. Run as root or where user namespaces are allowed, or pass "
                "--allow_open_ports to run on this machine's network.",
                file=sys.stderr,
            )
            return EXIT_USAGE
    return Launcher(args.workers, args.ps, args.max_restarts, train_argv).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
