"""The local launcher's process handling: TF_CONFIG, prefixes, first failure, restarts, signals.

The processes here are small Python programs that act out a plan (exit with a status, sleep, fail
once, save on SIGTERM), so each test takes about a second; the real binary under the launcher is
tested in test_multi_worker.py and test_parameter_server.py.
"""

import io
import json
import os
import signal
import sys
import threading
import time

import pytest

from orbitask.trainers.commands import cli, launch

# Acts out plan[role] for the role in its TF_CONFIG: "ok", "sleep", "exit N [AFTER_S]", "kill",
# "fail_once PATH" (fails while PATH does not exist, creating it), "term" (exit 75 on SIGTERM) or
# "save" (on SIGTERM: a second of saving, "saved", exit 75).
CHILD = r"""
import json, os, signal, sys, time
config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]
role = "chief" if task["type"] == "chief" else f"{task['type']} {task['index']}"
print("cluster", json.dumps(config["cluster"], sort_keys=True), flush=True)
action, _, arg = json.loads(sys.argv[1]).get(role, "sleep").partition(" ")
if action == "exit":
    code, _, delay = arg.partition(" ")
    time.sleep(float(delay or 0.3))
    sys.exit(int(code))
if action == "kill":
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGKILL)
if action == "fail_once" and not os.path.exists(arg):
    open(arg, "w").close()
    sys.exit(1)
def save(*args):
    time.sleep(1.0)
    print("saved", flush=True)
    sys.exit(75)
if action in ("term", "save"):
    signal.signal(signal.SIGTERM, save if action == "save" else lambda *a: sys.exit(75))
    print("ready", flush=True)
if action in ("sleep", "term", "save"):
    time.sleep(60)
"""


def launcher(plan, workers=2, ps=0, max_restarts=0):
    out = io.StringIO()
    runner = launch.Launcher(workers, ps, max_restarts, ["--model_dir=unused"], out=out)
    runner.command = [sys.executable, "-c", CHILD, json.dumps(plan)]
    return runner, out


def timed_run(runner):
    start = time.monotonic()
    status = runner.run()
    return status, time.monotonic() - start


def test_workers_get_tf_config_and_prefixed_output():
    runner, out = launcher({"worker 0": "ok", "worker 1": "ok"})
    assert runner.run() == 0
    text = out.getvalue()
    clusters = {line.split(" ", 3)[3] for line in text.splitlines() if "] cluster " in line}
    assert len(clusters) == 1  # every worker got the same cluster
    workers = json.loads(clusters.pop())["worker"]
    assert len(workers) == 2 and len(set(workers)) == 2
    assert all(w.startswith("127.0.0.1:") for w in workers)
    assert "[worker 0] cluster" in text and "[worker 1] cluster" in text
    assert text.splitlines()[-1] == "orbitask launch: the job finished"  # after every worker's


def test_the_binary_gets_the_strategy_of_the_cluster():
    command = launch.Launcher(2, 0, 0, ["--model_dir=x"]).command
    assert command[1:4] == ["-m", "orbitask.trainers.commands.train", "--model_dir=x"]
    assert command[-1] == "--gin_params=orbitask.run_experiment.strategy = 'multi_worker_mirrored'"
    command = launch.Launcher(2, 1, 0, ["--model_dir=x"]).command
    assert command[-1] == "--gin_params=orbitask.run_experiment.strategy = 'parameter_server'"


def test_first_failure_status_is_returned_and_the_others_killed():
    runner, out = launcher({"worker 0": "sleep", "worker 1": "exit 3"})
    status, seconds = timed_run(runner)
    assert status == 3 and seconds < 20
    assert all(p.poll() is not None for p in runner.procs.values())
    assert "worker 1 exited with status 3; stopping the job" in out.getvalue()


def test_a_process_killed_by_a_signal_gives_128_plus_the_signal():
    runner, _ = launcher({"worker 0": "sleep", "worker 1": "kill"})
    assert runner.run() == 128 + signal.SIGKILL


def test_max_restarts_restarts_the_whole_job(tmp_path):
    plan = {"worker 0": "ok", "worker 1": f"fail_once {tmp_path / 'failed'}"}
    runner, out = launcher(plan, max_restarts=1)
    assert runner.run() == 0
    text = out.getvalue()
    assert "restarting the job from its last checkpoint (1/1)" in text
    assert text.count("started worker 0") == 2

    (tmp_path / "failed").unlink()
    runner, _ = launcher(plan, max_restarts=0)
    assert runner.run() == 1


