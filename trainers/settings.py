"""Checks of `run_experiment`'s settings before any work: one line naming the setting and fix."""

from __future__ import annotations

from typing import Any

import gin
from orbitask.tasks import Task

MODES = ("train", "eval", "train_and_eval", "continuous_eval")


def check_positive(name: str, value: Any, allow_none: bool = False) -> None:
    """Raises ValueError unless `value` is a positive int (or None when allowed)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"`{name}` must be a positive integer; received {value!r}. "
            f"Set run_experiment.{name} in your experiment's .gin file or with --gin_params."
        )


def check_seconds(name: str, value: Any) -> None:
    """Raises ValueError unless `value` is a positive number of seconds or None."""
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0
    ):
        raise ValueError(
            f"`{name}` must be a positive number or None; received {value!r}. "
            f"Set run_experiment.{name} in your .gin file."
        )


def check(
    *,
    task: Any,
    model_dir: Any,
    mode: str,
    train_steps: Any,
    global_batch_size: Any,
    steps_per_loop: Any,
    eval_interval: Any,
    eval_steps: Any,
    checkpoint_interval: Any,
    checkpoint_seconds: Any,
    loop_seconds: Any,
    cpu_devices: Any,
    mixed_precision: Any,
    gradient_accumulation_steps: Any,
    histogram_interval: Any,
) -> None:
    """Checks `run_experiment`'s settings that need no TensorFlow objects. Eager; returns None.

    Raises:
      ValueError: naming the first bad setting and where to fix it.
    """
    for name, value in (("task", task), ("model_dir", model_dir), ("train_steps", train_steps)):
        if value is gin.REQUIRED:
            raise ValueError(
                f"`{name}` is required and not set: bind it in your experiment's .gin file "
                "(TASK, TRAIN_STEPS) or pass it to run_experiment."
            )
    if mode not in MODES:
        raise ValueError(
            f"`mode` must be one of {', '.join(MODES)}; received {mode!r}. Use --mode."
        )
    check_positive("train_steps", train_steps)
    check_positive("global_batch_size", global_batch_size)
    check_positive("steps_per_loop", steps_per_loop)
    check_positive("eval_interval", eval_interval, allow_none=True)
    check_positive("eval_steps", eval_steps, allow_none=True)
    check_positive("checkpoint_interval", checkpoint_interval, allow_none=True)
    check_positive("cpu_devices", cpu_devices, allow_none=True)
    check_seconds("checkpoint_seconds", checkpoint_seconds)
    check_seconds("loop_seconds", loop_seconds)
    if mixed_precision not in (None, "mixed_float16", "mixed_bfloat16"):
        raise ValueError(
            "`mixed_precision` must be None, 'mixed_float16' or 'mixed_bfloat16'; received "
            f"{mixed_precision!r}. Set run_experiment.mixed_precision in your .gin file."
        )
    if mixed_precision == "mixed_float16" and type(task).train_step is not Task.train_step:
        raise ValueError(
            f"mixed_float16 loss scaling needs the default train_step, but "
            f"{type(task).__name__} overrides it; scale the loss in your train_step (see "
            "README, Mixed precision) and use mixed_bfloat16, or keep the default step."
        )
    check_positive("gradient_accumulation_steps", gradient_accumulation_steps)
    check_positive("histogram_interval", histogram_interval, allow_none=True)
    uses_default_step = type(task).train_step is Task.train_step
    if gradient_accumulation_steps > 1 and not uses_default_step:
        raise ValueError(
            f"gradient_accumulation_steps needs the default train_step, but "
            f"{type(task).__name__} overrides it; accumulate in your train_step instead."
        )
    if not isinstance(model_dir, str) or not model_dir:
        raise ValueError(f"`model_dir` must be a non-empty path; received {model_dir!r}.")


def check_cpu_devices(wanted: int, got: int) -> None:
    """Raises ValueError when TensorFlow started with another number of CPU devices."""
    if got != wanted:
        raise ValueError(
            f"`cpu_devices` is {wanted} but TensorFlow already started with {got} CPU "
            "device(s); set it before anything else uses TensorFlow."
        )


def check_replicas(replicas: int, global_batch_size: int, jit_compile: bool) -> None:
    """Raises ValueError for a global batch or an XLA setting the strategy cannot run."""
    import tensorflow as tf

    if global_batch_size % replicas:
        raise ValueError(
            f"`global_batch_size` ({global_batch_size}) must be divisible by the number of "
            f"replicas ({replicas}). Change run_experiment.global_batch_size."
        )
    if jit_compile and replicas > 1 and not tf.config.list_logical_devices("GPU"):
        raise ValueError(
            f"`jit_compile=True` cannot run {replicas} replicas on logical CPU devices (XLA on "
            "CPU reaches only the first one). Set run_experiment.jit_compile = False or use "
            "strategy = 'one_device'."
        )


def check_nan_guard_step(task: Any) -> None:
    """Raises ValueError when `task` overrides `train_step`, which the NaN guard needs."""
    if type(task).train_step is not Task.train_step:
        raise ValueError(
            f"NanGuard needs the default train_step, but {type(task).__name__} "
            "overrides it; remove run_experiment.nan_guard or skip non-finite steps "
            "in your train_step."
        )
