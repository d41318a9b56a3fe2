"""`run_experiment`'s settings, one declaration each, and their checks before any work.

A setting is a field of one group (loop, checkpoints, evaluation, distribution, features)
declared by `setting(default, rule, doc)`: its name is `run_experiment`'s argument and the gin
binding `orbitask.run_experiment.<name>`, its default is the argument's, its rule (an
`orbitask.common.setting_rules.Rule`; None: a check of its own in `check` or where it is built)
refuses a bad value in one line naming the binding, and its doc line says what it does.
`run_experiment`'s signature is made from these declarations (`trainers.run.experiment`);
configs/defaults.gin lists them, and tests/test_defaults.py keeps that list, docs/reference.md
and the signature true to them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gin

from orbitask.common import setting_rules
from orbitask.common.setting_rules import (
    BOOL,
    DURATION,
    LEARNING_RATE,
    NON_NEGATIVE_INT,
    POSITIVE_INT,
    POSITIVE_NUMBER,
    SIGNAL_NAMES,
    STEPS,
    Rule,
)
from orbitask.tasks import replica_logs
from orbitask.tasks.model_garden import GUIDE, ModelGardenTask
from orbitask.trainers.actions import profiling
from orbitask.trainers.engine.prefetch import Prefetch
from orbitask.trainers.errors import ConfigError

MODES = ("train", "eval", "train_and_eval", "continuous_eval", "eval_all")
STEP_LIST = Rule(
    "a list of positive integers",
    lambda v: isinstance(v, list | tuple) and all(map(POSITIVE_INT.accepts, v)),
)


def setting(default: Any, rule: Rule | None, doc: str) -> Any:
    """Declares one setting, a field of its group: `default` (gin.REQUIRED: none), `rule`
    (None: checked by its own code) and `doc`, the line saying what it does."""
    return dataclasses.field(default=default, metadata={"rule": rule, "doc": doc})


# fmt: off
@dataclasses.dataclass(frozen=True)
class LoopSettings:
    """How training steps run: length, batch, learning rate, device loops, compilation."""

    train_steps: int | None = setting(gin.REQUIRED, STEPS, "the global step training stops at; "
        "None: `train_epochs` epochs of the training input (one epoch when that is None too).")
    global_batch_size: int = setting(64, POSITIVE_INT, "one step's batch over all replicas; "
        "`build_inputs` gets `global_batch_size / num_replicas_in_sync`.")
    learning_rate: Any = setting(None, LEARNING_RATE, "the rate (float), or a `step -> rate` "
        "schedule such as `@orbitask.learning_rate_schedule()`; kept in a checkpointed variable. "
        "None: the optimizer's own rate (the default Nadam's is 1e-3); see "
        "`learning_rate.LearningRate`.")
    steps_per_loop: int = setting(100, POSITIVE_INT, "a device loop's steps; loops also end where "
        "a callback, an evaluation or a checkpoint is due.")
    loop_seconds: float | None = setting(1.0, POSITIVE_NUMBER.or_none(), "loops of quick steps "
        "double, up to 100 x `steps_per_loop`, while one lasts less than half this; None: loops "
        "stay at `steps_per_loop`.")
    metrics_window: int | None = setting(1000, POSITIVE_INT.or_none(), "the train metrics "
        "accumulate over windows of this many steps and restart at its multiples, where device "
        "loops end, so the metrics a step logs are the same whatever the loops' lengths; None: "
        "they restart at each device loop (whose length `loop_seconds` sets from the machine's "
        "speed).")
    use_tf_while_loop: bool = setting(True, BOOL, "run each device loop as one `tf.while_loop`.")
    jit_compile: bool = setting(False, BOOL,
        "compile the per-replica train step with XLA (`tf.function(jit_compile=True)`).")
    run_eagerly: bool = setting(False, BOOL, "run the device loops, the step and its stages "
        "eagerly (`tf.function`s as Python), so that `print(tensor.numpy())` and `breakpoint()` "
        "work in a stage; many times slower, for debugging.")
    gradient_accumulation_steps: int = setting(1, POSITIVE_INT, "K batches of `global_batch_size` "
        "per optimizer update; the global step and callbacks count updates.")
    seed: int | None = setting(None, NON_NEGATIVE_INT.or_none(), "when set, seeds everything and "
        "enables op determinism (two fresh runs give identical weights).")
    progress: bool = setting(True, BOOL, "show the progress display.")
    train_epochs: int | None = setting(None, POSITIVE_INT.or_none(),
        "train this many epochs of a training input of known size (an `IndexedInput`, or a "
        "finite `tf.data` dataset, which orbitask then repeats itself): `train_steps` is "
        "computed from it when the input is built (`epochs.epoch_length`), the fewest of any "
        "worker's. Only with `train_steps` None; a `continuous_eval` job beside such a run does "
        "not know its last step and polls until it is stopped.")


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
    """When checkpoints are saved (also at the end, on SIGTERM and at early stop), what they
    keep, and what a fresh run starts from."""

    checkpoint_interval: int | None = setting(None, POSITIVE_INT.or_none(), "save at every "
        "multiple of this step (None: no step rule).")
    checkpoint_seconds: float | None = setting(600.0, POSITIVE_NUMBER.or_none(), "save after the "
        "first device loop that ends this many seconds after the last save (None: no time rule).")
    max_to_keep: int | None = setting(None, POSITIVE_INT.or_none(), "how many of the newest "
        "checkpoints are kept; None: as many as the manager of the Task's `build_checkpoint` "
        "keeps (the default builder keeps 50).")
    warm_start: Any = setting(None, None, "an `orbitask.WarmStart` copying model weights from a "
        "pretrained checkpoint into a fresh run (never the optimizer, step or input position), "
        "or None.")
    keep_input_positions: int = setting(3, NON_NEGATIVE_INT, "how many of the newest checkpoints "
        "keep a `tf.data` input's position (its iterator state, one file per worker, under "
        "`input/`); resuming from an older one restarts the input from its beginning. 0: none is "
        "kept (a pipeline whose position cannot be saved, e.g. `Dataset.from_generator`, then "
        "needs no check).")
    train_prefetch: int | None = setting(Prefetch.steps, POSITIVE_INT.or_none(), "a training "
        "pipeline ending in `prefetch(tf.data.AUTOTUNE)` prefetches this many steps' elements "
        "instead (each step's: one per replica, or K per replica with gradient accumulation), "
        "more while they hold under 1 MiB (up to 32 steps': fast steps on small batches would "
        "find 4 empty), so a saved input position holds a bounded buffer; None keeps the "
        "autotuned buffer.")
    train_prefetch_bytes: int | None = setting(Prefetch.max_bytes, POSITIVE_INT.or_none(), "at "
        "most this many bytes of such prefetched elements, but at least one step's; None: no "
        "byte bound.")
    async_checkpoints: bool = setting(False, BOOL, "the interval, time-rule and final saves copy "
        "the values to host memory and return; a background thread writes the files while "
        "training goes on. The next save, the end of the run, SIGTERM and an error wait for that "
        "write. Under `multi_worker_mirrored` each worker writes so (the non-chief ones into "
        "their temporary folders); under `parameter_server` the chief does.")
    max_time: float | str | None = setting(None, DURATION, "a training run's wall-clock budget, "
        "seconds or `\"HH:MM:SS\"`, from the run's start: it stops after the last device loop "
        "that leaves time for a save, saves and exits 75, as on SIGTERM (`actions.time_budget`); "
        "None: no budget.")
    stop_signals: tuple[str, ...] = setting(("SIGTERM", "SIGINT", "SIGHUP"), SIGNAL_NAMES, "the "
        "names of the signals that stop a run after its device loop under way, saving it (exit "
        "75; SIGINT: 130), e.g. with 'SIGUSR1' added for SLURM's `--signal=USR1@90`; every "
        "worker stops at the same step (`actions.preemption`).")
    requeue: bool = setting(False, BOOL, "a run stopped by a signal (not SIGINT) or by `max_time` "
        "under SLURM asks SLURM to requeue its job after the save (`scontrol requeue "
        "$SLURM_JOB_ID`, by the chief).")


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """When and how much to evaluate, and what evaluation controls."""

    eval_interval: int | None = setting(500, POSITIVE_INT.or_none(), "train steps between "
        "evaluations in train_and_eval (None: only at the end).")
    eval_seconds: float | None = setting(None, POSITIVE_NUMBER.or_none(), "in train_and_eval, also "
        "evaluate at the end of the first device loop that ends this many seconds of training "
        "after the last evaluation (under `multi_worker_mirrored`, on every worker when any "
        "worker's clock says so); None: by steps only.")
    eval_steps: int | None = setting(None, POSITIVE_INT.or_none(), "validation steps per "
        "evaluation; None runs the whole dataset.")
    continuous_eval_timeout: float | None = setting(None, POSITIVE_NUMBER.or_none(), "in "
        "continuous_eval, seconds between checks for a new checkpoint (None: 30); it stops after "
        "evaluating the one at `train_steps`.")
    validation_control: Any = setting(None, None, "an `orbitask.ValidationControl` "
        "(best-checkpoint export to `best/`, LR halving on a worse validation, going back to the "
        "best, early stop), or None.")
    eval_at_start: bool = setting(False, BOOL, "in train_and_eval, a baseline evaluation before "
        "training, at the starting step, unless the checkpoint records an evaluation already; "
        "the validation control counts it as the first best.")
    eval_at_steps: tuple[int, ...] = setting((), STEP_LIST, "in train_and_eval, also evaluate "
        "at each of these steps (with `eval_interval` None: at these and at `train_steps` only); "
        "steps past `train_steps` never come.")


@dataclasses.dataclass(frozen=True)
class DistributionSettings:
    """Where the replicas run."""

    strategy: Any = setting("auto", None, "a name (\"auto\", \"one_device\", \"mirrored\", "
        "\"multi_worker_mirrored\", \"parameter_server\") or a `tf.distribute.Strategy`.")
    cpu_devices: int | None = setting(None, POSITIVE_INT.or_none(), "split the CPU into this many "
        "logical devices first; without GPUs, strategy `auto` (or `mirrored`) then has that many "
        "replicas. Must be set before TensorFlow has started.")


@dataclasses.dataclass(frozen=True)
class FeatureSettings:
    """Optional features, each off (None) unless set."""

    nan_guard: Any = setting(None, None, "an `orbitask.NanGuard` to skip steps whose loss or "
        "gradient is not finite and roll back; None: the default update zeroes non-finite "
        "gradient entries, step taken.")
    mixed_precision: str | None = setting(None, None, "None, \"mixed_float16\" (the default step "
        "scales the loss dynamically and skips overflowing steps) or \"mixed_bfloat16\"; the "
        "Keras policy of both flavours while the model is built. Give the model a float32 output "
        "layer.")
    ema: Any = setting(None, None, "an `orbitask.ExponentialMovingAverage`: evaluate, export and "
        "predict with the averaged weights.")
    histogram_interval: int | None = setting(None, POSITIVE_INT.or_none(), "write histograms of "
        "the trainable variables every this many steps.")
    profile_steps: Any = setting(None, None, "`(N, M)`: trace steps N..M into TensorBoard's "
        "profile format under `train/plugins/profile/` (`trainers.actions.profiling`); None: no "
        "profile.")
    export_at_end: bool = setting(False, BOOL, "when training ends (at `train_steps` or an early "
        "stop), write the model as a SavedModel under `model_dir/export/<step>/` "
        "(`trainers.run.saved_model`), with the EMA averages when `ema` is set.")
    loggers: Any = setting(("tensorboard", "jsonl"), None, "where the run's scalars go "
        "(`trainers.state.loggers`): 'tensorboard' (always), 'jsonl', 'csv', 'mlflow', 'wandb', "
        "or `orbitask.Logger` instances of your own.")
# fmt: on


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every setting of a run, grouped as `run_experiment` groups its arguments."""

    loop: LoopSettings = LoopSettings()
    checkpoints: CheckpointSettings = CheckpointSettings()
    evaluation: EvalSettings = EvalSettings()
    distribution: DistributionSettings = DistributionSettings()
    features: FeatureSettings = FeatureSettings()


