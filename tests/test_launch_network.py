"""The local launcher's job listens on its own loopback only: TensorFlow's workers bind every
interface, so the launcher runs them in a network namespace whose only interface is loopback."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from orbitask.trainers.commands import cli, launch
from tests import launching


def _port(pid: int) -> int:
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
    config = json.loads(env[b"TF_CONFIG"])
    address = config["cluster"]["worker"][config["task"]["index"]]
    return int(address.rsplit(":", 1)[1])


@pytest.mark.slow
def test_the_workers_ports_are_reachable_from_the_jobs_loopback_only(tmp_path):
    flags = launching.train_flags(tmp_path / "model", 200)
    proc = launching.start(["--workers", "2"], flags, tmp_path)
    try:
        pids = [launching.pid_of(tmp_path, f"worker {i}", proc) for i in range(2)]
        ports = [_port(pid) for pid in pids]
        deadline = time.monotonic() + 120
        while not set(ports) <= launching.listening(pids[0]):  # each gRPC server is up
            assert proc.poll() is None and time.monotonic() < deadline, launching.output(tmp_path)
            time.sleep(0.1)
        here = os.readlink("/proc/self/ns/net")
        for pid in (proc.pid, *pids):
            assert os.readlink(f"/proc/{pid}/ns/net") != here
        assert not set(ports) & launching.listening("self")  # `ss -ltn` here does not show them
        for port in ports:
            with socket.socket() as s:
                assert s.connect_ex(("127.0.0.1", port)) != 0
        assert proc.wait(timeout=240) == 0, launching.output(tmp_path)[-3000:]
    finally:
        launching.stop(proc)
    assert launching.latest_step(tmp_path / "model") == 200


def test_without_a_namespace_the_launcher_stops_with_one_line(capsys):
    def refused():
        raise OSError(1, "Operation not permitted")

    status = launch.main(["--workers", "2", "--", "--model_dir=unused"], isolate=refused)
    assert status == launch.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "cannot give the job a loopback-only network namespace" in err
    assert "--allow_open_ports" in err


def test_allow_open_ports_is_a_launcher_flag(capsys):
    assert cli.main(["launch", "--allow_open_ports", "--workers", "0", "--", "x"]) == 2
    assert "--workers must be >= 1" in capsys.readouterr().err


NOT_ROOT = """
import ctypes, os, socket
from orbitask.trainers.commands import launch  # first: this Python's files may be root's only
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
ctypes.CDLL(None).prctl(4, 1)  # PR_SET_DUMPABLE: as a process started by that user would be
before = os.readlink("/proc/self/ns/net")
launch.loopback_only()
assert os.readlink("/proc/self/ns/net") != before
with socket.socket() as server:  # loopback is up in the new namespace
    server.bind(("127.0.0.1", 0))
    server.listen()
    with socket.socket() as client:
        assert client.connect_ex(server.getsockname()) == 0
print("isolated as", os.getuid())
"""


@pytest.mark.slow
def test_a_user_other_than_root_gets_a_user_and_network_namespace():
    """Not root, the launcher takes a user namespace with its network namespace; the test runs
    where the kernel lets an unprivileged user make them (util-linux `unshare -Urn` tells)."""
    if os.getuid() != 0:
        pytest.skip("needs root to become another user")
    nobody = dict(user=65534, group=65534, extra_groups=[])
    probe = subprocess.run(["unshare", "-Urn", "true"], capture_output=True, **nobody)
    if probe.returncode != 0:
        pytest.skip(f"this kernel refuses unprivileged namespaces: {probe.stderr.decode()}")
    proc = subprocess.run(
        [sys.executable, "-c", NOT_ROOT], capture_output=True, text=True, timeout=120,
        cwd="/", env={**os.environ, "HOME": "/tmp"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "isolated as 65534"
