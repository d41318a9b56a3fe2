"""`Schedule`: all the work between device loops, as one ordered list of `Periodic` entries.

Each entry separates *what* from *when*, as CommonLoopUtils' `PeriodicAction` and Orbit's
`ConditionalAction` do: an action called with the device loop's output, a rule saying when it is
due, and whether the rule's due steps end a device loop. The Controller asks the schedule how far
the next device loop may run (`steps_until_due`) and, after the loop, runs the due entries in
order (`run`); before the first loop it runs each entry's `at_start` (`start`). A training run's
schedule, in order:

```text
entry            when                                              ends loops
callbacks        each callback's every_steps / at_step / seconds    yes (deferred ones: no)
metrics_window   multiples of metrics_window                       yes
learning_rate    every loop (a rate a callback assigned lasts)
results          every loop (the logs `run_experiment` returns)
progress         first loop, interval_s (local), last step; a terminal: every loop
profiler         steps first-1 and last; at start inside the window yes
nan_guard        condition: patience bad steps in a row (a rollback precedes any checkpoint)
preemption       every loop (after SIGTERM: saves and stops)
model_dir        every loop, the chief's training (a deleted model directory made again)
train_actions    every loop (Orbit's train actions, in order)
summaries        every loop (keeps train/ scalars, the steps/sec line)
summary_writes   first loop, the summary interval, 30 s (local)
checkpoint       checkpoint_interval steps, checkpoint_seconds      yes
evaluation       at start (the first evaluation); eval_interval     yes
                 steps and train_steps, eval_seconds
```

The Controller adds `train_actions`, `summaries`, `summary_writes`, `checkpoint` and, in
`train_and_evaluate`, `evaluation`; the runner builds the others (`run.entries.train_entries`).
A new periodic feature is one more entry.

Everything here is eager host Python on ints: it runs after every device loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from orbitask.trainers.actions import triggers
from orbitask.trainers.actions.triggers import Trigger

AGREED = "orbitask.agreed"  # the output key of a voting entry's agreed value (no log's name)


@dataclasses.dataclass(frozen=True)
class Periodic:
    """One entry of a `Schedule`: what runs after a device loop, and when.

    Args:
      name: what the entry is (`Schedule.names`).
      action: `action(output)` with the device loop's output dict.
      when: a `Trigger`: the action runs when a step rule has a due point after the step the
        loop started from and at or before the step now, or when the seconds rule is due on any
        worker.
        Anything else with `steps_until_due(step)` (a `CallbackAction`, the `Profiler`): the
        action runs after every loop and keeps its own finer rules. None: after every loop.
      ends_loop: device loops end at the step rules' due points (`when.steps_until_due`).
      local: the seconds rule reads this process's clock alone (work only the chief does, or
        that each worker does for itself); otherwise every worker runs it when any is due.
      at_start: `at_start(step)` once before the first device loop, with the step training
        starts from (`Schedule.start`); None: nothing.
      vote: `vote() -> (value, bound)`, this worker's value (an int in [0, bound)) that every
        worker must agree on after each device loop; with several workers `action` gets the
        largest of them as `output[AGREED]`, read before any entry ran. None: no vote.
    """

    name: str
    action: Callable[[dict], Any]
    when: Trigger | triggers.DuePoints | None = None
    ends_loop: bool = False
    local: bool = False
    at_start: Callable[[int], Any] | None = None
    vote: Callable[[], tuple[int, int]] | None = None


class Schedule:
    """The ordered `Periodic` entries run between device loops.

    Args:
      entries: the entries, in the order they run.
      current_step: `current_step() -> int`, the global step now (an earlier entry may move it:
        a NaN rollback, `go_back`).
      agree: `agree(votes) -> values`, for each `(value, bound)` the largest value over the
        workers (`cluster.largest_each`: one collective under `multi_worker_mirrored`), called
        once after each device loop with the entries' votes and their seconds rules' clocks: a
        seconds rule is due on every worker when it is due on any. None: this process alone.
    """

    def __init__(
        self,
        entries: Iterable[Periodic],
        current_step: Callable[[], int],
        agree: Callable[[list[tuple[int, int]]], list[int]] | None = None,
    ):
        self.entries = list(entries)
        self.current_step = current_step
        self.agree = agree
        self.running: str | None = None  # the entry under way (or that raised)
        self._ending: list[triggers.DuePoints] = []
        self._update()

    def _update(self) -> None:
        self._ending = [e.when for e in self.entries if e.ends_loop and e.when is not None]

    @property
    def names(self) -> list[str]:
        """The entries' names, in order."""
        return [entry.name for entry in self.entries]

    @contextlib.contextmanager
    def including(self, entry: Periodic) -> Iterator[None]:
        """Runs `entry` last while the block runs (`train_and_evaluate`'s evaluation)."""
        self.entries.append(entry)
        self._update()
        try:
            yield
        finally:
            self.entries.remove(entry)
            self._update()

    def steps_until_due(self, step: int) -> int | None:
        """Steps from `step` to the nearest due step of a loop-ending entry, or None. Eager
        host Python, before every device loop."""
        return triggers.steps_until_any(self._ending, step)

    def start(self, step: int) -> None:
        """Before the first device loop: runs each entry's `at_start(step)`, in order. Eager;
        None."""
        for entry in self.entries:
            if entry.at_start is not None:
                self.running = entry.name
                entry.at_start(step)
        self.running = None

    def run(self, output: dict, start: int) -> None:
        """After a device loop that started at step `start`: runs every due entry, in order,
        with the loop's `output`, and records each `Trigger` entry's run. Eager; None."""
        agreed = self._agreed()
        for i, entry in enumerate(self.entries):
            when = entry.when
            self.running = entry.name  # left set when it raises (`trainers.engine.step_errors`)
            vote = agreed.get((i, "vote"))
            given = output if vote is None else {**output, AGREED: vote}
            if not isinstance(when, Trigger):
                entry.action(given)
                continue
            step = self.current_step()
            if self._due(when, start, step, agreed.get((i, "clock"))):
                entry.action(given)
                when.fired(step)
        self.running = None

    def _agreed(self) -> dict[tuple[int, str], int]:
        """Every worker's agreement after a loop, in one `agree` call: each entry's vote, and
        whether each shared seconds rule is due on any worker's clock. Empty without `agree`
        (one process: each entry reads its own state and clock at its turn)."""
        if self.agree is None:
            return {}
        votes = {}
        for i, entry in enumerate(self.entries):
            if entry.vote is not None:
                votes[i, "vote"] = entry.vote()
            clock = isinstance(entry.when, Trigger) and entry.when.every_secs is not None
            if clock and not entry.local:
                votes[i, "clock"] = (int(entry.when.time_due()), 2)
        return dict(zip(votes, self.agree(list(votes.values())) if votes else [], strict=True))

    def _due(self, trigger: Trigger, start: int, step: int, agreed_clock: int | None) -> bool:
        # Step rules and states agree on every worker; a local clock is this worker's.
        if (step > start and trigger.step_due(step, since=start)) or trigger.state_due():
            return True
        if trigger.every_secs is None:
            return False
        return trigger.time_due() if agreed_clock is None else bool(agreed_clock)
