"""The launcher's network: a loopback-only namespace for the job, and free ports on it."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def loopback_only() -> None:
    """Moves this process, and every process it starts from now on, into a new network
    namespace with only a loopback interface, and brings that interface up.

    Call it from the thread that starts the processes, before any of them starts.

    Raises:
      OSError: when the kernel refuses both a network namespace and a user + network one.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        first = ctypes.get_errno()
        uid, gid = os.getuid(), os.getgid()  # read before: unmapped ids read as 65534 after
        if first != errno.EPERM or libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
            code = ctypes.get_errno() if first == errno.EPERM else first
            raise OSError(code, f"unshare: {os.strerror(code)}")
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):  # fmt: skip
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def free_ports(n: int) -> list[int]:
    """`n` distinct free TCP ports on 127.0.0.1 (free when asked; the OS may reuse them later)."""
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
