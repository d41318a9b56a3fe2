"""The launcher's output: each job process's output, line by line, behind its role's prefix.

    [worker 0] step 10: loss 0.3
    [worker 1] (Pdb)

A line is written when it ends. A line that stays unfinished for `PARTIAL_S` is a prompt waiting
for input (`input()`, `breakpoint()` in a process that reads the terminal): it is written as it
is, the answer typed at the terminal ends it, and the process's next output starts a prefixed
line (another process's output first ends the prompt's line). `\\r` ends a line, as `\\n` does.
"""

from __future__ import annotations

import codecs
import os
import select
import threading

PARTIAL_S = 0.2  # how long an unfinished line waits for its end before it is shown


class Relay:
    """Prefixed output of several processes into one stream, a process's lines kept whole.

    Args:
      out: the stream written to (text).
      lock: held while writing (shared with whoever else writes to `out`).
    """

    def __init__(self, out, lock: threading.Lock):
        self.out = out
        self.lock = lock
        self._open: str | None = None  # the prefix whose prompt `out` ends with

    def follow(self, prefix: str, stream) -> None:
        """Relays the binary pipe `stream` until it closes, behind `prefix`. Eager, blocking
        (a thread per process); returns None."""
        fd = stream.fileno()
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = ""
        while True:
            ready, _, _ = select.select([fd], [], [], PARTIAL_S if pending else None)
            if not ready:  # a prompt waiting for input: show it as it is
                ends = pending.endswith("\r")
                self._write(prefix, pending[:-1] if ends else pending, finished=ends)
                pending = ""
                continue
            chunk = os.read(fd, 65536)
            pending += decoder.decode(chunk, final=not chunk)
            held = "\r" if chunk and pending.endswith("\r") else ""  # "\r\n" split in two
            text = pending[: len(pending) - len(held)].replace("\r\n", "\n").replace("\r", "\n")
            *lines, pending = text.split("\n")
            for line in lines:
                self._write(prefix, line, finished=True)
            pending += held
            if not chunk:
                if pending:
                    self._write(prefix, pending, finished=True)
                return

    def _write(self, prefix: str, text: str, finished: bool) -> None:
        with self.lock:
            end = "\n" if finished else ""
            self.out.write(("\n" if self._open not in (None, prefix) else "") + prefix + text + end)
            self.out.flush()
            self._open = None if finished else prefix

    def close_line(self) -> None:
        """Ends an unfinished line before another writer's line (the caller holds `lock`)."""
        if self._open is not None:
            self.out.write("\n")
            self._open = None
