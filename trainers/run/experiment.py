"""`run_experiment`: the public entry point and gin's `orbitask.run_experiment.*` bindings."""

from __future__ import annotations

from typing import Any

import gin

from orbitask.tasks import model_garden
from orbitask.trainers.run.runner import ExperimentRunner
from orbitask.trainers.run.settings import Settings


@gin.configurable("run_experiment", module="orbitask")
def run_experiment(
    task: Any = gin.REQUIRED,
    model_dir: str = gin.REQUIRED,
    mode: str = "train_and_eval",
    eval_checkpoint: str | None = None,
    train_steps: int | None = gin.REQUIRED,
    train_epochs: int | None = None,
    global_batch_size: int = 64,
    learning_rate: Any = None,
    steps_per_loop: int = 100,
    loop_seconds: float | None = 1.0,
    eval_interval: int | None = 500,
    eval_seconds: float | None = None,
    eval_steps: int | None = None,
    checkpoint_interval: int | None = None,
    checkpoint_seconds: float | None = 600.0,
    keep_input_positions: int = 3,
    async_checkpoints: bool = False,
    strategy: Any = "auto",
    use_tf_while_loop: bool = True,
    progress: bool = True,
    continuous_eval_timeout: float | None = None,
    nan_guard: Any = None,
    seed: int | None = None,
    cpu_devices: int | None = None,
    gradient_accumulation_steps: int = 1,
    validation_control: Any = None,
    eval_at_start: bool = False,
    jit_compile: bool = False,
    histogram_interval: int | None = None,
    profile_steps: Any = None,
    warm_start: Any = None,
    mixed_precision: str | None = None,
    ema: Any = None,
    export_at_end: bool = False,
    params: Any = None,
) -> dict:
    """Trains and/or evaluates `task`, writing checkpoints and summaries under `model_dir`.

    Eager. Builds the strategy, then inside its scope the task's model, loss, optimizer, metrics
    and checkpoint; restores the latest checkpoint; runs an `orbit.Controller`. The work is
    `runner.ExperimentRunner`'s; the arguments are gin's `orbitask.run_experiment.*` bindings.

    Args:
      task: an `orbitask.Task`, or a Model Garden `official.core.base_task.Task` as it is
        (wrapped in `orbitask.ModelGardenTask`; docs/porting_from_model_garden.md).
      model_dir: checkpoints go here, summaries under `train/` and `eval/`.
      mode: "train", "eval", "train_and_eval", "continuous_eval" or "eval_all" (every
        checkpoint of `model_dir`, oldest first, each at its own step; then it returns).
      eval_checkpoint: with mode "eval", the checkpoint to evaluate (a `ckpt-N` prefix, in
        `model_dir` or elsewhere; the binary's `--checkpoint`); None: the newest in `model_dir`.
      params: for a Model Garden `task`, its `ExperimentConfig`, as Model Garden's
        `train_lib.run_experiment(params=...)` takes it: the optimizer and its schedule are the
        config's (`orbitask.ModelGardenTask(task, experiment=params)`). None: the seed's.
      **settings: every other argument is a field of one group in `settings`, documented
        there: `LoopSettings` (train_steps, train_epochs, global_batch_size, learning_rate,
        steps_per_loop, loop_seconds, use_tf_while_loop, jit_compile, gradient_accumulation_steps,
        seed, progress), `CheckpointSettings` (checkpoint_interval, checkpoint_seconds,
        warm_start, keep_input_positions, async_checkpoints), `EvalSettings` (eval_interval,
        eval_seconds, eval_steps, continuous_eval_timeout, validation_control, eval_at_start),
        `DistributionSettings` (strategy, cpu_devices), `FeatureSettings` (nan_guard,
        mixed_precision, ema, histogram_interval, profile_steps, export_at_end).

    Returns:
      `{"train": last train logs, "eval": last eval logs}` (Python floats / NumPy arrays), and
      `"export"`, the SavedModel's folder, when `export_at_end` wrote one; with
      `eval_checkpoint` or mode "eval_all", `"evaluated"`: one `{"checkpoint", "step", "eval"}`
      per checkpoint evaluated, in order.

    Raises:
      ConfigError: for a bad setting, before any work. An exception from the task's own code
        (builders, steps, callbacks) propagates unchanged, with its traceback.
    """
    flat = dict(locals())
    task, model_dir, mode = flat.pop("task"), flat.pop("model_dir"), flat.pop("mode")
    params, eval_checkpoint = flat.pop("params"), flat.pop("eval_checkpoint")
    if params is not None:
        task = model_garden.with_experiment(task, params)
    settings = Settings.from_flat(**flat)
    return ExperimentRunner(task, model_dir, mode, settings, eval_checkpoint=eval_checkpoint).run()
