"""`Sweep`: the loop of `orbitask sweep` in one process: claim a trial, run it, tell Optuna.

A trial ends complete (its value: the best evaluation of the objective it reported), pruned
(`trial.Reporter` stopped it; its folder keeps the checkpoint of that step) or failed (its run
raised: the sweep stops with that error, and the trial does not count). SIGTERM and Ctrl-C end
the run as they end any run (a checkpoint saved, `Preempted` / `Interrupted`) and leave the trial
RUNNING in the study, so that the next sweep on this host resumes it (`study.next_trial`).
"""

from __future__ import annotations

import os
from typing import Any

from orbitask.common import files
from orbitask.trainers.commands.sweeps import params as params_lib
from orbitask.trainers.commands.sweeps import study as study_lib
from orbitask.trainers.commands.sweeps import trial as trial_lib
from orbitask.trainers.errors import ConfigError, Interrupted, Preempted
from orbitask.trainers.run import best, messages


class Sweep:
    """The sweep of `orbitask sweep`'s flags (named as they are; `params` the `--param` texts).

    Raises:
      ConfigError: from the constructor, for a bad `--param`.
    """

    def __init__(
        self, gin_files, gin_params, folder, trials, params, objective=None, direction=None,
        pruner="median", storage=None, study_name=None,
    ):  # fmt: skip
        self.params = params_lib.parse_all(list(params))
        self.gin_files, self.gin_params = list(gin_files), list(gin_params)
        self.folder, self.trials, self.pruner, self.storage = folder, trials, pruner, storage
        self.study_name = study_name or os.path.basename(os.path.abspath(folder))
        self.objective_name, self.direction = objective, direction

    def run(self) -> dict:
        """Runs trials until the study has `trials` complete or pruned ones (this process's
        share of them); prints and returns the summary (`study.summary`). Eager."""
        objective = self.objective()
        files.makedirs(self.folder)
        study = study_lib.open_study(
            self.folder, self.storage, self.study_name, objective.direction, self.pruner
        )
        if study.direction.name.lower() != objective.direction:
            raise ConfigError(
                f"the study {self.study_name!r} maximizes or minimizes otherwise "
                f"({study.direction.name.lower()}); pass --direction="
                f"{study.direction.name.lower()} or another --model_dir or --study_name."
            )
        while (claimed := study_lib.next_trial(study, self.folder, self.trials)) is not None:
            trial, lock, resumed = claimed
            try:
                self.run_trial(study, trial, resumed, objective)
            finally:
                lock.release()
            study_lib.write_summary(self.folder, study_lib.summary(study, objective))
        found = study_lib.summary(study, objective)
        study_lib.write_summary(self.folder, found)
        print("\n".join(study_lib.summary_lines(found, self.folder)), flush=True)
        print(_table(self.folder, objective.metric), flush=True)
        return found

    def run_trial(self, study: Any, trial: Any, resumed: bool, objective) -> None:
        """Runs one claimed trial and tells the study how it ended. Eager."""
        import optuna

        folder = trial.user_attrs["model_dir"]
        values = trial_lib.bindings(trial, self.params)
        trial.set_user_attr("bindings", values)
        how = "resumed" if resumed else "started"
        messages.say(f"trial {trial.number} {how} in {folder}: {'; '.join(values)}")
        try:
            outcome = trial_lib.run(
                trial, values, self.gin_files, self.gin_params, folder, objective
            )
        except (Preempted, Interrupted):
            raise  # left RUNNING: the next sweep resumes it
        except BaseException:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise
        if outcome.step is not None:
            trial.set_user_attr("best_step", outcome.step)
            trial.set_user_attr("checkpoint", outcome.checkpoint)
        if outcome.pruned_at is not None:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            messages.say(f"trial {trial.number} pruned at step {outcome.pruned_at}")
            return
        study.tell(trial, outcome.value)
        messages.say(
            f"trial {trial.number} complete: eval {objective.metric} {outcome.value:.6g} at "
            f"step {outcome.step}"
        )

    def objective(self) -> trial_lib.Objective:
        """`--objective` and `--direction`, else the experiment's `ValidationControl`'s.

        Raises:
          ConfigError: when neither names one.
        """
        if self.objective_name:
            name = self.objective_name
            metric = name[len("eval/") :] if name.startswith("eval/") else name
            higher = not best.minimised(metric)
            if self.direction:
                higher = self.direction == "maximize"
            return trial_lib.Objective(metric, higher)
        control = _validation_control(self.gin_files, self.gin_params)
        if control is None:
            raise ConfigError(
                "orbitask sweep needs an objective: pass --objective=eval/accuracy (and "
                "--direction), or set orbitask.run_experiment.validation_control in the .gin file."
            )
        higher = control.higher_is_better
        if self.direction:
            higher = self.direction == "maximize"
        return trial_lib.Objective(control.metric, higher)


def _validation_control(gin_files: list[str], gin_params: list[str]) -> Any:
    """The experiment's `ValidationControl` (built), or None."""
    import gin

    from orbitask.trainers.commands.train import parse_gin

    parse_gin(gin_files, gin_params)
    try:
        found = gin.query_parameter("orbitask.run_experiment.validation_control")
    except ValueError:
        found = None
    try:
        if isinstance(found, gin.config.ConfigurableReference):
            found = found.scoped_configurable_fn()
    finally:
        gin.clear_config()
    return found


def _table(folder: str, metric: str) -> str:
    """`orbitask report`'s table and plot of the sweep's trials (`several_runs.report_runs`)."""
    from orbitask.trainers.commands import report, several_runs

    try:
        runs = several_runs.find_runs([folder])
        return several_runs.report_runs(runs, None, metric)
    except report.ReportError as e:
        return f"no table of the trials: {e}"
