"""`run_experiment`: the public entry point and gin's `orbitask.run_experiment.*` bindings."""

from __future__ import annotations

from typing import Any

import gin

from orbitask.tasks import model_garden
from orbitask.trainers.run.runner import ExperimentRunner
from orbitask.trainers.run.settings import Settings, defaults

_D = defaults()  # every setting's default has one home: the settings' groups


@gin.configurable("run_experiment", module="orbitask")
def run_experiment(
    task: Any = gin.REQUIRED,
    model_dir: str = gin.REQUIRED,
    mode: str = "train_and_eval",
    eval_checkpoint: str | None = None,
    output_dir: str | None = None,
    train_steps: int | None = gin.REQUIRED,
    train_epochs: int | None = _D["train_epochs"],
    global_batch_size: int = _D["global_batch_size"],
    learning_rate: Any = _D["learning_rate"],
    steps_per_loop: int = _D["steps_per_loop"],
    loop_seconds: float | None = _D["loop_seconds"],
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
    params: Any = None,
) -> dict:
    """Trains and/or evaluates `task` under `model_dir`; gin binds `orbitask.run_experiment.*`.

    Eager; the work is `runner.ExperimentRunner`'s. `task`: an `orbitask.Task`, or a Model Garden
    task as it is (docs/porting_from_model_garden.md), whose `ExperimentConfig` `params` then
    gives the optimizer and schedule. `mode`: train, eval, train_and_eval, continuous_eval or
    eval_all (every checkpoint, oldest first). `eval_checkpoint`: the `ckpt-N` that mode eval
    evaluates (None: the newest). `output_dir`: where an evaluation mode writes `eval/` (None:
    `model_dir`), so that `model_dir` may be read-only. Every other argument is the field of that
    name of one group in `settings` (`LoopSettings`, ...), documented there; configs/defaults.gin
    lists them all.

    Returns `{"train": logs, "eval": logs}`, plus `"export"` (the SavedModel folder) when one
    was written, `"evaluated"` (`{"checkpoint", "step", "eval"}` each) for eval_checkpoint or
    eval_all. Raises `ConfigError` for a bad setting, before any work.
    """
    flat = dict(locals())
    task, model_dir, mode = flat.pop("task"), flat.pop("model_dir"), flat.pop("mode")
    params, eval_checkpoint = flat.pop("params"), flat.pop("eval_checkpoint")
    output_dir = flat.pop("output_dir")
    if params is not None:
        task = model_garden.with_experiment(task, params)
    settings = Settings.from_flat(**flat)
    runner = ExperimentRunner(
        task, model_dir, mode, settings, eval_checkpoint=eval_checkpoint, output_dir=output_dir
    )
    return runner.run()
