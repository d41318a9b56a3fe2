"""`run_experiment`: the public entry point and gin's `orbitask.run_experiment.*` bindings.

Its arguments: `task`, an `orbitask.Task`, or a Model Garden task as it is
(docs/porting_from_model_garden.md), whose `ExperimentConfig` `params` then gives the optimizer
and schedule. `mode`: train, eval, train_and_eval, continuous_eval, eval_all (every checkpoint,
oldest first) or predict (`predicting`: the model over `build_predict_inputs`, into
`predictions/`). `eval_checkpoint`: the `ckpt-N` that mode eval or predict uses (None: the
newest). `output_dir`: where an evaluation mode writes `eval/` (None: `model_dir`; predict:
`predictions/` goes there), so that `model_dir` may be read-only. `summary_dir`: where
TensorBoard's `train/` and `eval/` go (None: `model_dir`, `output_dir`), a platform's TensorBoard
folder; the loggers' files stay in `model_dir`. `fast_dev_run`: one training
step and one evaluation step (`fast_dev_run`; predict: one prediction step), nothing written to
`model_dir`. Every other argument is a setting, keyword-only, declared once in
`trainers.run.settings` (its default, rule, group and doc line): the signature lists them from
those declarations (gin binds by it), `run_experiment` groups them into `Settings` by name, and
configs/defaults.gin lists them all.

It returns `{"train": logs, "eval": logs, "best": best}`, plus `"export"` (the SavedModel folder)
when one was written, `"evaluated"` (`{"checkpoint", "step", "eval"}` each) for eval_checkpoint or
eval_all, `"predict"` in mode predict. `best` is a `trainers.run.best.Best` (the ranked metric,
its best value, that step and its checkpoint; the run prints it last), or None when the run
evaluated nothing (mode train, `fast_dev_run`, a worker other than the chief).
"""

from __future__ import annotations

import inspect
import tempfile
from dataclasses import replace
from typing import Any

import gin

from orbitask.common import files, setting_rules
from orbitask.tasks import model_garden
from orbitask.trainers import compat
from orbitask.trainers.errors import ConfigError
from orbitask.trainers.run import messages, predicting
from orbitask.trainers.run.runner import ExperimentRunner
from orbitask.trainers.run.settings import DECLARED, Settings, grouped


def run_experiment(
    task: Any = gin.REQUIRED,
    model_dir: str = gin.REQUIRED,
    mode: str = "train_and_eval",
    eval_checkpoint: str | None = None,
    output_dir: str | None = None,
    summary_dir: str | None = None,
    fast_dev_run: bool = False,
    *,
    params: Any = None,
    **settings: Any,
) -> dict:
    """Trains, evaluates or predicts with `task` under `model_dir` (the module docstring); eager.
    Returns `{"train": logs, "eval": logs, ...}`; a bad setting: `ConfigError`, before any work.
    `settings`: the keyword arguments its signature lists after `fast_dev_run`."""
    chosen = _settings(settings)
    task = task if params is None else model_garden.with_experiment(task, params)
    return _run(
        task, model_dir, mode, chosen, eval_checkpoint, output_dir, fast_dev_run, summary_dir
    )


def _signature(fn: Any) -> inspect.Signature:
    """`fn`'s signature with `**settings` replaced by each declared setting, keyword-only, with
    its default (train_steps: gin.REQUIRED) and type, before `params`: what gin binds by, and
    what `inspect.signature` and `help` show."""
    own = [p for p in inspect.signature(fn).parameters.values() if p.kind != p.VAR_KEYWORD]
    settings = [
        inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type
        )
        for name, f in DECLARED.items()
    ]
    return inspect.Signature([*own[:-1], *settings, own[-1]], return_annotation=dict)


run_experiment.__signature__ = _signature(run_experiment)
run_experiment = gin.configurable("run_experiment", module="orbitask")(run_experiment)


def _settings(values: dict[str, Any]) -> Settings:
    """Groups `run_experiment`'s setting arguments by name (one left out keeps its default;
    `train_steps` is None where `train_epochs` is set and it is not). Eager.

    Raises:
      ConfigError: naming the arguments that are no setting.
    """
    if unknown := sorted(set(values) - set(DECLARED)):
        raise ConfigError(
            f"run_experiment got unexpected keyword arguments {unknown}; its settings are "
            "listed in configs/defaults.gin."
        )
    if (
        values.get("train_steps", gin.REQUIRED) is gin.REQUIRED
        and values.get("train_epochs") is not None
    ):
        values = {**values, "train_steps": None}  # epochs set: TRAIN_STEPS need not be
    return grouped(values)


def _run(task, model_dir, mode, settings, chosen, output_dir, quick, summary_dir) -> dict:
    """Runs `mode` (`quick`: `fast_dev_run`), before any work checking that flag. Eager; returns
    the run's results."""
    setting_rules.check("run_experiment", {"fast_dev_run": quick})
    files.check_scheme(model_dir, "--model_dir")
    files.check_scheme(output_dir, "--output_dir")
    files.check_scheme(summary_dir, "summary_dir")
    with compat.custom_gradients_released():  # the run's step graphs go with it
        if mode == "predict":
            return predicting.predict(task, model_dir, settings, chosen, output_dir, quick)
        if quick:
            return _fast_dev_run(task, model_dir, mode, settings, chosen)
        dirs = {"output_dir": output_dir, "summary_dir": summary_dir}
        runner = ExperimentRunner(task, model_dir, mode, settings, eval_checkpoint=chosen, **dirs)
        return runner.run()


def _fast_dev_run(
    task: Any, model_dir: str, mode: str, settings: Settings, chosen: str | None
) -> dict:
    """One training step and one evaluation step (an evaluation mode: one evaluation step of the
    model directory's checkpoint), written to a temporary folder that is then removed; says what
    ran in one line. Eager; returns the run's logs."""
    loop = replace(settings.loop, train_steps=1, train_epochs=None, progress=False)
    evaluation = replace(
        settings.evaluation, eval_steps=1, eval_interval=None, eval_seconds=None,
        eval_at_start=False,
    )  # fmt: skip
    features = replace(settings.features, export_at_end=False)
    settings = replace(settings, loop=loop, evaluation=evaluation, features=features)
    trains = mode in ("train", "train_and_eval")
    with tempfile.TemporaryDirectory(prefix="orbitask-fast-dev-run-") as folder:
        if trains:
            runner = ExperimentRunner(task, folder, "train_and_eval", settings)
        else:
            runner = ExperimentRunner(task, model_dir, mode, settings, chosen, output_dir=folder)
        results = runner.run()
    results["best"] = None  # its checkpoint was in the folder just removed
    ran = "one training step and one evaluation step" if trains else "one evaluation step"
    messages.say(f"fast_dev_run: {ran} ran; nothing was written to {model_dir}")
    return results
