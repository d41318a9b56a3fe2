"""One trial of a sweep: a training run in its own folder, in this process, reporting each
evaluation of the objective to Optuna.

The trial's values are gin bindings parsed after the experiment's own, so they are in the run's
`operative_config.gin`. Its run is `run_experiment` in mode train_and_eval, as the binary runs
it: a trial that is run again (its process was killed) resumes from its folder's newest
checkpoint with the same values, which Optuna keeps with the trial. `Reporter`, a logger, hands
each evaluation of the objective to the trial; when the pruner says so it stops the run as an
early stop does (a checkpoint of that step saved, the run ended cleanly).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from orbitask.trainers.errors import ConfigError, EarlyStop
from orbitask.trainers.run import best
from orbitask.trainers.state.loggers import Logger


@dataclasses.dataclass(frozen=True)
class Objective:
    """What a sweep optimizes: an eval log (`metric`, a validation set's as `<set>/<name>`) and
    whether higher is better."""

    metric: str
    higher_is_better: bool

    @property
    def direction(self) -> str:
        return "maximize" if self.higher_is_better else "minimize"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a trial ended: its best value and step (None: nothing evaluated), the checkpoint of
    that step, and the step it was pruned at (None: not pruned)."""

    value: float | None
    step: int | None
    checkpoint: str | None
    pruned_at: int | None


class Reporter(Logger):
    """A logger handing each evaluation of `objective` to `trial` (once a step: a resumed run
    evaluates again the steps a killed one already reported), then asking its pruner."""

    def __init__(self, trial: Any, objective: Objective):
        self.trial = trial
        self.objective = objective
        self.pruned_at: int | None = None

    def write(self, step: int, split: str, scalars: Mapping[str, float]) -> None:
        head, _, name = split.partition("/")
        if head != "eval":
            return
        logs = {f"{name}/{key}" if name else key: value for key, value in scalars.items()}
        value = logs.get(self.objective.metric)
        if value is None or not math.isfinite(value):
            return
        reported = self.trial.storage.get_trial(self.trial._trial_id).intermediate_values  # noqa: SLF001
        if step not in reported:
            self.trial.report(float(value), int(step))
        if self.trial.should_prune():
            self.pruned_at = int(step)
            raise EarlyStop(
                f"trial {self.trial.number} pruned at step {step}: eval {self.objective.metric} "
                f"{value:.6g}"
            )


def bindings(trial: Any, params: list) -> list[str]:
    """The gin bindings of `trial`'s values, one per `params.Param` (asked of Optuna, or the
    values it keeps for a trial that ran before)."""
    return [f"{p.name} = {p.suggest(trial)}" for p in params]


def run(
    trial: Any,
    values: list[str],
    gin_files: list[str],
    gin_params: list[str],
    folder: str,
    objective: Objective,
) -> Outcome:
    """Runs `trial` in `folder`: the experiment of `gin_files` and `gin_params`, then the
    trial's `values` (its `bindings`). Eager; gin is cleared after.

    Raises:
      ConfigError: for a bad binding or setting (the trial's values included); `Preempted`
        and `Interrupted` on SIGTERM and Ctrl-C, the run saved.
    """
    import gin

    from orbitask.trainers.commands.train import build_task, parse_gin
    from orbitask.trainers.run.experiment import run_experiment

    try:
        parse_gin(gin_files, [*gin_params, *values])
        reporter = Reporter(trial, objective)
        loggers = [*_configured_loggers(), reporter]
        run_experiment(task=build_task(), model_dir=folder, mode="train_and_eval", loggers=loggers)
    finally:
        gin.clear_config()
    return _outcome(trial, folder, objective, reporter.pruned_at)


def _configured_loggers() -> list:
    """`orbitask.run_experiment.loggers` as gin binds it (its references built), or the
    default."""
    import gin

    from orbitask.trainers.run.settings import DECLARED

    try:
        found = gin.query_parameter("orbitask.run_experiment.loggers")
    except ValueError:
        found = DECLARED["loggers"].default
    found = list(found) if isinstance(found, (list, tuple)) else [found]
    built = []
    for item in found:
        if isinstance(item, gin.config.ConfigurableReference):
            item = item.scoped_configurable_fn() if item.evaluate else item.scoped_configurable_fn
        built.append(item)
    return built


def _outcome(trial: Any, folder: str, objective: Objective, pruned_at: int | None) -> Outcome:
    """The trial's best reported value (all its evaluations, its earlier processes' too)."""
    reported = trial.storage.get_trial(trial._trial_id).intermediate_values  # noqa: SLF001
    found = best.pick(
        [(step, {objective.metric: v}) for step, v in sorted(reported.items())],
        objective.metric,
        objective.higher_is_better,
    )
    if found is None:
        if pruned_at is None:
            raise ConfigError(
                f"trial {trial.number} evaluated no eval {objective.metric!r}; check "
                "--objective and that the experiment evaluates (eval_interval)."
            )
        return Outcome(None, None, None, pruned_at)
    value, step = found
    return Outcome(value, step, best.checkpoint_of(folder, step), pruned_at)
