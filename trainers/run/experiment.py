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
`model_dir`. Every other argument is the field of that name of one group in `settings`
(`LoopSettings`, ...), documented there, and is handed to it by name; configs/defaults.gin lists
them all.

It returns `{"train": logs, "eval": logs, "best": best}`, plus `"export"` (the SavedModel folder)
when one was written, `"evaluated"` (`{"checkpoint", "step", "eval"}` each) for eval_checkpoint or
eval_all, `"predict"` in mode predict. `best` is a `trainers.run.best.Best` (the ranked metric,
its best value, that step and its checkpoint; the run prints it last), or None when the run
evaluated nothing (mode train, `fast_dev_run`, a worker other than the chief).
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from typing import Any

import gin

from orbitask.common import files, setting_rules
from orbitask.tasks import model_garden
from orbitask.trainers import compat
from orbitask.trainers.run import messages, predicting
from orbitask.trainers.run.runner import ExperimentRunner
from orbitask.trainers.run.settings import (
    CheckpointSettings,
    DistributionSettings,
    EvalSettings,
    FeatureSettings,
    LoopSettings,
    Settings,
    defaults,
)

_D = defaults()  # every setting's default has one home: the settings' groups


@gin.configurable("run_experiment", module="orbitask")
def run_experiment(
    task: Any = gin.REQUIRED,
    model_dir: str = gin.REQUIRED,
    mode: str = "train_and_eval",
    eval_checkpoint: str | None = None,
    output_dir: str | None = None,
    summary_dir: str | None = None,
    fast_dev_run: bool = False,
    train_steps: int | None = gin.REQUIRED,
    train_epochs: int | None = _D["train_epochs"],
    global_batch_size: int = _D["global_batch_size"],
    learning_rate: Any = _D["learning_rate"],
    steps_per_loop: int = _D["steps_per_loop"],
    loop_seconds: float | None = _D["loop_seconds"],
    metrics_window: int | None = _D["metrics_window"],
    eval_interval: int | None = _D["eval_interval"],
    eval_seconds: float | None = _D["eval_seconds"],
    eval_steps: int | None = _D["eval_steps"],
    checkpoint_interval: int | None = _D["checkpoint_interval"],
    checkpoint_seconds: float | None = _D["checkpoint_seconds"],
    max_to_keep: int | None = _D["max_to_keep"],
    keep_input_positions: int = _D["keep_input_positions"],
    train_prefetch: int | None = _D["train_prefetch"],
    train_prefetch_bytes: int | None = _D["train_prefetch_bytes"],
    async_checkpoints: bool = _D["async_checkpoints"],
    max_time: float | str | None = _D["max_time"],
    stop_signals: Any = _D["stop_signals"],
    requeue: bool = _D["requeue"],
    strategy: Any = _D["strategy"],
    use_tf_while_loop: bool = _D["use_tf_while_loop"],
    progress: bool = _D["progress"],
    continuous_eval_timeout: float | None = _D["continuous_eval_timeout"],
    nan_guard: Any = _D["nan_guard"],
    seed: int | None = _D["seed"],
    cpu_devices: int | None = _D["cpu_devices"],
    gradient_accumulation_steps: int = _D["gradient_accumulation_steps"],
    validation_control: Any = _D["validation_control"],
    eval_at_start: bool = _D["eval_at_start"],
    jit_compile: bool = _D["jit_compile"],
    run_eagerly: bool = _D["run_eagerly"],
    histogram_interval: int | None = _D["histogram_interval"],
    profile_steps: Any = _D["profile_steps"],
    warm_start: Any = _D["warm_start"],
    mixed_precision: str | None = _D["mixed_precision"],
    ema: Any = _D["ema"],
    export_at_end: bool = _D["export_at_end"],
    loggers: Any = _D["loggers"],
    params: Any = None,
) -> dict:
    """Trains, evaluates or predicts with `task` under `model_dir` (the module docstring); eager.
    Returns `{"train": logs, "eval": logs, ...}`; a bad setting: `ConfigError`, before any work."""
    settings = Settings(
        loop=LoopSettings(
            train_steps=_steps(train_steps, train_epochs), train_epochs=train_epochs,
            global_batch_size=global_batch_size, learning_rate=learning_rate,
            steps_per_loop=steps_per_loop, loop_seconds=loop_seconds,
            metrics_window=metrics_window, use_tf_while_loop=use_tf_while_loop,
            jit_compile=jit_compile, run_eagerly=run_eagerly,
            gradient_accumulation_steps=gradient_accumulation_steps, seed=seed, progress=progress,
        ),
        checkpoints=CheckpointSettings(
            checkpoint_interval=checkpoint_interval, checkpoint_seconds=checkpoint_seconds,
            max_to_keep=max_to_keep, warm_start=warm_start,
            keep_input_positions=keep_input_positions, train_prefetch=train_prefetch,
            train_prefetch_bytes=train_prefetch_bytes, async_checkpoints=async_checkpoints,
            max_time=max_time, stop_signals=stop_signals, requeue=requeue,
        ),
        evaluation=EvalSettings(
            eval_interval=eval_interval, eval_seconds=eval_seconds, eval_steps=eval_steps,
            continuous_eval_timeout=continuous_eval_timeout,
            validation_control=validation_control, eval_at_start=eval_at_start,
        ),
        distribution=DistributionSettings(strategy=strategy, cpu_devices=cpu_devices),
        features=FeatureSettings(
            nan_guard=nan_guard, mixed_precision=mixed_precision, ema=ema,
            histogram_interval=histogram_interval, profile_steps=profile_steps,
            export_at_end=export_at_end, loggers=loggers,
        ),
    )  # fmt: skip
    task = task if params is None else model_garden.with_experiment(task, params)
    return _run(
        task, model_dir, mode, settings, eval_checkpoint, output_dir, fast_dev_run, summary_dir
    )


def _steps(train_steps: Any, train_epochs: int | None) -> Any:
    """`train_steps`, or None where epochs are set and TRAIN_STEPS is not (it need not be)."""
    return None if train_epochs is not None and train_steps is gin.REQUIRED else train_steps


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