def test_parameter_server_job_survives_a_dead_worker():
    plan = {"chief": "exit 0 2", "worker 1": "exit 1"}  # worker 0 and ps 0 sleep (serve)
    runner, out = launcher(plan, workers=2, ps=1)
    status, seconds = timed_run(runner)
    assert status == 0 and seconds < 20
    text = out.getvalue()
    assert "worker 1 exited with status 1; continuing without it" in text
    cluster = json.loads(text.split("[chief] cluster ", 1)[1].splitlines()[0])
    assert sorted(cluster) == ["chief", "ps", "worker"] and len(cluster["worker"]) == 2


def test_parameter_server_worker_is_restarted_in_place():
    runner, out = launcher({"chief": "exit 0 2", "worker 1": "exit 1"}, workers=2, ps=1)
    runner.max_restarts = runner.restarts_left = 1
    assert runner.run() == 0
    assert "worker 1 exited with status 1; restarting it in place" in out.getvalue()


def signal_once_printed(out, lines, sig, timeout=60):
    """From a thread: sends `sig` to this process once every one of `lines` is in `out` (the
    launcher's output). Waits on the output, not on a clock; gives up after `timeout` seconds
    or once `stop` is set. Returns `stop` (a threading.Event)."""
    stop = threading.Event()

    def wait():
        deadline = time.monotonic() + timeout
        while not stop.wait(0.02) and time.monotonic() < deadline:
            if all(line in out.getvalue() for line in lines):
                os.kill(os.getpid(), sig)
                return

    threading.Thread(target=wait, daemon=True).start()
    return stop


def test_sigterm_is_relayed_and_the_save_status_returned():
    runner, out = launcher({"worker 0": "term", "worker 1": "term"})
    # SIGTERM once both workers have their handler (they print "ready" after installing it).
    ready = ["[worker 0] ready", "[worker 1] ready"]
    stop = signal_once_printed(out, ready, signal.SIGTERM)
    try:
        status, seconds = timed_run(runner)
    finally:
        stop.set()
    assert status == 75 and seconds < 20, out.getvalue()
    assert "SIGTERM received; relaying it" in out.getvalue()
    assert out.getvalue().splitlines()[-1] == (
        "orbitask launch: the job stopped and saved (status 75); run the same command again to "
        "resume it"
    )


def test_a_worker_stopped_by_its_own_sigterm_lets_the_others_save():
    """Worker 1 exits 75 (a SIGTERM of its own): worker 0, still saving, is not killed, and the
    stopped job is not restarted."""
    runner, out = launcher({"worker 0": "save", "worker 1": "exit 75 1"}, max_restarts=1)
    status, _ = timed_run(runner)
    text = out.getvalue()
    assert status == 75, text
    assert "worker 1 stopped with status 75; waiting for the others" in text
    assert "[worker 0] saved" in text  # relayed SIGTERM, then a second to save
    assert "restarting" not in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--workers", "0", "--", "--model_dir=x"], "--workers must be >= 1; received 0"),
        (["--workers", "2"], "give the training flags after --"),
        (["--workers", "two", "--", "x"], "invalid int value: 'two'"),
    ],
)
def test_usage_errors_are_one_line(argv, message, capsys):
    assert cli.main(["launch", *argv]) == launch.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_cluster_layouts():
    assert launch.cluster_roles(2, 0) == [("worker", 0), ("worker", 1)]
    roles = launch.cluster_roles(1, 2)
    assert roles == [("chief", 0), ("worker", 0), ("ps", 0), ("ps", 1)]
    spec = launch.cluster_spec(roles, [1, 2, 3, 4])
    assert spec == {
        "chief": ["127.0.0.1:1"],
        "worker": ["127.0.0.1:2"],
        "ps": ["127.0.0.1:3", "127.0.0.1:4"],
    }
    assert len(set(launch.free_ports(4))) == 4


