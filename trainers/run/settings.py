"""`run_experiment`'s settings, grouped (loop, checkpoints, evaluation, distribution, features),
and their checks before any work: one line naming the setting and the fix (the type and range
of each are `orbitask.common.setting_rules.RULES`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import gin

from orbitask.common import setting_rules
from orbitask.tasks import replica_logs
from orbitask.tasks.model_garden import GUIDE, ModelGardenTask
from orbitask.trainers.actions import profiling
from orbitask.trainers.engine.prefetch import Prefetch
from orbitask.trainers.errors import ConfigError

MODES = ("train", "eval", "train_and_eval", "continuous_eval", "eval_all")


@dataclasses.dataclass(frozen=True)
class LoopSettings:
    """How training steps run: length, batch, learning rate, device loops, compilation.

    Attributes:
      train_steps: the global step training stops at; None: `train_epochs` epochs of the
        training input (one epoch when that is None too).
      train_epochs: train this many epochs of a training input of known size (an
        `IndexedInput`, or a finite `tf.data` dataset, which orbitask then repeats itself):
        `train_steps` is computed from it when the input is built (`epochs.epoch_length`),
        the fewest of any worker's. Only with `train_steps` None; a `continuous_eval` job
        beside such a run does not know its last step and polls until it is stopped.
      global_batch_size: one step's batch over all replicas; `build_inputs` gets
        `global_batch_size / num_replicas_in_sync`.
      learning_rate: the rate (float), or a `step -> rate` schedule such as
        `@orbitask.learning_rate_schedule()`; kept in a checkpointed variable. None: the
        optimizer's own rate (the default Nadam's is 1e-3); see `learning_rate.LearningRate`.
      steps_per_loop: a device loop's steps; loops also end where a callback, an evaluation
        or a checkpoint is due.
      loop_seconds: loops of quick steps double, up to 100 x `steps_per_loop`, while one lasts
        less than half this; None: loops stay at `steps_per_loop`.
      metrics_window: the train metrics accumulate over windows of this many steps and
        restart at its multiples, where device loops end, so the metrics a step logs are the
        same whatever the loops' lengths; None: they restart at each device loop (whose length
        `loop_seconds` sets from the machine's speed).
      use_tf_while_loop: run each device loop as one `tf.while_loop`.
      jit_compile: compile the per-replica train step with XLA (`tf.function(jit_compile=True)`).
      run_eagerly: run the device loops, the step and its stages eagerly (`tf.function`s as
        Python), so that `print(tensor.numpy())` and `breakpoint()` work in a stage; many times
        slower, for debugging.
      gradient_accumulation_steps: K batches of `global_batch_size` per optimizer update; the
        global step and callbacks count updates.
      seed: when set, seeds everything and enables op determinism (two fresh runs give
        identical weights).
      progress: show the progress display.
    """

    train_steps: int | None
    global_batch_size: int = 64
    learning_rate: Any = None
    steps_per_loop: int = 100
    loop_seconds: float | None = 1.0
    metrics_window: int | None = 1000
    use_tf_while_loop: bool = True
    jit_compile: bool = False
    run_eagerly: bool = False
    gradient_accumulation_steps: int = 1
    seed: int | None = None
    progress: bool = True
    train_epochs: int | None = None


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
    """When checkpoints are saved (also at the end, on SIGTERM and at early stop), what they
    keep, and what a fresh run starts from.

    Attributes:
      checkpoint_interval: save at every multiple of this step (None: no step rule).
      checkpoint_seconds: save after the first device loop that ends this many seconds after
        the last save (None: no time rule).
      max_to_keep: how many of the newest checkpoints are kept; None: as many as the manager
        of the Task's `build_checkpoint` keeps (the default builder keeps 50).
      warm_start: an `orbitask.WarmStart` copying model weights from a pretrained checkpoint
        into a fresh run (never the optimizer, step or input position), or None.
      keep_input_positions: how many of the newest checkpoints keep a `tf.data` input's
        position (its iterator state, one file per worker, under `input/`); resuming from an
        older one restarts the input from its beginning. 0: none is kept (a pipeline whose
        position cannot be saved, e.g. `Dataset.from_generator`, then needs no check).
      train_prefetch: a training pipeline ending in `prefetch(tf.data.AUTOTUNE)` prefetches
        this many steps' elements instead (each step's: one per replica, or K per replica with
        gradient accumulation), more while they hold under 1 MiB (up to 32 steps': fast steps
        on small batches would find 4 empty), so a saved input position holds a bounded
        buffer; None keeps the autotuned buffer.
      train_prefetch_bytes: at most this many bytes of such prefetched elements, but at least
        one step's; None: no byte bound.
      async_checkpoints: the interval, time-rule and final saves copy the values to host
        memory and return; a background thread writes the files while training goes on. The
        next save, the end of the run, SIGTERM and an error wait for that write. Under
        `multi_worker_mirrored` each worker writes so (the non-chief ones into their temporary
        folders); under `parameter_server` the chief does.
      max_time: a training run's wall-clock budget, seconds or `"HH:MM:SS"`, from the run's
        start: it stops after the last device loop that leaves time for a save, saves and exits
        75, as on SIGTERM (`actions.time_budget`); None: no budget.
      stop_signals: the names of the signals that stop a run after its device loop under way,
        saving it (exit 75; SIGINT: 130), e.g. with 'SIGUSR1' added for SLURM's
        `--signal=USR1@90`; every worker stops at the same step (`actions.preemption`).
      requeue: a run stopped by a signal (not SIGINT) or by `max_time` under SLURM asks SLURM
        to requeue its job after the save (`scontrol requeue $SLURM_JOB_ID`, by the chief).
    """

    checkpoint_interval: int | None = None
    checkpoint_seconds: float | None = 600.0
    max_to_keep: int | None = None
    warm_start: Any = None
    keep_input_positions: int = 3
    train_prefetch: int | None = Prefetch.steps
    train_prefetch_bytes: int | None = Prefetch.max_bytes
    async_checkpoints: bool = False
    max_time: float | str | None = None
    stop_signals: tuple[str, ...] = ("SIGTERM", "SIGINT", "SIGHUP")
    requeue: bool = False


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """When and how much to evaluate, and what evaluation controls.

    Attributes:
      eval_interval: train steps between evaluations in train_and_eval (None: only at the end).
      eval_seconds: in train_and_eval, also evaluate at the end of the first device loop that
        ends this many seconds of training after the last evaluation (under
        `multi_worker_mirrored`, on every worker when any worker's clock says so); None: by
        steps only.
      eval_steps: validation steps per evaluation; None runs the whole dataset.
      continuous_eval_timeout: in continuous_eval, seconds between checks for a new
        checkpoint (None: 30); it stops after evaluating the one at `train_steps`.
      validation_control: an `orbitask.ValidationControl` (best-checkpoint export to `best/`,
        LR halving on a worse validation, going back to the best, early stop), or None.
      eval_at_start: in train_and_eval, a baseline evaluation before training, at the starting
        step, unless the checkpoint records an evaluation already; the validation control
        counts it as the first best.
    """

    eval_interval: int | None = 500
    eval_seconds: float | None = None
    eval_steps: int | None = None
    continuous_eval_timeout: float | None = None
    validation_control: Any = None
    eval_at_start: bool = False


@dataclasses.dataclass(frozen=True)
class DistributionSettings:
    """Where the replicas run.

    Attributes:
      strategy: a name ("auto", "one_device", "mirrored", "multi_worker_mirrored",
        "parameter_server") or a `tf.distribute.Strategy`.
      cpu_devices: split the CPU into this many logical devices first; without GPUs, strategy
        `auto` (or `mirrored`) then has that many replicas. Must be set before TensorFlow has
        started.
    """

    strategy: Any = "auto"
    cpu_devices: int | None = None


@dataclasses.dataclass(frozen=True)
class FeatureSettings:
    """Optional features, each off (None) unless set.

    Attributes:
      nan_guard: an `orbitask.NanGuard` to skip steps whose loss or gradient is not finite and
        roll back; None: the default update zeroes non-finite gradient entries, step taken.
      mixed_precision: None, "mixed_float16" (the default step scales the loss dynamically and
        skips overflowing steps) or "mixed_bfloat16"; the Keras policy of both flavours while
        the model is built. Give the model a float32 output layer.
      ema: an `orbitask.ExponentialMovingAverage`: evaluate, export and predict with the
        averaged weights.
      histogram_interval: write histograms of the trainable variables every this many steps.
      profile_steps: `(N, M)`: trace steps N..M into TensorBoard's profile format under
        `train/plugins/profile/` (`trainers.actions.profiling`); None: no profile.
      export_at_end: when training ends (at `train_steps` or an early stop), write the model
        as a SavedModel under `model_dir/export/<step>/` (`trainers.run.saved_model`), with the
        EMA averages when `ema` is set.
      loggers: where the run's scalars go (`trainers.state.loggers`): 'tensorboard' (always),
        'jsonl', 'csv', 'mlflow', 'wandb', or `orbitask.Logger` instances of your own.
    """

    nan_guard: Any = None
    mixed_precision: str | None = None
    ema: Any = None
    histogram_interval: int | None = None
    profile_steps: Any = None
    export_at_end: bool = False
    loggers: Any = ("tensorboard", "jsonl")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every setting of a run, grouped as `run_experiment` groups its arguments."""

    loop: LoopSettings
    checkpoints: CheckpointSettings = CheckpointSettings()
    evaluation: EvalSettings = EvalSettings()
    distribution: DistributionSettings = DistributionSettings()
    features: FeatureSettings = FeatureSettings()


# The groups of `Settings`, by field: each group's fields are named as run_experiment's arguments.
_GROUPS = {
    "loop": LoopSettings,
    "checkpoints": CheckpointSettings,
    "evaluation": EvalSettings,
    "distribution": DistributionSettings,
    "features": FeatureSettings,
}


def flat(settings: Settings) -> dict[str, Any]:
    """Returns `run_experiment`'s arguments (all but task, model_dir, mode) from `settings`,
    a group's fields are named as the arguments. Eager."""
    values = {}
    for field in _GROUPS:
        group = getattr(settings, field)
        values.update({f.name: getattr(group, f.name) for f in dataclasses.fields(group)})
    return values


def defaults() -> dict[str, Any]:
    """Every setting's default, by `run_experiment`'s argument name (`train_steps`: None). The
    one home of these values: `run_experiment`'s signature reads them here. Eager."""
    return flat(Settings(loop=LoopSettings(train_steps=None)))


def check(task: Any, model_dir: Any, mode: str, settings: Settings) -> None:
    """Checks the settings that need no TensorFlow objects. Eager; returns None.

    Raises:
      ConfigError: naming the first bad setting and where to fix it.
    """
    loop, features = settings.loop, settings.features
    for name, value in (
        ("task", task),
        ("model_dir", model_dir),
        ("train_steps", loop.train_steps),
    ):
        if value is gin.REQUIRED:
            raise ConfigError(
                f"`{name}` is required and not set: bind it in your experiment's .gin file "
                "(TASK, TRAIN_STEPS, or orbitask.run_experiment.train_epochs) or pass it to "
                "run_experiment."
            )
    if mode not in MODES:
        raise ConfigError(
            f"`mode` must be one of {', '.join(MODES)}; received {mode!r}. Use --mode."
        )
    setting_rules.check("run_experiment", flat(settings))
    if loop.train_steps is not None and loop.train_epochs is not None:
        raise ConfigError(
            f"Set train_steps or train_epochs, not both; received train_steps={loop.train_steps} "
            f"and train_epochs={loop.train_epochs}. Set TRAIN_STEPS = None in your experiment's "
            ".gin file to train by epochs, or unset orbitask.run_experiment.train_epochs."
        )
    if features.profile_steps is not None:
        profiling.check(features.profile_steps)
    if features.mixed_precision not in (None, "mixed_float16", "mixed_bfloat16"):
        raise ConfigError(
            "`mixed_precision` must be None, 'mixed_float16' or 'mixed_bfloat16'; received "
            f"{features.mixed_precision!r}. Set run_experiment.mixed_precision in your .gin file."
        )
    _check_default_step(task, features.mixed_precision == "mixed_float16", loop)
    if isinstance(task, ModelGardenTask):
        task.check_global_batch_size(loop.global_batch_size)
    replica_logs.check(task)
    if not isinstance(model_dir, str) or not model_dir:
        raise ConfigError(f"`model_dir` must be a non-empty path; received {model_dir!r}.")


def _check_default_step(task: Any, float16: bool, loop: LoopSettings) -> None:
    if not task.own_train_step:
        return
    name = type(task).__name__
    if isinstance(task, ModelGardenTask):
        feature = "mixed_precision" if float16 else "gradient_accumulation_steps"
        if float16 or loop.gradient_accumulation_steps > 1:
            raise ConfigError(_model_garden_refusal(task, feature))
    if float16:
        raise ConfigError(
            f"mixed_float16 loss scaling needs the default train_step, but "
            f"{name} overrides it; scale the loss in your train_step (see "
            "docs/features.md, mixed precision) and use mixed_bfloat16, or keep the default step."
        )
    if loop.gradient_accumulation_steps > 1:
        raise ConfigError(
            f"gradient_accumulation_steps needs the default train_step, but "
            f"{name} overrides it; accumulate in your train_step instead."
        )


def check_cpu_devices(wanted: int, got: int) -> None:
    """Raises ConfigError when TensorFlow started with another number of CPU devices."""
    if got != wanted:
        raise ConfigError(
            f"`cpu_devices` is {wanted} but TensorFlow already started with {got} CPU "
            "device(s); set it before anything else uses TensorFlow."
        )


def check_replicas(replicas: int, global_batch_size: int, jit_compile: bool) -> None:
    """Raises ConfigError for a global batch or an XLA setting the strategy cannot run."""
    import tensorflow as tf

    if global_batch_size % replicas:
        raise ConfigError(
            f"`global_batch_size` ({global_batch_size}) must be divisible by the number of "
            f"replicas ({replicas}). Change run_experiment.global_batch_size."
        )
    if jit_compile and replicas > 1 and not tf.config.list_logical_devices("GPU"):
        raise ConfigError(
            f"`jit_compile=True` cannot run {replicas} replicas on logical CPU devices (XLA on "
            "CPU reaches only the first one). Set run_experiment.jit_compile = False or use "
            "strategy = 'one_device'."
        )


def check_nan_guard_step(task: Any) -> None:
    """Raises ConfigError when `task` overrides `train_step`, which the NaN guard needs."""
    if isinstance(task, ModelGardenTask):
        raise ConfigError(_model_garden_refusal(task, "nan_guard"))
    if task.own_train_step:
        raise ConfigError(
            f"NanGuard needs the default train_step, but {type(task).__name__} "
            "overrides it; remove run_experiment.nan_guard or skip non-finite steps "
            "in your train_step."
        )


def _model_garden_refusal(task: ModelGardenTask, feature: str) -> str:
    return (
        f"run_experiment.{feature} needs orbitask's default train_step, and the Model Garden "
        f"task {task.name} applies its gradients in its own; unset it (or use mixed_bfloat16, "
        f"which needs no loss scaling), or port the task to orbitask's stages ({GUIDE})."
    )
