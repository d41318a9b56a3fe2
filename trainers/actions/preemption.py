"""Preemption and Ctrl-C: on SIGTERM, SIGHUP or SIGINT, stop at the next device-loop or
evaluation boundary, save, then exit 75 (SIGTERM, SIGHUP) or 130 (SIGINT).

Schedulers and spot machines send SIGTERM before killing a job; a closed terminal (an ssh session
that drops) sends SIGHUP, which stops and saves as SIGTERM does. Python runs signal handlers only
between device loops (the main thread is inside TensorFlow during one), so a run stops at most one
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
import signal
import threading
from collections.abc import Callable, Iterator

from absl import logging

from orbitask.trainers.actions.schedule import AGREED
from orbitask.trainers.errors import Interrupted, Preempted

# The signals that stop a run, and `agree`'s codes (their index): the largest one wins.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
CODES = (None, *STOP_SIGNALS)


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

    Attributes:
      agree: None on one process; with several workers, a collective that returns the largest
        of every worker's argument (0: no signal, 1: SIGTERM, 2: SIGHUP, 3: SIGINT).
    """

    def __init__(
        self,
        current_step: Callable[[], int],
        save: Callable[[], str] | None = None,
        signals: tuple = STOP_SIGNALS,
        stopped: Callable[[str, int], str] | None = None,
    ):
        self.current_step = current_step
        self.save = save
        self.signals = tuple(signals)
        self.stopped = stopped
        self.received: int | None = None
        self.agree: Callable[[int], int] | None = None
        self._previous: dict = {}
        self._waiting = False

    def _stopping(self, signum: int) -> None:
        for sig in self.signals:  # the run is stopping: a repeated SIGTERM changes nothing,
            # a second Ctrl-C quits at once
            signal.signal(sig, signal.SIG_DFL if sig == signal.SIGINT else signal.SIG_IGN)
        if self.received is None:
            self.received = signum

    def _handle(self, signum, frame):
        del frame
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
        multi-worker runtime), unless a signal came, and sets `agree`. Eager; call once the
        strategy is built."""
        self.agree = agree
        if self.received is None and threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                signal.signal(sig, self._handle)

    def __exit__(self, *exc):
        if self.received is None:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
        self._previous = {}
        return False

    def vote(self) -> tuple[int, int]:
        """This worker's code for the workers' agreement (`Periodic.vote`): 0 no signal, 1
        SIGTERM, 2 SIGHUP, 3 SIGINT, and the bound 4. Eager host Python."""
        return CODES.index(self.received), len(CODES)

    def __call__(self, output=None) -> None:
        """After each device loop of training and each evaluation: once a signal was received,
        on this worker or (`output[AGREED]`, the schedule's agreement on `vote`; else `agree`)
        on any, saves (where the run trains) and raises `Preempted`; else returns None."""
        code = (output or {}).get(AGREED)
        if code is None and self.agree is not None:  # every worker, at the same point
            code = self.agree(CODES.index(self.received))
        if code is not None:  # the agreed code alone decides, the same on every worker: a
            # signal that came after this worker's vote stops them all at the next agreement
            agreed = CODES[code]
            if agreed is None:
                return
            self._stopping(agreed)  # where another worker's signal stops this one
            self.received = agreed  # the same exit status on every worker
        if self.received is None:
            return
        name, step = signal.Signals(self.received).name, self.current_step()
        stop = Interrupted if self.received == signal.SIGINT else Preempted
        if self.save is None and self.stopped is not None:
            message = self.stopped(name, step)
        elif self.save is None:
            message = (
                f"{name} received: stopped after the evaluation at step {step} (evaluation "
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
                f"{name} received: saved checkpoint {path} at step {step}; run the same command "
                "again to resume from it."
            )
        logging.info("%s", message)  # the binary prints it, once
        raise stop(message)

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
            name = signal.Signals(self.received).name
            stop = Interrupted if self.received == signal.SIGINT else Preempted
            raise stop(
                f"{name} received while waiting for a checkpoint newer than step "
                f"{self.current_step()}; run the same command again to go on evaluating."
            ) from None
