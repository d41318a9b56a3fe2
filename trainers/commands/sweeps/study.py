"""A sweep's Optuna study, and which trial a process runs next.

Every trial Optuna counts is one run in `<sweep>/trial-<number>/`, whose folder, host and
values are the trial's user attributes. The process running a trial holds `flock` on
`trial-<number>/sweep.lock` for the trial's whole life; the kernel releases it when the process
dies, SIGKILL included. So a trial still RUNNING in the study whose lock is free was left by a
dead process, and `next_trial` gives it to this one: the same Optuna trial (never a new one),
its values as Optuna keeps them, its run resumed from its folder's newest checkpoint. A trial of
another host is left to that host (its folder is there). Claims are made under
`<sweep>/sweep.lock`, so that processes of one host never take the same trial or start more
than `--trials`.

Processes that open one new study at once (`--processes`, or sweeps on several machines with one
`--storage`) race to make its database's tables; Optuna fails the losers of that race, and
`open_study` opens again until the tables are there.
"""

from __future__ import annotations

import datetime
import fcntl
import os
import random
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from orbitask.common import files
from orbitask.trainers.state.model_dir_lock import FileLock

TRIAL_LOCK = "sweep.lock"
SUMMARY = "sweep.json"
UNCLAIMED_S = 60.0  # a RUNNING trial without a folder this old was left between ask and claim
OPEN_ATTEMPTS = 10  # tries at opening a study whose tables other processes are making


def open_study(folder: str, storage: str | None, name: str, direction: str, pruner: str) -> Any:
    """The study `name` in `storage` (None: SQLite in `<folder>/study.db`), made if new."""
    import optuna

    url = storage or "sqlite:///" + os.path.abspath(os.path.join(folder, "study.db"))
    pruners = {
        "median": optuna.pruners.MedianPruner,
        "hyperband": optuna.pruners.HyperbandPruner,
        "none": optuna.pruners.NopPruner,
    }
    from sqlalchemy import exc

    for attempt in range(OPEN_ATTEMPTS):
        try:
            return optuna.create_study(
                storage=url,
                study_name=name,
                direction=direction,
                pruner=pruners[pruner](),
                load_if_exists=True,
            )
        except (exc.IntegrityError, exc.OperationalError):
            # Another process made a table or the schema's version row first.
            if attempt == OPEN_ATTEMPTS - 1:
                raise
            time.sleep(random.uniform(0.05, 0.2) * (attempt + 1))


@contextmanager
def claims(folder: str) -> Iterator[None]:
    """Holds `<folder>/sweep.lock` (waiting for it): one claim at a time on this host."""
    fd = os.open(os.path.join(folder, TRIAL_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def next_trial(study: Any, folder: str, trials: int) -> tuple[Any, FileLock, bool] | None:
    """Claims the trial this process runs next: one a dead process of this host left RUNNING
    (`resumed` True), else a new one while the study has fewer than `trials`. Returns
    `(trial, its held lock, resumed)`, or None when there is nothing left to run."""
    import optuna

    running = optuna.trial.TrialState.RUNNING
    counted = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, running)
    with claims(folder):
        for frozen in study.get_trials(deepcopy=False, states=(running,)):
            lock = _adopt(study, frozen, folder)
            if lock is not None:
                return optuna.trial.Trial(study, frozen._trial_id), lock, True  # noqa: SLF001
        if len(study.get_trials(deepcopy=False, states=counted)) >= trials:
            return None
        trial = study.ask()
        path = trial_folder(folder, trial.number)
        files.makedirs(path)
        lock = FileLock(os.path.join(path, TRIAL_LOCK))
        lock.acquire()  # a new folder: free
        trial.set_user_attr("model_dir", path)
        trial.set_user_attr("host", socket.gethostname())
        return trial, lock, False


def _adopt(study: Any, frozen: Any, folder: str) -> FileLock | None:
    """The lock of RUNNING trial `frozen`, taken, when its process is dead; else None."""
    import optuna

    path = frozen.user_attrs.get("model_dir")
    if path is None:
        started = frozen.datetime_start or datetime.datetime.now()
        if (datetime.datetime.now() - started).total_seconds() < UNCLAIMED_S:
            return None  # another process is claiming it now
        path = trial_folder(folder, frozen.number)
        trial = optuna.trial.Trial(study, frozen._trial_id)  # noqa: SLF001
        trial.set_user_attr("model_dir", path)
        trial.set_user_attr("host", socket.gethostname())
    elif frozen.user_attrs.get("host") != socket.gethostname():
        return None
    files.makedirs(path)
    lock = FileLock(os.path.join(path, TRIAL_LOCK))
    return lock if lock.acquire() else None


def trial_folder(folder: str, number: int) -> str:
    return os.path.join(folder, f"trial-{number}")


def summary(study: Any, objective: Any) -> dict:
    """The study's state for `sweep.json` and the end of a sweep: trials by state, and the best
    trial (its number, value, step, bindings, checkpoint and folder), or None."""
    import optuna

    trials = study.get_trials(deepcopy=False)
    states: dict[str, int] = {}
    for one in trials:
        states[one.state.name.lower()] = states.get(one.state.name.lower(), 0) + 1
    done = [
        t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None
    ]
    top = None
    if done:
        sign = -1.0 if objective.higher_is_better else 1.0  # the earliest trial of equal ones
        chosen = min(done, key=lambda t: (sign * t.value, t.number))
        top = {
            "trial": chosen.number,
            "value": chosen.value,
            "step": chosen.user_attrs.get("best_step"),
            "bindings": chosen.user_attrs.get("bindings", []),
            "checkpoint": chosen.user_attrs.get("checkpoint"),
            "model_dir": chosen.user_attrs.get("model_dir"),
        }
    return {
        "study": study.study_name,
        "objective": objective.metric,
        "direction": objective.direction,
        "trials": states,
        "best": top,
    }


def write_summary(folder: str, found: dict) -> None:
    """Writes `<folder>/sweep.json` (what `orbitask report` reads)."""
    files.write_json(os.path.join(folder, SUMMARY), found)


def summary_lines(found: dict, folder: str) -> list[str]:
    """The lines saying a sweep's state and its best trial."""
    states = ", ".join(f"{n} {state}" for state, n in sorted(found["trials"].items()))
    lines = [
        f"sweep       {folder}: {sum(found['trials'].values())} trials ({states or 'none'}), "
        f"objective eval {found['objective']} ({found['direction']})"
    ]
    top = found.get("best")
    if top is None:
        return [*lines, "best trial  none complete yet"]
    lines.append(
        f"best trial  trial-{top['trial']}: eval {found['objective']} {top['value']:.6g} at step "
        f"{top['step']}, checkpoint {top['checkpoint'] or 'none kept'}"
    )
    lines.append(f"bindings    {'; '.join(top['bindings'])}")
    return lines


def report_lines(folders: list[str]) -> list[str]:
    """`summary_lines` of each of `folders` that holds a sweep's `sweep.json` (`orbitask
    report`), then an empty line; none when no folder does."""
    lines = []
    for folder in folders:
        found = files.read_json(os.path.join(folder, SUMMARY))
        if isinstance(found, dict) and "trials" in found:
            lines += [*summary_lines(found, folder), ""]
    return lines
