"""Preemption and Ctrl-C: on SIGTERM, SIGHUP or SIGINT, stop at the next device-loop or
evaluation boundary, save, then exit 75 (SIGTERM, SIGHUP) or 130 (SIGINT).

`run_experiment.stop_signals` names the signals that stop a run (default SIGTERM, SIGINT,
SIGHUP); any other one there (SLURM's early `--signal=USR1@90`: SIGUSR1) stops it as SIGTERM
does. A training run's `max_time` (`actions.time_budget`) stops it the same way, exit 75, once one
more device loop and its save would not fit; with `requeue` the chief of a SLURM job then asks
SLURM to requeue it (`distribution.slurm.requeue`), after the save.

Schedulers and spot machines send SIGTERM before killing a job; a closed terminal (an ssh connection
that drops) sends SIGHUP, which stops and saves as SIGTERM does; stdout and stderr that were
that terminal (character devices) then go to /dev/null, as a write to a closed terminal fails.
Python runs signal handlers only between device loops (the main thread is inside TensorFlow
during one), so a run stops at most one
device loop after the signal: `steps_per_loop` train steps (about a second where quick loops have
grown, `loop_seconds`), or the evaluation's loop of steps under way. A run that trains saves a
checkpoint of that step first; the evaluation modes (`eval`, `continuous_eval`) write none, and
`continuous_eval` waiting for a new checkpoint stops at once; `--mode=predict` stops after the
shard under way (`trainers.run.predicting`). The run then raises `Preempted`,
which the binary turns into exit status 75 ("temporary failure: run the same command again to
resume"), or after SIGINT `Interrupted`, exit 130 with one line and no traceback.

Several workers (`multi_worker_mirrored`) stop together: after each device loop and evaluation
they agree on the signals received anywhere (`agree`, a collective), so a SIGTERM to one worker,
to each at its own moment, or to the launcher that relays it, stops every worker after the same
loop; they save that step once, together, and all exit 75 (130 when any received SIGINT).
TensorFlow's multi-worker runtime installs a SIGTERM handler of its own (its preemption notifier,
which only logs) when the strategy connects to the cluster; `take_back` installs this one again.

From the first signal on, the process ignores further SIGTERMs and SIGHUPs (`SIG_IGN`, which
holds while the interpreter shuts down): a scheduler's repeated SIGTERM must not turn exit 75
into 143. A
further SIGINT (a second Ctrl-C) ends the process at once (`SIG_DFL`), the save under way or not.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import threading
from collections.abc import Callable, Iterator

from absl import logging

from orbitask.trainers.actions import time_budget
from orbitask.trainers.actions.schedule import AGREED
from orbitask.trainers.actions.time_budget import TimeBudget
from orbitask.trainers.errors import Interrupted, Preempted

# The signals that stop a run by default, and `agree`'s codes (their index): the largest wins.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
MAX_TIME = "max_time"  # the code of a spent time budget: below every signal's


def codes_of(signals) -> tuple:
    """`agree`'s codes for `signals`: 0 none, then a spent `max_time`, the signals by number
    and SIGINT last (Ctrl-C anywhere gives every worker 130). The same on every worker."""
    others = sorted(s for s in signals if s != signal.SIGINT)
    return (None, MAX_TIME, *others, *[s for s in signals if s == signal.SIGINT])


def stop_signals(names) -> tuple[signal.Signals, ...]:
    """The signals of `names` (`run_experiment.stop_signals`: 'SIGTERM', 'SIGUSR1', ...)."""
    return tuple(dict.fromkeys(signal.Signals[name] for name in names))


CODES = codes_of(STOP_SIGNALS)


def _leave_closed_terminal() -> None:
    """Points stdout and stderr, where they are character devices (a terminal that SIGHUP says
    closed, or /dev/null), at /dev/null: a write to a closed terminal raises EIO, which would
    stop the run before its save. Eager, in the signal handler; returns None."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                if stat.S_ISCHR(os.fstat(fd).st_mode):
                    os.dup2(null, fd)
    finally:
        os.close(null)


class _SignalDuringWait(BaseException):
    """Raised by the handler inside `PreemptionWatcher.waiting` (a BaseException, so that no
    `except Exception` in the wait swallows it); `waiting` turns it into `Preempted`."""