def test_each_job_process_is_detached_from_the_terminal():
    """A terminal's Ctrl-C goes to its foreground process group: the job's processes are not in
    the launcher's, so each gets the launcher's relay alone (a second SIGINT ends a process at
    once); without a controlling terminal they still read it (next test)."""
    runner, out = launcher({"worker 0": "exit 0 1.0", "worker 1": "exit 0 1.0"})
    groups = {}

    def note():
        while len(groups) < 2:
            for role, proc in list(runner.procs.items()):
                if proc.poll() is None and role not in groups:
                    groups[role] = (proc.pid, os.getpgid(proc.pid), os.getsid(proc.pid))
            time.sleep(0.01)

    threading.Thread(target=note, daemon=True).start()
    assert runner.run() == 0, out.getvalue()
    assert sorted(groups) == [("worker", 0), ("worker", 1)]
    assert all(pid == group == sid != os.getpgid(0) for pid, group, sid in groups.values()), groups


PROMPTED = r"""
import sys
sys.path.insert(0, sys.argv[1])
from orbitask.trainers.commands import launch
runner = launch.Launcher(1, 0, 0, ["--model_dir=unused"])
runner.command = [sys.executable, "-c", "answer = input('(Pdb) '); print('read', answer)"]
sys.exit(runner.run())
"""


def test_a_job_process_reads_the_terminal_behind_its_prompt():
    """A `breakpoint()` in a launched process: its prompt shows before a line ends, and what is
    typed at the launcher's terminal reaches it (a process of a background group of the
    terminal would be stopped by SIGTTIN and the job would hang)."""
    import pty
    import select
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[1])
    pid, fd = pty.fork()
    if pid == 0:  # the launcher, with the terminal as its controlling terminal
        os.execv(sys.executable, [sys.executable, "-c", PROMPTED, repo])
    seen = b""

    def read_until(text: bytes, timeout: float) -> bool:
        nonlocal seen
        deadline = time.monotonic() + timeout
        while text not in seen and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    seen += os.read(fd, 1024)
                except OSError:  # the launcher closed the terminal
                    break
        return text in seen

    try:
        assert read_until(b"[worker 0] (Pdb) ", 20), seen
        os.write(fd, b"continue\n")
        assert read_until(b"[worker 0] read continue", 10), seen
        assert read_until(b"the job finished", 10), seen
    finally:
        if not os.waitpid(pid, os.WNOHANG)[0]:  # still running: a hung job
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)


def test_the_relay_keeps_each_line_whole_and_shows_a_prompt():
    """Two processes' output: lines arrive whole behind their prefix, `\\r` and `\\r\\n` end
    lines, a split UTF-8 character survives, and a prompt (an unfinished line) is shown after
    `PARTIAL_S`, its line ended before another process writes."""
    from orbitask.trainers.commands.relay import PARTIAL_S, Relay

    out = io.StringIO()
    relay = Relay(out, threading.Lock())
    pipes = {name: os.pipe() for name in ("a", "b")}
    threads = [
        threading.Thread(target=relay.follow, args=(f"[{name}] ", os.fdopen(read, "rb")))
        for name, (read, _) in pipes.items()
    ]
    for thread in threads:
        thread.start()

    def send(name: str, data: bytes, pause: float = 0.05) -> None:
        os.write(pipes[name][1], data)
        time.sleep(pause)

    send("a", b"one li")
    send("a", b"ne\r\ntwo\r")
    send("a", b"\nthree\rfour \xc3")
    send("a", b"\xa9\n")
    send("b", b"(Pdb) ", pause=PARTIAL_S + 0.3)
    send("a", b"five\n")
    send("b", b"read\n")
    send("a", b"last, unended")
    for _, write in pipes.values():
        os.close(write)
    for thread in threads:
        thread.join(timeout=5)
    assert out.getvalue().splitlines() == [
        "[a] one line",
        "[a] two",
        "[a] three",
        "[a] four \u00e9",
        "[b] (Pdb) ",
        "[a] five",
        "[b] read",
        "[a] last, unended",
    ], out.getvalue()


PARENT = r"""
import subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from trainers.commands.launch import _detached_dying_with
import os
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                         preexec_fn=_detached_dying_with(os.getpid()))
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl's death signal: Linux")
def test_the_job_dies_with_a_killed_launcher():
    """kill -9 of the launcher: its processes get SIGKILL too (Linux), none trains on alone."""
    import subprocess
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[1])
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, repo], stdout=subprocess.PIPE, text=True
    )
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    raise AssertionError("the launcher's process outlived it")
