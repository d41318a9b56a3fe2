"""The commands' exit statuses, and the one line on stderr each user mistake becomes.

A user mistake (a `ConfigError`, a `MissingBuilder`, gin's unbound `gin.REQUIRED`) is one line
and exit 2; a full disk, a loss that stayed non-finite and preemption have their own statuses.
Any other exception, from the user's own code included, keeps its traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

EXIT_USAGE = 2  # a user mistake, found before any work
EXIT_NONFINITE = 3  # the loss or gradient stayed non-finite after the NanGuard's rollbacks
EXIT_NO_SPACE = 4  # the disk filled during a save; the previous checkpoint is intact
EXIT_PREEMPTED = 75  # SIGTERM or SIGHUP: checkpoint saved, run the same command again to resume
EXIT_INTERRUPTED = 130  # SIGINT (Ctrl-C), as a shell reports it; the checkpoint saved as above
INTERRUPTED_OUTSIDE = "orbitask: interrupted (Ctrl-C) outside training; nothing saved"


def fail(message: object) -> int:
    """Prints the first line of `message` as `orbitask: error: ...` on stderr. Eager.

    Returns:
      `EXIT_USAGE`.
    """
    from orbitask.common.errors import one_line

    lines = str(message).strip().splitlines()
    print(f"orbitask: error: {one_line(lines[0]) if lines else 'error'}", file=sys.stderr)
    return EXIT_USAGE


def exit_status(error: Exception) -> int | None:
    """Reports `error` as one line on stderr when it is a mistake the commands expect. Eager.

    Returns:
      The exit status for `error`, or None when it is not such a mistake: the caller re-raises
      it, with its traceback.
    """
    from orbitask.common.errors import MissingBuilder, one_line
    from orbitask.trainers.errors import (
        ConfigError,
        Interrupted,
        NonFiniteLossError,
        NoSpaceError,
        Preempted,
    )

    if isinstance(error, NoSpaceError):
        fail(error)
        return EXIT_NO_SPACE
    if isinstance(error, ConfigError):
        return fail(error)
    if isinstance(error, NonFiniteLossError):
        fail(error)
        return EXIT_NONFINITE
    if isinstance(error, MissingBuilder):  # e.g. TASK = @orbitask.Task(): a builder is missing
        first = (str(error).strip().splitlines() or ["a builder is not implemented."])[0]
        return fail(f"{first} Fix TASK in your experiment's .gin file or the Task class.")
    if isinstance(error, Interrupted):
        lines = str(error).strip().splitlines()
        print(f"orbitask: interrupted: {lines[0] if lines else ''}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if isinstance(error, Preempted):
        lines = str(error).strip().splitlines()  # without gin's "In call to configurable" line
        print(f"orbitask: preempted: {lines[0] if lines else ''}", file=sys.stderr)
        return EXIT_PREEMPTED
    # gin raises RuntimeError for a required parameter that no file binds.
    if isinstance(error, RuntimeError) and (
        "gin.REQUIRED" in str(error) or "Required bindings" in str(error)
    ):
        return fail(f"bad gin config: {one_line(error) or type(error).__name__}")
    return None


def interruptible(main: Callable[[list[str]], int], argv: list[str]) -> int:
    """Runs a command's `main(argv)`; a Ctrl-C that no run's handler takes (while the command
    imports its modules at start-up) is one line and `EXIT_INTERRUPTED`. Eager; returns the
    status."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        print(INTERRUPTED_OUTSIDE, file=sys.stderr)
        return EXIT_INTERRUPTED


def run_reported(work: Callable[[], object]) -> int:
    """Runs `work()`, then clears gin's configuration whatever happened. Eager.

    Returns:
      0, or `exit_status` of the mistake `work` raised (reported in one line).

    Raises:
      Any other exception of `work`, with its traceback.
    """
    import gin

    try:
        work()
    except KeyboardInterrupt:  # Ctrl-C before a run's handler was installed (or after it)
        print(INTERRUPTED_OUTSIDE, file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:
        status = exit_status(e)
        if status is None:
            raise
        return status
    finally:
        gin.clear_config()
    return 0
