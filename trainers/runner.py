"""`run_experiment`: builds a Task's objects on a strategy and runs an `orbit.Controller`."""

from __future__ import annotations

import os
from typing import Any

import gin
import orbit
import orbit.controller
from absl import logging
from orbitask.tasks import CallbackContext, keras_compat
from orbitask.trainers import checkpoints, cluster, settings, summaries, validation
from orbitask.trainers import inputs as inputs_lib
from orbitask.trainers.callback_runner import CallbackAction
from orbitask.trainers.controller import Controller
from orbitask.trainers.determinism import make_deterministic
from orbitask.trainers.errors import ConfigError, EarlyStop
from orbitask.trainers.learning_rate import LearningRate
from orbitask.trainers.loop_length import LoopLength
from orbitask.trainers.precision import DynamicLossScale, precision_policy
from orbitask.trainers.preemption import PreemptionWatcher
from orbitask.trainers.progress import ProgressAction
from orbitask.trainers.ps_trainer import ParameterServerTrainer
from orbitask.trainers.strategies import build_strategy, logical_cpus
from orbitask.trainers.trainer import TaskTrainer

# Orbit prints a line to stdout after every device loop; the progress display replaces it, and
# Orbit's messages still go to the absl log.
orbit.controller._log = logging.info  # noqa: SLF001


@gin.configurable("run_experiment", module="orbitask")
def run_experiment(
    task: Any = gin.REQUIRED,
    model_dir: str = gin.REQUIRED,
    mode: str = "train_and_eval",
    train_steps: int = gin.REQUIRED,
    global_batch_size: int = 64,
    learning_rate: float = 1e-3,
    steps_per_loop: int = 100,
    loop_seconds: float | None = 1.0,
    eval_interval: int | None = 500,
    eval_steps: int | None = None,
    checkpoint_interval: int | None = None,
    checkpoint_seconds: float | None = 600.0,
    strategy: Any = "auto",
    use_tf_while_loop: bool = True,
    progress: bool = True,
    continuous_eval_timeout: float | None = None,
    nan_guard: Any = None,
    seed: int | None = None,
    cpu_devices: int | None = None,
    gradient_accumulation_steps: int = 1,
    validation_control: Any = None,
    jit_compile: bool = False,
    histogram_interval: int | None = None,
    warm_start: Any = None,
    mixed_precision: str | None = None,
    ema: Any = None,
) -> dict:
    """Trains and/or evaluates `task`, writing checkpoints and summaries under `model_dir`.

    Eager. Builds the strategy, then inside its scope the task's model, loss, optimizer, metrics
    and checkpoint; restores the latest checkpoint; runs an `orbit.Controller`.

    Args:
      task: a `tasks.Task`.
      model_dir: checkpoints go here, summaries under `train/` and `eval/`.
      mode: "train", "eval", "train_and_eval" or "continuous_eval".
      train_steps: the global step training stops at.
      global_batch_size: one step's batch over all replicas; `build_inputs` gets
        `global_batch_size / num_replicas_in_sync`.
      learning_rate: the rate (float), or a `step -> rate` schedule such as
        `@orbitask.learning_rate_schedule()`; kept in a checkpointed variable.
      steps_per_loop: a device loop's steps; loops also end where a callback, an evaluation
        or a checkpoint is due.
      loop_seconds: loops of quick steps double, up to 100 x `steps_per_loop`, while one lasts
        less than half this (`trainers/loop_length.py`); None: loops stay at `steps_per_loop`.
      eval_interval: train steps between evaluations in train_and_eval (None: only at the end).
      eval_steps: validation steps per evaluation; None runs the whole validation dataset.
      checkpoint_interval: save at every multiple of this step (None: no step rule).
      checkpoint_seconds: save after the first device loop that ends this many seconds after
        the last save (None: no time rule). Checkpoints are also saved at the end, on SIGTERM
        and at early stop; a save costs ~30 ms even for a small model (README, Performance).
      strategy: a name ("auto", "one_device", "mirrored", ...) or a `tf.distribute.Strategy`.
      use_tf_while_loop: run each device loop as one `tf.while_loop`.
      progress: show the progress display.
      continuous_eval_timeout: in continuous_eval, seconds between checks for a new checkpoint
        (default 30); it stops after evaluating the checkpoint at `train_steps`.
      nan_guard: a `trainers.NanGuard` to skip non-finite steps and roll back; None keeps the
        seed's behaviour (NaN gradients zeroed, step taken).
      seed: when set, seeds everything and enables op determinism (two fresh runs give
        identical weights).
      cpu_devices: split the CPU into this many logical devices first (so `mirrored` has that
        many replicas without GPUs); must be set before TensorFlow has started.
      gradient_accumulation_steps: K batches of `global_batch_size` per optimizer update; the
        global step and callbacks count updates.
      validation_control: a `trainers.ValidationControl` (best-checkpoint export to `best/`,
        LR halving on a worse validation, early stop), or None.
      histogram_interval: write histograms of the trainable variables every this many steps.
      warm_start: a `trainers.WarmStart` copying model weights from a pretrained checkpoint
        into a fresh run (never the optimizer, step or input position), or None.
      mixed_precision: None, "mixed_float16" (the default step scales the loss dynamically and
        skips overflowing steps) or "mixed_bfloat16"; the Keras policy of both flavours while
        the model is built. Give the model a float32 output layer.
      ema: a `trainers.ExponentialMovingAverage`: evaluate and export the averaged weights.
      jit_compile: compile the per-replica train step with XLA (`tf.function(jit_compile=True)`);
        see README, "Performance", for when it helps.

    Returns:
      `{"train": last train logs, "eval": last eval logs}` (Python floats / NumPy arrays).

    Raises:
      ValueError: for a bad setting, before any work.
    """
    try:
        execute = _setup(**locals())
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        # Everything before the first step is configuration: report it as one line.
        raise ConfigError(" ".join(str(e).split())) from e
    return execute()


