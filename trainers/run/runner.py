"""`ExperimentRunner`: builds a Task's objects on a strategy and runs an Orbit controller.

The run is built by small steps, in the order `build` calls them; each is a method a subclass may
override, as in Model Garden's `OrbitExperimentRunner` (docs/architecture.md lists them).
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any

import orbit
import tensorflow as tf
from absl import logging

from orbitask.tasks import CallbackContext, keras_compat, model_garden
from orbitask.tasks.errors import one_line
from orbitask.trainers import compat
from orbitask.trainers.actions import summaries
from orbitask.trainers.actions.callback_action import CallbackAction
from orbitask.trainers.actions.preemption import PreemptionWatcher
from orbitask.trainers.actions.profiling import Profiler
from orbitask.trainers.actions.progress import ProgressAction
from orbitask.trainers.actions.triggers import Trigger
from orbitask.trainers.distribution import cluster
from orbitask.trainers.distribution.strategies import build_strategy, logical_cpus
from orbitask.trainers.engine import evaluation, inputs, step_errors
from orbitask.trainers.engine.determinism import make_deterministic
from orbitask.trainers.engine.loop_length import LoopLength
from orbitask.trainers.engine.ps_trainer import ParameterServerTrainer
from orbitask.trainers.engine.steps import TaskObjects, TrainStep
from orbitask.trainers.engine.trainer import TaskTrainer
from orbitask.trainers.errors import ConfigError, EarlyStop
from orbitask.trainers.features.learning_rate import LearningRate
from orbitask.trainers.features.precision import DynamicLossScale, precision_policy
from orbitask.trainers.run import numeric_defaults, preflight, settings
from orbitask.trainers.run.controller import Controller
from orbitask.trainers.run.settings import Settings
from orbitask.trainers.run.settings import check as check_settings
from orbitask.trainers.state import (
    checkpoints,
    full_disk,
    model_dir_lock,
    random_state,
    saved_model,
)


class ExperimentRunner:
    """Builds every object of a run, whole and in order, then runs one mode. Eager.

    Args:
      task: an `orbitask.Task`, or a Model Garden `base_task.Task` (run through
        `tasks.model_garden.ModelGardenTask`).
      model_dir: checkpoints go here, summaries under `train/` and `eval/`.
      mode: "train", "eval", "train_and_eval", "continuous_eval" or "eval_all".
      settings: the run's `settings.Settings`.
      eval_checkpoint: with mode "eval", the checkpoint to evaluate instead of the newest.

    Raises:
      ConfigError: from the constructor, for a setting that needs no TensorFlow object.
    """

    def __init__(
        self,
        task: Any,
        model_dir: str,
        mode: str,
        settings: Settings,
        eval_checkpoint: str | None = None,
    ):
        task = model_garden.adapt(task)  # a Model Garden task runs as it is
        check_settings(task, model_dir, mode, settings)
        self.eval_checkpoint = eval_checkpoint
        if eval_checkpoint is not None:
            if mode != "eval":
                raise ConfigError(
                    f"`eval_checkpoint` ({eval_checkpoint!r}) is for --mode=eval; received mode "
                    f"{mode!r}. Drop --checkpoint (orbitask.run_experiment.eval_checkpoint) or "
                    "use --mode=eval."
                )
            evaluation.check_checkpoint(eval_checkpoint)
        # Saved checkpoints evaluated one by one, each restored by the runner: they only read
        # the model directory (no best export, learning-rate control or operative config).
        self.evaluates_saved = mode == "eval_all" or eval_checkpoint is not None
        self.task = task
        self.model_dir = model_dir
        self.mode = mode
        self.settings = settings
        self.training = mode in ("train", "train_and_eval")
        self.evaluating = mode != "train"
        self.results: dict = {"train": {}, "eval": {}}
        if self.evaluates_saved:
            self.results["evaluated"] = []
        self.trainer: TaskTrainer | None = None
        self.model_dir_lock = model_dir_lock.ModelDirLock(model_dir)  # one run per directory
        # SIGTERM: a training run saves, then every mode exits 75 (installed for the whole run).
        save = self._save_for_preemption if self.training else None
        self.preemption = PreemptionWatcher(self._step_now, save=save)

    def run(self) -> dict:
        """Builds everything, then runs the mode. Eager; returns `{"train", "eval"}` logs."""
        if cluster.is_server_task(self.settings.distribution.strategy):
            return cluster.serve()  # a parameter-server job's worker or ps task only serves
        with (
            compat.orbit_messages_to_absl(),
            keras_compat.recording_global_losses(),
            self.model_dir_lock,
            self.preemption,
        ):
            try:
                self.build()
            except (tf.errors.OpError, OSError) as e:  # a full disk before training started
                if not full_disk.is_unhandled(e):
                    raise
                kept = "training had not started"
                raise full_disk.no_space_error(e, self.model_dir, kept) from None
            return self._run()

    def _run(self) -> dict:
        warm_start = self.settings.checkpoints.warm_start
        if self.manager.latest_checkpoint is None:  # fresh run only: a resumed run keeps its own
            self.task.initialize(self.model)
            if warm_start is not None:
                warm_start.apply(self.model)
        attached = self.progress.attached() if self.progress else contextlib.nullcontext()
        failed = False
        with attached:
            try:
                result = self._run_mode()
            except EarlyStop as stop:
                step = int(self.global_step.numpy())
                self.manager.save(checkpoint_number=step, check_interval=False)
                print(f"orbitask: {stop}", flush=True)
                self.results["early_stop"] = str(stop)
                self._export_at_end()
                return self.results
            except BaseException as e:  # SIGTERM (exit 75) and errors: the async write ends first
                failed = True
                if full_disk.is_unhandled(e):  # e.g. summaries: the steps taken are saved first
                    raise self._save_for_full_disk(e) from None
                self.manager.sync_after_error()
                raise
            finally:  # also on SIGTERM (exit 75) and errors: the kept train scalars
                if self.profiler:
                    self.profiler.close()
                self._write_train_summaries(failed)
            self.manager.sync()  # raises NoSpaceError if the last async write found a full disk
            return result

    def _save_for_full_disk(self, error: BaseException) -> Exception:
        """Saves a checkpoint of the current step after `error`, a full disk outside a
        checkpoint save (unless the newest checkpoint is of that step); returns the run's
        one-line error.

        A checkpoint save is collective under `multi_worker_mirrored`: there the run stops
        without one (the other workers may be in a step).

        Raises:
          NoSpaceError: when the checkpoint's device is full too (its half-written files
            removed, the previous checkpoint intact).
        """
        multi_worker = isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy)
        if not self.training or multi_worker:
            self.manager.sync_after_error()
            kept = f"the checkpoints are as they were (newest: {self.manager.latest_checkpoint})"
            return full_disk.no_space_error(error, self.model_dir, kept)
        step = int(self.global_step.numpy())
        saved = self.manager.latest_checkpoint
        if not (saved and saved.endswith(f"-{step}")):
            saved = self.manager.save(checkpoint_number=step, check_interval=False)
        self.manager.sync()
        kept = f"the steps taken are saved in checkpoint {saved}"
        return full_disk.no_space_error(error, self.model_dir, kept)

    def _write_train_summaries(self, failed: bool) -> None:
        """Writes the kept train scalars; after an error (`failed`), a failure to write them
        is logged rather than raised over that error (quietly for a full disk, which the
        run's error names).

        Raises:
          NoSpaceError: when the device is full (`_save_for_full_disk`), unless `failed`.
        """
        try:
            self.train_summaries.write_pending()
            self.train_summaries.flush()
        except (tf.errors.OpError, OSError) as e:
            if not failed:
                if full_disk.is_unhandled(e):
                    raise self._save_for_full_disk(e) from None
                raise
            log = logging.info if full_disk.is_no_space(e) else logging.error
            log("the train summaries could not be written: %s", one_line(e, 300))

    def build(self) -> None:
        """Builds every object of the run, in this order. Eager; returns None."""
        self.strategy = self._build_strategy()
        self.chief = cluster.is_chief(self.strategy)  # keeps checkpoints, summaries, config
        if self.chief:
            print(f"orbitask: {cluster.describe(self.strategy)}", flush=True)
            notice = numeric_defaults.line(self.task, self.settings.features.nan_guard)
            if notice and self.training:
                print(notice, flush=True)
        preflight.check_model_dir(self.model_dir)
        self.model_dir_lock.take(self.chief and self.training)  # refused if another run holds it
        with self.strategy.scope():
            self._build_objects()
            self.train_input = self._build_train_input() if self.training else None
            self.train_steps = self._train_steps()
            self._build_summaries()
            self.callbacks = self._build_callbacks()
            self.checkpoint, self.manager = self._build_checkpoint()
        self.eval_dataset = self._build_eval_input() if self.evaluating else None
        self.trainer = self._build_trainer()
        if self.chief and not self.evaluates_saved:
            checkpoints.write_operative_config(self.model_dir)
        self.controller = self._build_controller()

    def _build_strategy(self):
        """Seeds and logical CPU devices first (they must precede TensorFlow's start)."""
        loop, distribution = self.settings.loop, self.settings.distribution
        if loop.seed is not None:
            make_deterministic(loop.seed)
        name = distribution.strategy
        if distribution.cpu_devices:
            wanted = distribution.cpu_devices
            settings.check_cpu_devices(wanted, len(logical_cpus(wanted)))
            if name == "auto" and not tf.config.list_logical_devices("GPU"):
                name = "mirrored"  # the replicas cpu_devices asks for
        strategy = build_strategy(name)
        replicas = strategy.num_replicas_in_sync
        settings.check_replicas(replicas, loop.global_batch_size, loop.jit_compile)
        return strategy

    def _build_objects(self) -> None:
        """The task's model, loss, optimizer and metrics, the step and the learning rate."""
        task, features = self.task, self.settings.features
        with precision_policy(features.mixed_precision), keras_compat.saved_layer_randomness():
            self.model = task.build_model()
        if task.keras_flavour is None:
            task.keras_flavour = keras_compat.model_flavour(self.model) or keras_compat.KERAS3
        needed = preflight.needs_losses(task, self.training, self.evaluating)
        self.loss_fn = task.build_losses() if needed else None
        self.global_step = orbit.utils.create_global_step()
        self.lr_control = LearningRate.create(self.settings.loop.learning_rate)
        self.lr = self.lr_control.lr
        self.optimizer = task.build_optimizer(float(self.lr.numpy()))
        self.lr_control.reconcile(self.optimizer, self.settings.loop.learning_rate)
        keras_compat.check_matching(self.model, self.optimizer)
        self.train_metrics = task.build_metrics(training=True) if self.training else []
        self.eval_metrics = task.build_metrics(training=False) if self.evaluating else []
        self.nan_guard = features.nan_guard if self.training else None
        if self.nan_guard is not None:
            settings.check_nan_guard_step(task)
            self.nan_guard.build()
        float16 = features.mixed_precision == "mixed_float16" and self.training
        self.loss_scale = DynamicLossScale() if float16 else None

    def _build_train_input(self):
        """The train input and its position, checked against the model and loss."""
        loop, keep = self.settings.loop, self.settings.checkpoints.input_positions
        batch = loop.global_batch_size
        per_step = (batch, loop.gradient_accumulation_steps)
        by_epochs = loop.train_steps is None
        train_input = inputs.train_input(
            self.task, self.strategy, *per_step, self.global_step, self.model_dir, keep, by_epochs
        )
        objects = (self.model, self.loss_fn, self.lr, self.optimizer, self.train_metrics, batch)
        return preflight.checked_train_input(self.task, self.strategy, train_input, objects)

    def _train_steps(self) -> int | None:
        """The step training stops at: `train_steps`, or else `train_epochs` (default one) epochs
        of the training input, the fewest of any worker's, said in one line. Eager.

        Raises:
          ConfigError: when the epochs come to no step.
        """
        loop = self.settings.loop
        if loop.train_steps is not None or not self.training:
            return loop.train_steps
        epochs, length = loop.train_epochs or 1, self.train_input.epoch_length
        steps = cluster.smallest(self.strategy, length.steps_for(epochs))
        if steps < 1:
            raise ConfigError(
                f"train_epochs={epochs} of {float(length.steps):.3g} steps each is no step; "
                "raise orbitask.run_experiment.train_epochs or lower global_batch_size."
            )
        if self.chief:
            per_epoch = f"{float(length.steps):.4g} steps per epoch"
            print(f"orbitask: {epochs} epoch(s) = {steps} train steps ({per_epoch})", flush=True)
        return steps

    def _build_summaries(self) -> None:
        model_dir, chief = self.model_dir, self.chief
        trains = chief and not self.evaluates_saved  # evaluating saved ones adds no train/
        self.train_summaries = summaries.LoopSummaryManager(
            os.path.join(model_dir, "train") if trains else None,
            summaries.write,
            self.global_step,
            interval=10 * self.settings.loop.steps_per_loop,
            current_step=self._step_now,
        )
        self.eval_summaries = orbit.utils.SummaryManager(
            os.path.join(model_dir, "eval") if chief else None, summaries.write, self.global_step
        )

    def _build_callbacks(self) -> CallbackAction:
        interval = self.settings.features.histogram_interval
        triggered = [(Trigger(every_steps=interval), [summaries.histograms])] if interval else []
        # Under parameter_server, deferred callbacks end loops like the others (no history).
        ps = cluster.is_parameter_server(self.strategy)
        return CallbackAction(
            self.task,
            self.global_step,
            self._callback_context,
            self.train_summaries.summary_writer(),
            history=None if ps else self._loop_history,
            current_step=self._step_now,
            triggered=triggered,
        )

    def _build_checkpoint(self):
        """The checkpoint of everything a resumed run needs, and this worker's manager."""
        extra_state = {"learning_rate_factor": self.lr_control.factor}
        features, control = self.settings.features, self.settings.evaluation.validation_control
        if features.ema is not None:
            extra_state["ema"] = features.ema.build(self.model)
        if self.loss_scale is not None:
            extra_state["loss_scale"] = self.loss_scale.checkpoint()
        if self.nan_guard is not None:  # its counters and loss average resume too
            extra_state["nan_guard"] = self.nan_guard.checkpoint()
        if control is not None and self.evaluating and not self.evaluates_saved:
            extra_state["validation_control"] = control.build(self.task)
        if self.mode == "train_and_eval":  # the Controller's record of the last evaluation
            extra_state["evaluated_step"] = tf.Variable(
                -1,  # no record: a fresh run, or a checkpoint written without evaluations
                dtype=tf.int64,
                trainable=False,
                name="evaluated_step",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )
        roots = {"task": self.task, "model": self.model, "loss": self.loss_fn}
        if (randomness := random_state.checkpointable(roots)) is not None:
            extra_state["random_state"] = randomness
        checkpoint, manager = checkpoints.build(
            self.task,
            self.model_dir,
            self.global_step,
            self.lr,
            self.optimizer,
            self.model,
            self.loss_fn,
            self.train_input,
            self.callbacks.trackables(),
            extra_state,
            asynchronous=self.settings.checkpoints.asynchronous,
        )
        self.saved = [self.eval_checkpoint] if self.eval_checkpoint else []
        if self.mode == "eval_all":
            self.saved = evaluation.saved_checkpoints(manager)
        if self.mode == "eval" and not self.saved and manager.latest_checkpoint is None:
            raise ConfigError(
                f"--mode=eval evaluates the latest checkpoint, and {self.model_dir!r} has none; "
                "pass the --model_dir you trained into (continuous_eval waits for checkpoints)."
            )
        return checkpoint, cluster.for_this_worker(manager, self.strategy)

    def _build_eval_input(self):
        """The validation dataset, or a dict `{name: dataset}` of validation sets, each
        checked to end (or to have `eval_steps`) and to have a batch."""
        batch, steps = self.settings.loop.global_batch_size, self.settings.evaluation.steps
        datasets = inputs.eval_datasets(self.task, self.strategy, batch)
        if not isinstance(datasets, dict):
            preflight.check_finite_eval(self.task, datasets, steps)
            return datasets
        for name, dataset in datasets.items():
            try:
                preflight.check_finite_eval(self.task, dataset, steps)
            except ConfigError as e:
                raise ConfigError(f"validation set {name!r}: {e}") from None
        return datasets

    def _build_trainer(self) -> TaskTrainer:
        loop, features = self.settings.loop, self.settings.features
        ps = cluster.is_parameter_server(self.strategy)
        objects = TaskObjects(
            self.task, self.strategy, self.model, self.optimizer, self.loss_fn, self.lr,
            self.global_step, loop.global_batch_size, self.train_metrics, self.eval_metrics,
            self.lr_control.follows,
        )  # fmt: skip
        step = TrainStep(
            objects,
            accumulation=loop.gradient_accumulation_steps,
            schedule=self.lr_control if self.lr_control.schedule else None,
            nan_guard=self.nan_guard,
            loss_scale=self.loss_scale,
            ema=features.ema,
            jit_compile=loop.jit_compile,
        )
        trainer_cls = ParameterServerTrainer if ps else TaskTrainer
        trainer = trainer_cls(
            objects=objects,
            step=step,
            train_iterator=self.train_input.iterator if self.training else None,
            eval_dataset=self.eval_dataset,
            use_tf_while_loop=loop.use_tf_while_loop,
            nan_guard=self.nan_guard,
            ema=features.ema,
            record_history=self.callbacks.has_deferred and not ps,
        )
        if self.training:  # a restore may rebuild the input (`trainers.input_position`)
            self.train_input.on_new_iterator = trainer.set_train_iterator
        return trainer

    def _build_train_actions(self) -> list:
        """The Orbit train actions, in order: callbacks (and a schedule's rate they assigned),
        results, progress, profiler, NaN guard, SIGTERM."""
        actions = [self.callbacks, self._keep_train_logs]
        if self.lr_control.schedule is not None:  # a callback's `ctx.lr.assign` lasts
            actions.insert(1, self.lr_control.keep_assigned)
        self.progress = None
        if self.settings.loop.progress and self.chief:
            self.progress = ProgressAction(
                self.global_step,
                self.train_steps,
                current_step=self._step_now,
                epochs=self.settings.loop.train_epochs,
            )
            actions.append(self.progress)
        self.profiler = None
        if (steps := self.settings.features.profile_steps) is not None:  # loops end alike
            logdir = os.path.join(self.model_dir, "train")
            self.profiler = Profiler(steps, logdir, self._step_now, self.trainer, self.chief)
            actions.append(self.profiler)
        if self.nan_guard is not None:
            # Last but one, before the Controller's save: a rollback must precede any checkpoint.
            actions.append(
                self.nan_guard.action(
                    self.checkpoint, self.manager, self.strategy, self.global_step, self.trainer
                )
            )
        actions.append(self.preemption)  # last: saves the state every other action left
        return actions

    def _build_eval_actions(self) -> list:
        actions = [self._keep_eval_logs]
        control = self.settings.evaluation.validation_control
        if control is not None and self.evaluating and not self.evaluates_saved:
            actions.append(
                # A non-chief worker exports its best checkpoint into its own temp folder.
                control.action(
                    getattr(self.manager, "temp_directory", self.model_dir),
                    self.checkpoint,
                    self.manager,
                    self.lr_control,
                    self.global_step,
                    ema=self.settings.features.ema,
                    strategy=self.strategy,
                    trainer=self.trainer,
                    train_steps=self.train_steps if self.training else None,
                )
            )
        actions.append(self.preemption)  # last: after the evaluation's record and best export
        return actions

    def _build_controller(self) -> Controller:
        loop, saves = self.settings.loop, self.settings.checkpoints
        agree = functools.partial(cluster.every_worker, self.strategy)
        self.loop_length = LoopLength(loop.steps_per_loop, loop.loop_seconds, agree=agree)
        return Controller(
            checkpoint_interval=saves.interval,
            checkpoint_seconds=saves.seconds,
            save_at_completion=True,
            enable_async_checkpointing=saves.asynchronous,
            on_loop=self.loop_length.observe,
            evaluated_step=getattr(self.checkpoint, "evaluated_step", None),
            eval_at_start=self.settings.evaluation.at_start,
            global_step=self.global_step,
            trainer=self.trainer if self.training else None,
            evaluator=self.trainer if self.evaluating else None,
            strategy=self.strategy,
            train_actions=self._build_train_actions(),
            eval_actions=self._build_eval_actions(),
            steps_per_loop=self._steps_per_loop,
            # None: no restore of the newest checkpoint; `_evaluate_saved` restores each one.
            checkpoint_manager=None if self.evaluates_saved else self.manager,
            summary_manager=self.train_summaries,
            eval_summary_manager=self.eval_summaries,
            eval_summary_dir=os.path.join(self.model_dir, "eval"),  # else Orbit reuses train/
        )

    def _save_for_preemption(self) -> str:
        """Saves the training state at the current step for SIGTERM's exit 75, unless the
        newest checkpoint holds it. Eager; returns the checkpoint's path."""
        return self.controller.save_now()

    def _step_now(self) -> int:
        """The global step after the last device loop (no read of the variable once a loop ran)."""
        if self.trainer is None:
            return int(self.global_step.numpy())
        return self.trainer.step_now()

    def _loop_history(self) -> tuple[int, dict]:
        return self.trainer.loop_history

    def _callback_context(self, step: int, logs: dict) -> CallbackContext:
        return CallbackContext(
            step=step,
            logs=dict(logs),
            lr=self.lr,
            optimizer=self.optimizer,
            model=self.model,
            loss_fn=self.loss_fn,
            checkpoint=self.checkpoint,
            manager=self.manager,
            strategy=self.strategy,
            summary_writer=self.train_summaries.summary_writer(),
        )

    def _steps_per_loop(self, step: int) -> int:
        """A device loop's length from `step`: the grown length, cut where a callback is due
        (the Controller also ends loops at checkpoint steps)."""
        return self.loop_length.steps_from(step, (self.callbacks, *filter(None, [self.profiler])))

    def _keep_train_logs(self, output: dict) -> None:
        self.results["train"] = dict(output)

    def _keep_eval_logs(self, output: dict) -> None:
        sets = self.eval_dataset if isinstance(self.eval_dataset, dict) else ()
        self.results["eval"] = evaluation.flat_set_logs(output, sets)  # "<set>/<key>"

    def _run_mode(self) -> dict:
        control = self.settings.evaluation.validation_control
        if self.progress:
            self.progress.start()
        if self.profiler:
            self.profiler.start_if_due(self._step_now())
        if self.training and control is not None and control.stopped():
            raise EarlyStop(f"already stopped early at step {int(self.global_step.numpy())}")
        train_steps = self.train_steps
        evaluation = self.settings.evaluation
        eval_steps = evaluation.steps or -1
        with step_errors.named_by_step(self.global_step, self.manager, train_steps):
            if self.mode == "train":
                self.controller.train(train_steps)
            elif self.mode == "train_and_eval":
                self.controller.train_and_evaluate(
                    train_steps, eval_steps, evaluation.interval, evaluation.seconds
                )
            elif self.evaluates_saved:
                self._evaluate_saved(eval_steps)
            elif self.mode == "eval":
                self.controller.evaluate(eval_steps)
            else:
                # Poll for new checkpoints; stop once the one at train_steps has been evaluated.
                self.controller.evaluate_continuously(
                    eval_steps,
                    timeout=evaluation.continuous_timeout or 30,
                    # By epochs (train_steps None) the last step is unknown here: it polls on.
                    timeout_fn=lambda: (
                        train_steps is not None and int(self.global_step.numpy()) >= train_steps
                    ),
                    waiting=self.preemption.waiting,  # SIGTERM ends a wait at once
                )
        self._export_at_end()
        self._finish()
        return self.results

    def _evaluate_saved(self, eval_steps: int) -> None:
        """Evaluates each of `self.saved` in order at its own step: restored, evaluated, its
        summaries written under `eval/` at that step, one line printed (eval_all). Eager."""
        for path in self.saved:
            with self.strategy.scope():
                checkpoints.restore(self.checkpoint, path)
            step = int(self.global_step.numpy())
            self.controller.evaluate(eval_steps)
            self.eval_summaries.flush()
            logs = dict(self.results["eval"])
            self.results["evaluated"].append({"checkpoint": path, "step": step, "eval": logs})
            if self.mode == "eval_all":
                print(f"orbitask: {os.path.basename(path)}: {_eval_line(step, logs)}", flush=True)

    def _export_at_end(self) -> None:
        """With `export_at_end`, the trained model (EMA averages if set) as a SavedModel."""
        features = self.settings.features
        if not (features.export_at_end and self.training):
            return
        root = getattr(self.manager, "temp_directory", self.model_dir)  # a non-chief: its own
        replicas = self.strategy.num_replicas_in_sync
        batch = self.settings.loop.global_batch_size // replicas
        with features.ema.averaged() if features.ema else contextlib.nullcontext():
            path = saved_model.write(
                self.task, self.model, os.path.join(root, "export"), self._step_now(), batch
            )
        if self.chief:
            self.results["export"] = path
            print(f"orbitask: SavedModel in {path}", flush=True)

    def _finish(self) -> None:
        self.train_summaries.write_pending()
        self.train_summaries.flush()
        self.eval_summaries.flush()
        line = _eval_line(int(self.global_step.numpy()), self.results["eval"])
        if line and self.mode != "eval_all":  # eval_all printed one line per checkpoint
            print(f"orbitask: {line}")
        print(f"orbitask: checkpoints in {self.model_dir}; TensorBoard: --logdir {self.model_dir}")


def _eval_line(step: int, logs: dict) -> str | None:
    """The report line of an evaluation at `step` (its scalar logs), or None without any."""
    scalars = {k: v for k, v in logs.items() if isinstance(v, (int, float))}
    if not scalars:
        return None
    text = ", ".join(f"{k} {v:.4g}" for k, v in sorted(scalars.items()))
    return f"eval at step {step}: {text}"