class PreemptionWatcher:
    """An Orbit train and eval action that stops the run once a stop signal was received. Eager.

    Use as a context manager around the whole run: it installs the handler, and on leaving
    restores the previous one, unless a signal came (the process is on its way to exit 75, and
    further signals stay ignored).

    Args:
      current_step: returns the global step (after the last device loop).
      save: saves the training state at the current step, unless the newest checkpoint holds
        it, and returns that checkpoint's path; None where the run does not train.
      signals: the signals that stop the run (SIGINT raises `Interrupted`, the others
        `Preempted`).
      stopped: `stopped(signal_name, step) -> str`, the one line said where the run does not
        train (`save` None); None: an evaluation's line.
      budget: a training run's `TimeBudget` (`max_time`), checked after each device loop and
        evaluation; None: none.
      requeue: `requeue() -> str`, called after the save of a run stopped by a signal other
        than SIGINT or by `max_time`; its sentence ends the stop's line. None: nothing.

    Attributes:
      codes: `codes_of(signals)`, the values `agree` decides on.
      agree: None on one process; with several workers, a collective that returns the largest
        of every worker's argument (an index of `codes`).
    """

    def __init__(
        self,
        current_step: Callable[[], int],
        save: Callable[[], str] | None = None,
        signals: tuple = STOP_SIGNALS,
        stopped: Callable[[str, int], str] | None = None,
        budget: TimeBudget | None = None,
        requeue: Callable[[], str] | None = None,
    ):
        self.current_step = current_step
        self.save = save
        self.signals = tuple(signals)
        self.codes = codes_of(self.signals)
        self.stopped = stopped
        self.budget = budget
        self.requeue = requeue
        self.received: int | str | None = None
        self._signalled = False  # a signal came: the process is on its way out
        self.agree: Callable[[int], int] | None = None
        self._previous: dict = {}
        self._waiting = False

    def _stopping(self, signum: int) -> None:
        self._signalled = True
        for sig in self.signals:  # the run is stopping: a repeated SIGTERM changes nothing,
            # a second Ctrl-C quits at once
            signal.signal(sig, signal.SIG_DFL if sig == signal.SIGINT else signal.SIG_IGN)
        if self.received is None:
            self.received = signum

    def _handle(self, signum, frame):
        del frame
        if signum == signal.SIGHUP:
            _leave_closed_terminal()
        self._stopping(signum)
        if self._waiting:
            self._waiting = False
            raise _SignalDuringWait

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def take_back(self, agree: Callable[[int], int] | None = None) -> None:
        """Installs the handlers again, over any that the strategy's start installed (TensorFlow's
        multi-worker runtime), unless a signal came, and sets `agree` (its bound: `len(codes)`).
        Eager; call once the strategy is built."""
        self.agree = agree
        if not self._signalled and threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                signal.signal(sig, self._handle)

    def __exit__(self, *exc):
        if not self._signalled:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
        self._previous = {}
        return False

    def training_starts(self, step: int) -> None:
        """Before the first device loop (`Periodic.at_start`): the budget's first span starts."""
        if self.budget is not None:
            self.budget.training_starts(step)

    def vote(self) -> tuple[int, int]:
        """This worker's code for the workers' agreement (`Periodic.vote`, an index of `codes`)
        and its bound. Eager host Python."""
        return self._code(), len(self.codes)

    def _code(self) -> int:
        """This worker's code: its signal's, else `MAX_TIME`'s once a training run's budget is
        spent (checked here, once per device loop and evaluation), else 0."""
        budget = self.budget
        if self.received is None and budget is not None and self.save is not None:
            if budget.spent():
                self.received = MAX_TIME
        return self.codes.index(self.received)

    def __call__(self, output=None) -> None:
        """After each device loop of training and each evaluation: once a signal was received,
        on this worker or (`output[AGREED]`, the schedule's agreement on `vote`; else `agree`)
        on any, saves (where the run trains) and raises `Preempted`; else returns None."""
        code = (output or {}).get(AGREED)
        if code is None:
            own = self._code()
            if self.agree is not None:  # every worker, at the same point
                code = self.agree(own)
        if code is not None:  # the agreed code alone decides, the same on every worker: a
            # signal that came after this worker's vote stops them all at the next agreement
            agreed = self.codes[code]
            if agreed is None:
                return
            if agreed != MAX_TIME:
                self._stopping(agreed)  # where another worker's signal stops this one
            self.received = agreed  # the same exit status on every worker
        if self.received is None:
            return
        reason, step = self._reason(), self.current_step()
        stop = Interrupted if self.received == signal.SIGINT else Preempted
        if self.save is None and self.stopped is not None:
            message = self.stopped(reason.split()[0], step)
        elif self.save is None:
            message = (
                f"{reason}: stopped after the evaluation at step {step} (evaluation "
                "writes no checkpoint); run the same command again to go on evaluating."
            )
        else:
            if stop is Interrupted:
                print(
                    f"orbitask: Ctrl-C: saving step {step} (Ctrl-C again quits at once)",
                    flush=True,
                )
            path = self.save()
            message = (
                f"{reason}: saved checkpoint {path} at step {step}; run the same command "
                "again to resume from it."
            )
            if stop is Preempted and self.requeue is not None:
                message = " ".join(filter(None, (message, self.requeue())))
        logging.info("%s", message)  # the binary prints it, once
        raise stop(message)

    def _reason(self) -> str:
        """What stopped the run: `SIGTERM received`, ..., or `max_time (H:MM:SS) reached`."""
        if self.received == MAX_TIME:
            return f"max_time ({time_budget.describe(self.budget.seconds)}) reached"
        return f"{signal.Signals(self.received).name} received"

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """While open (a wait for a new checkpoint, which holds no state), a signal stops the
        run at once. Eager.

        Raises:
          Preempted: on a signal received before or while it is open.
        """
        try:
            try:
                self._waiting = True
                if self.received is not None:
                    raise _SignalDuringWait
                yield
            finally:  # a signal before this line still raises inside the outer `try`
                self._waiting = False
        except _SignalDuringWait:
            reason = self._reason()
            stop = Interrupted if self.received == signal.SIGINT else Preempted
            raise stop(
                f"{reason} while waiting for a checkpoint newer than step "
                f"{self.current_step()}; run the same command again to go on evaluating."
            ) from None