def _setup(
    task,
    model_dir,
    mode,
    train_steps,
    global_batch_size,
    learning_rate,
    steps_per_loop,
    loop_seconds,
    eval_interval,
    eval_steps,
    checkpoint_interval,
    checkpoint_seconds,
    strategy,
    use_tf_while_loop,
    progress,
    continuous_eval_timeout,
    nan_guard,
    seed,
    cpu_devices,
    gradient_accumulation_steps,
    validation_control,
    jit_compile,
    histogram_interval,
    warm_start,
    mixed_precision,
    ema,
):
    """Validates settings and builds every object; returns `execute()` that runs the mode."""
    settings.check(
        task=task,
        model_dir=model_dir,
        mode=mode,
        train_steps=train_steps,
        global_batch_size=global_batch_size,
        steps_per_loop=steps_per_loop,
        eval_interval=eval_interval,
        eval_steps=eval_steps,
        checkpoint_interval=checkpoint_interval,
        checkpoint_seconds=checkpoint_seconds,
        loop_seconds=loop_seconds,
        cpu_devices=cpu_devices,
        mixed_precision=mixed_precision,
        gradient_accumulation_steps=gradient_accumulation_steps,
        histogram_interval=histogram_interval,
    )
    if seed is not None:
        make_deterministic(seed)
    if cpu_devices:
        settings.check_cpu_devices(cpu_devices, len(logical_cpus(cpu_devices)))
    if cluster.is_server_task(strategy):
        return cluster.serve  # a parameter-server job's worker or ps task only serves
    strategy = build_strategy(strategy)
    chief = cluster.is_chief(strategy)  # only the chief keeps checkpoints, summaries, config
    replicas = strategy.num_replicas_in_sync
    settings.check_replicas(replicas, global_batch_size, jit_compile)
    validation.check_model_dir(model_dir)
    training = mode in ("train", "train_and_eval")
    evaluating = mode != "train"
    results: dict = {"train": {}, "eval": {}}

    def make_context(step, logs):
        return CallbackContext(
            step=step,
            logs=dict(logs),
            lr=lr,
            optimizer=optimizer,
            model=model,
            loss_fn=loss_fn,
            checkpoint=checkpoint,
            manager=manager,
            strategy=strategy,
            summary_writer=train_summaries.summary_writer(),
        )

    with strategy.scope():
        with precision_policy(mixed_precision):
            model = task.build_model()
        if task.keras_flavour is None:
            task.keras_flavour = keras_compat.model_flavour(model) or keras_compat.KERAS3
        loss_fn = task.build_losses()
        global_step = orbit.utils.create_global_step()
        lr_control = LearningRate.create(learning_rate)
        schedule, lr = lr_control.schedule, lr_control.lr
        optimizer = task.build_optimizer(float(lr.numpy()))
        keras_compat.check_matching(model, optimizer)
        train_metrics = task.build_metrics(training=True) if training else []
        eval_metrics = task.build_metrics(training=False) if evaluating else []
        if nan_guard is not None and training:
            settings.check_nan_guard_step(task)
            nan_guard.build()
        train_iterator = None
        if training:
            train_iterator = inputs_lib.train_iterator(
                task, strategy, global_batch_size, gradient_accumulation_steps
            )
            validation.check_checkpointable_input(task, train_iterator)
            validation.check_inputs(
                task,
                train_iterator.element_spec,
                model,
                loss_fn,
                lr,
                global_batch_size // replicas,
                global_batch_size,
                replicas,
            )
            # After check_inputs, which calls the model once: a Keras model without an Input
            # layer only has weights from then on, and the optimizer must be built with them.
            variables = validation.trainable_variables(task, model)
            keras_compat.build_optimizer_slots(optimizer, variables, model)
        extra_every = {histogram_interval: [summaries.histograms]} if histogram_interval else {}
        callbacks = CallbackAction(task, global_step, make_context, None, extra_every)
        extra_state = {"learning_rate_factor": lr_control.factor}
        if ema is not None:
            extra_state["ema"] = ema.build(model)
        loss_scale = None
        if mixed_precision == "mixed_float16" and training:
            loss_scale = DynamicLossScale()
            extra_state["loss_scale"] = loss_scale.checkpoint()
        if validation_control is not None and evaluating:
            extra_state["validation_control"] = validation_control.build()
        checkpoint, manager = checkpoints.build(
            task,
            model_dir,
            global_step,
            lr,
            optimizer,
            model,
            loss_fn,
            train_iterator,
            callbacks.trackables(),
            extra_state,
        )
        if mode == "eval" and manager.latest_checkpoint is None:  # the chief's directory
            raise ValueError(
                f"--mode=eval evaluates the latest checkpoint, and {model_dir!r} has none; pass "
                "the --model_dir you trained into (continuous_eval waits for checkpoints)."
            )
        manager = cluster.for_this_worker(manager, strategy)
    eval_dataset = (
        inputs_lib.eval_dataset(task, strategy, global_batch_size) if evaluating else None
    )
    if evaluating:
        validation.check_finite_eval(task, eval_dataset, eval_steps)
    ps = cluster.is_parameter_server(strategy)
    record_history = callbacks.has_deferred and not ps  # PS: deferred callbacks end loops
    trainer = (ParameterServerTrainer if ps else TaskTrainer)(
        task=task,
        strategy=strategy,
        model=model,
        optimizer=optimizer,
        loss_fn=loss_fn,
        lr=lr,
        global_step=global_step,
        global_batch_size=global_batch_size,
        train_iterator=train_iterator,
        eval_dataset=eval_dataset,
        train_metrics=train_metrics,
        eval_metrics=eval_metrics,
        use_tf_while_loop=use_tf_while_loop,
        nan_guard=nan_guard if training else None,
        gradient_accumulation_steps=gradient_accumulation_steps,
        learning_rate=lr_control if schedule else None,
        loss_scale=loss_scale,
        ema=ema,
        jit_compile=jit_compile,
        record_history=record_history,
    )
    if record_history:
        callbacks.history = lambda: trainer.loop_history
    step_now = trainer.step_now  # after a device loop: its end step, no read of the variable
    callbacks.current_step = step_now
    if chief:
        checkpoints.write_operative_config(model_dir)

    train_summaries = summaries.LoopSummaryManager(
        os.path.join(model_dir, "train") if chief else None,
        summaries.write,
        global_step,
        interval=10 * steps_per_loop,
        current_step=step_now,
    )
    eval_summaries = orbit.utils.SummaryManager(
        os.path.join(model_dir, "eval") if chief else None, summaries.write, global_step
    )
    callbacks.summary_writer = train_summaries.summary_writer()
    progress_action = (
        ProgressAction(global_step, train_steps, current_step=step_now)
        if progress and chief
        else None
    )
    train_actions = [callbacks, lambda out: results.__setitem__("train", dict(out))]
    if progress_action:
        train_actions.append(progress_action)
    if nan_guard is not None and training:
        # Last, and before the Controller's save: a rollback must precede any checkpoint.
        train_actions.append(nan_guard.action(checkpoint, manager, strategy, global_step, trainer))
    preemption = PreemptionWatcher(manager, global_step)
    train_actions.append(preemption)  # last: saves the state every other action left

    agree = lambda grow: cluster.every_worker(strategy, grow)  # noqa: E731
    lengths = LoopLength(steps_per_loop, loop_seconds, agree=agree)

    def loop_length(step: int) -> int:  # (the Controller also ends loops at checkpoint steps)
        steps = lengths.steps
        return min(steps, callbacks.steps_until_due(step) or steps)

    eval_actions = [lambda out: results.__setitem__("eval", dict(out))]
    if validation_control is not None and evaluating:
        eval_actions.append(
            # A non-chief worker exports its best checkpoint into its own temp folder.
            validation_control.action(
                getattr(manager, "temp_directory", model_dir),
                checkpoint,
                manager,
                lr_control,
                global_step,
                ema=ema,
            )
        )

    controller = Controller(
        checkpoint_interval=checkpoint_interval,
        checkpoint_seconds=checkpoint_seconds,
        on_loop=lengths.observe,
        global_step=global_step,
        trainer=trainer if training else None,
        evaluator=trainer if evaluating else None,
        strategy=strategy,
        train_actions=train_actions,
        eval_actions=eval_actions,
        steps_per_loop=loop_length,
        checkpoint_manager=manager,
        summary_manager=train_summaries,
        eval_summary_manager=eval_summaries,
        eval_summary_dir=os.path.join(model_dir, "eval"),  # else Orbit reuses train/
    )
    eval_steps_arg = eval_steps or -1
    if warm_start is not None and manager.latest_checkpoint is None:
        warm_start.apply(model)  # fresh run only: a resumed run keeps its own weights

    def execute() -> dict:
        with preemption:
            try:
                return run_mode()
            except EarlyStop as stop:
                manager.save(checkpoint_number=int(global_step.numpy()), check_interval=False)
                print(f"orbitask: {stop}", flush=True)
                results["early_stop"] = str(stop)
                return results
            finally:  # also on SIGTERM (exit 75) and errors: the kept train scalars
                train_summaries.write_pending()
                train_summaries.flush()

    def run_mode() -> dict:
        if progress_action:
            progress_action.start()
        if training and validation_control is not None and validation_control.stopped():
            raise EarlyStop(f"already stopped early at step {int(global_step.numpy())}")
        if mode == "train":
            controller.train(train_steps)
        elif mode == "train_and_eval":
            controller.train_and_evaluate(train_steps, eval_steps_arg, eval_interval)
        elif mode == "eval":
            controller.evaluate(eval_steps_arg)
        else:
            # Poll for new checkpoints; stop once the one at train_steps has been evaluated.
            controller.evaluate_continuously(
                eval_steps_arg,
                timeout=continuous_eval_timeout or 30,
                timeout_fn=lambda: int(global_step.numpy()) >= train_steps,
            )
        train_summaries.write_pending()
        train_summaries.flush()
        eval_summaries.flush()
        scalars = {k: v for k, v in results["eval"].items() if isinstance(v, (int, float))}
        if scalars:
            text = ", ".join(f"{k} {v:.4g}" for k, v in sorted(scalars.items()))
            print(f"orbitask: eval at step {int(global_step.numpy())}: {text}")
        print(f"orbitask: checkpoints in {model_dir}; TensorBoard: --logdir {model_dir}")
        return results

    return execute