# The groups of `Settings`, by field: each group's fields are named as run_experiment's arguments.
_GROUPS = {f.name: type(f.default) for f in dataclasses.fields(Settings)}
_GROUP_OF = {f.name: field for field, group in _GROUPS.items() for f in dataclasses.fields(group)}
# Every setting's declaration (its field: `.default`, `.metadata["rule"]` and `.metadata["doc"]`),
# by name, group after group, and their rules by gin binding, as `setting_rules.check` takes them.
DECLARED = {f.name: f for group in _GROUPS.values() for f in dataclasses.fields(group)}
RULES = {
    f"run_experiment.{n}": f.metadata["rule"] for n, f in DECLARED.items() if f.metadata["rule"]
}


def grouped(values: dict[str, Any]) -> Settings:
    """The Settings holding `values` (setting name -> value; one left out keeps its default),
    the inverse of `flat`. Eager."""
    groups: dict[str, dict] = {field: {} for field in _GROUPS}
    for name, value in values.items():
        groups[_GROUP_OF[name]][name] = value
    return Settings(**{field: _GROUPS[field](**given) for field, given in groups.items()})


def flat(settings: Settings) -> dict[str, Any]:
    """Every setting's value in `settings`, by name, the inverse of `grouped`. Eager."""
    return {name: getattr(getattr(settings, _GROUP_OF[name]), name) for name in DECLARED}


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
    setting_rules.check("run_experiment", flat(settings), RULES)
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
