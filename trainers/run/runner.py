"""`ExperimentRunner`: builds a Task's objects on a strategy and runs an Orbit controller.

The run is built by steps in the order `build` lists, each a method a subclass may override (as
in Model Garden's `OrbitExperimentRunner`) returning what it builds, whole. Their work is in
`builders`, `checkpoint_setup` and `entries`; running the mode is `modes.ModeRunning`, a base
class; what the run prints is `messages`.
"""

from __future__ import annotations

import copy
import functools
import os
from typing import Any

import tensorflow as tf

from orbitask.tasks import model_garden
from orbitask.trainers import compat
from orbitask.trainers.actions.callback_action import CallbackAction
from orbitask.trainers.actions.profiling import Profiler
from orbitask.trainers.actions.progress import ProgressAction
from orbitask.trainers.actions.schedule import Periodic
from orbitask.trainers.distribution import cluster
from orbitask.trainers.engine import inputs, user_code
from orbitask.trainers.engine.loop_length import LoopLength
from orbitask.trainers.engine.task_trainer import TaskTrainer
from orbitask.trainers.run import (
    batch_checks,
    builders,
    checkpoint_setup,
    entries,
    folders,
    messages,
)
from orbitask.trainers.run.controller import Controller
from orbitask.trainers.run.modes import ModeRunning
from orbitask.trainers.run.settings import Settings
from orbitask.trainers.run.settings import check as check_settings
from orbitask.trainers.state import full_disk, model_dir_lock


class ExperimentRunner(ModeRunning):
    """Builds every object of a run, whole and in order, then runs one mode. Eager.

    Args:
      task: an `orbitask.Task`, or a Model Garden `base_task.Task` (run through
        `tasks.model_garden.ModelGardenTask`).
      model_dir: checkpoints go here, summaries under `train/` and `eval/`.
      mode: "train", "eval", "train_and_eval", "continuous_eval" or "eval_all".
      settings: the run's `settings.Settings`.
      eval_checkpoint: with mode "eval", the checkpoint to evaluate instead of the newest.
      output_dir: an evaluation mode's `eval/` goes here (None: `model_dir`).
      summary_dir: TensorBoard's `train/` and `eval/` go here (None: `model_dir`, `output_dir`).

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
        output_dir: str | None = None,
        summary_dir: str | None = None,
    ):
        task = model_garden.adapt(task)  # a Model Garden task runs as it is
        check_settings(task, model_dir, mode, settings)
        checkpoint_setup.check_eval_checkpoint(eval_checkpoint, mode)
        self.eval_checkpoint = eval_checkpoint
        self.output_dir = folders.output_dir(model_dir, output_dir, mode)  # eval/ goes there
        self.summary_dir = summary_dir  # a platform's TensorBoard folder, or None
        # Saved checkpoints evaluated one by one, each restored by the runner: they only read
        # the model directory (no best export, learning-rate control or operative config).
        self.evaluates_saved = mode == "eval_all" or eval_checkpoint is not None
        # The run's own copy of the validation control (the settings' stays as given), for a
        # run that evaluates as it goes; else None.
        control = settings.evaluation.validation_control
        live = control is not None and mode != "train" and not self.evaluates_saved
        self.validation_control = copy.copy(control) if live else None
        self.task = task
        self.model_dir = model_dir
        self.mode = mode
        self.settings = settings
        self.training = mode in ("train", "train_and_eval")
        self.evaluating = mode != "train"
        self.results: dict = {"train": {}, "eval": {}}
        self.evaluations: list[tuple[int, dict]] = []  # (step, flat logs) of each evaluation
        if self.evaluates_saved:
            self.results["evaluated"] = []
        self.trainer: TaskTrainer | None = None
        self.model_dir_lock = model_dir_lock.ModelDirLock(model_dir)  # one run per directory
        # SIGTERM: a training run saves, then every mode exits 75 (installed for the whole run).
        save = self._save_for_preemption if self.training else None
        self.preemption = entries.build_preemption(settings.checkpoints, self._step_now, save)

    def run(self) -> dict:
        """Builds everything, then runs the mode. Eager; returns `{"train", "eval"}` logs."""
        if cluster.is_server_task(self.settings.distribution.strategy):
            return cluster.serve()  # a parameter-server job's worker or ps task only serves
        with (
            compat.orbit_messages_to_absl(),
            self.model_dir_lock,
            self.preemption,
            user_code.eagerly(self.settings.loop.run_eagerly),  # the checks before step 1 too
        ):
            try:
                self.build()
            except (tf.errors.OpError, OSError) as e:  # a full disk before training started
                if not full_disk.is_unhandled(e):
                    raise
                kept = "training had not started"
                raise full_disk.no_space_error(e, self.model_dir, kept) from None
            results = self._run()
            results["best"] = self._best()
            return results

    def build(self) -> None:
        """Builds every object of the run, in this order; each step returns what it builds,
        assigned here. Eager; returns None.

        ```text
        _build_strategy           seeds, logical CPU devices, the tf.distribute strategy
        in strategy.scope():
          _build_objects          model, loss, global step, learning rate, optimizer, metrics
          _build_train_input      the train input and its position, checked (training only)
          _train_steps            the step training stops at (from epochs if need be)
          _build_summaries        train/ and eval/ summary managers
          _build_callbacks        the Task's callbacks as an Orbit action
          _build_checkpoint       the checkpoint and this worker's manager
          _checkpoints_to_evaluate  the saved checkpoints evaluated one by one
        _build_eval_input         the validation dataset(s) (evaluating only), each first
                                  batch through validation_step (`preflight`)
        _build_trainer            RunObjects + TrainStep -> TaskTrainer
        _build_loop_length        device loops' length
        _build_progress, _build_profiler
        _build_controller         the Controller, with _build_train_entries, _build_eval_actions;
                                  it restores the newest checkpoint; then operative_config.gin
        ```
        """
        self.strategy = self._build_strategy()
        codes = len(self.preemption.codes)
        self.preemption.take_back(agree=cluster.signal_agreement(self.strategy, codes))
        self.chief = cluster.is_chief(self.strategy)  # keeps checkpoints, summaries, config
        if self.chief:
            messages.run_start(self.strategy, self.task, self.settings, self.training)
        folders.check_model_dir(self.model_dir, self.output_dir, self.training)
        self.model_dir_lock.take(self.chief and self.training)  # refused if another run holds it
        with self.strategy.scope():
            self.objects = self._build_objects()
            self.train_input = self._build_train_input() if self.training else None
            self.train_steps = self._train_steps()
            self.summaries = self._build_summaries()
            self.callbacks = self._build_callbacks()
            self.checkpointing = self._build_checkpoint()
            self.saved = self._checkpoints_to_evaluate()
        self.eval_dataset = self._build_eval_input() if self.evaluating else None
        if self.eval_dataset is not None:
            batch_checks.check_first_eval_batches(
                self.task, self.strategy, self.eval_dataset, self.objects
            )
        self.trainer = self._build_trainer()
        if self.training:  # a restore may rebuild the input (`trainers.state.input_position`)
            self.train_input.on_new_iterator = self.trainer.set_train_iterator
        self.loop_length = self._build_loop_length()
        self.progress = self._build_progress()
        self.profiler = self._build_profiler()
        self.controller = self._build_controller()  # restores the newest checkpoint
        # Only now, the run accepted: a refused command leaves the run's record as it was.
        if self.chief and self.training:
            state, summaries = self.checkpointing, self.summaries
            checkpoint_setup.record_start(self.model_dir, self.objects, state, summaries)

    def _build_strategy(self) -> tf.distribute.Strategy:
        """Seeds and logical CPU devices first (they must precede TensorFlow's start)."""
        return builders.build_strategy(self.settings)

    def _build_objects(self) -> builders.RunObjects:
        """The task's model, loss, optimizer and metrics, the step and the learning rate."""
        return builders.build_objects(
            self.task, self.strategy, self.settings, self.training, self.evaluating
        )

    def _build_train_input(self) -> inputs.TrainInput:
        """The train input and its position, checked against the model and loss."""
        return builders.build_train_input(
            self.task, self.strategy, self.objects, self.settings, self.model_dir
        )

    def _train_steps(self) -> int | None:
        """The step training stops at: `train_steps`, else `train_epochs` of the input."""
        return builders.build_train_steps(
            self.settings, self.train_input, self.strategy, self.chief
        )

    def _build_summaries(self) -> builders.SummaryManagers:
        """The train/ (a training run's) and eval/ summary managers; the chief's write."""
        return builders.build_summaries(
            self.model_dir,
            self.output_dir,
            self.objects.global_step,
            self.settings,
            self._step_now,
            write_train=self.chief and self.training,
            write_eval=self.chief,
            summary_dir=self.summary_dir,
        )

    def _build_callbacks(self) -> CallbackAction:
        """The Task's callbacks as an Orbit action."""
        return entries.build_callbacks(
            self.task,
            self.strategy,
            self.objects.global_step,
            self.summaries.train.summary_writer(),
            self.settings.features.histogram_interval,
            context=self._callback_context,
            history=lambda: self.trainer.loop_history,
            current_step=self._step_now,
        )

    def _build_checkpoint(self) -> checkpoint_setup.Checkpointing:
        """The checkpoint of everything a resumed run needs, and this worker's manager."""
        state = checkpoint_setup.checkpointed_state(
            self.task, self.objects, self.settings, self.mode, self.validation_control
        )
        return checkpoint_setup.build_checkpointing(
            self.task,
            self.model_dir,
            self.objects,
            train_input=self.train_input,
            stateful_callbacks=self.callbacks.trackables(),
            extra_state=state,
            asynchronous=self.settings.checkpoints.async_checkpoints,
            max_to_keep=self.settings.checkpoints.max_to_keep,
            strategy=self.strategy,
        )

    def _checkpoints_to_evaluate(self) -> list[str]:
        """The saved checkpoints evaluated one by one: `eval_checkpoint`, or all for eval_all."""
        return checkpoint_setup.checkpoints_to_evaluate(
            self.mode, self.eval_checkpoint, self.checkpointing.manager, self.model_dir
        )

    def _build_eval_input(self) -> Any:
        """The validation dataset, or a dict `{name: dataset}` of validation sets, each
        checked to end (or to have `eval_steps`) and to have a batch."""
        batch, steps = self.settings.loop.global_batch_size, self.settings.evaluation.eval_steps
        return builders.build_eval_input(self.task, self.strategy, batch, steps)

    def _build_trainer(self) -> TaskTrainer:
        """RunObjects + TrainStep -> TaskTrainer (ParameterServerTrainer under PS)."""
        return builders.build_trainer(
            self.task,
            self.strategy,
            self.objects,
            self.settings,
            train_input=self.train_input,
            eval_dataset=self.eval_dataset,
            callbacks=self.callbacks,
        )

    def _build_loop_length(self) -> LoopLength:
        """The device loops' length, grown toward `loop_seconds`; every worker agrees on it."""
        loop = self.settings.loop
        agree = functools.partial(cluster.every_worker, self.strategy)
        return LoopLength(loop.steps_per_loop, loop.loop_seconds, agree=agree)

    def _build_progress(self) -> ProgressAction | None:
        """The chief's progress display, unless `progress` is off."""
        loop, step = self.settings.loop, self.objects.global_step
        return entries.build_progress(loop, step, self.train_steps, self._step_now, self.chief)

    def _build_profiler(self) -> Profiler | None:
        """The profiler of `profile_steps`, or None."""
        steps, folder = self.settings.features.profile_steps, self.summary_dir or self.model_dir
        return entries.build_profiler(steps, folder, self._step_now, self.trainer, self.chief)

    def _build_train_entries(self) -> list[Periodic]:
        """The run's entries of the Controller's schedule, in order: callbacks (and a schedule's
        rate they assigned), the metrics' window, results, progress, profiler, NaN guard,
        SIGTERM."""
        objects, state, nan_guard = self.objects, self.checkpointing, self.objects.nan_guard
        if nan_guard is not None:
            nan_guard = nan_guard.entry(
                state.checkpoint, state.manager, self.strategy, objects.global_step, self.trainer
            )
        return entries.train_entries(
            callbacks=self.callbacks,
            keep_logs=self._keep_train_logs,
            learning_rate=objects.learning_rate,
            progress=self.progress,
            profiler=self.profiler,
            nan_guard=nan_guard,
            preemption=self.preemption,
            model_dir_check=self._recreate_if_deleted if self.chief and self.training else None,
            metrics_window=entries.metrics_window_entry(
                objects.train_metrics, self.settings.loop.metrics_window
            ),
        )

    def _build_eval_actions(self) -> list:
        """The Orbit eval actions, in order: results, validation control, SIGTERM."""
        control, validation, state = self.validation_control, None, self.checkpointing
        if control is not None:
            validation = control.action(
                # A non-chief worker exports its best checkpoint into its own temp folder.
                getattr(state.manager, "temp_directory", self.model_dir),
                state.checkpoint,
                state.manager,
                self.objects.learning_rate,
                self.objects.global_step,
                ema=self.objects.ema,
                strategy=self.strategy,
                trainer=self.trainer,
                train_steps=self.train_steps if self.training else None,
            )
        return entries.eval_actions(
            keep_logs=self._keep_eval_logs, validation=validation, preemption=self.preemption
        )

    def _build_controller(self) -> Controller:
        """The Controller with the run's schedule entries and eval actions."""
        saves, manager = self.settings.checkpoints, self.checkpointing.manager
        return Controller(
            checkpoint_interval=saves.checkpoint_interval,
            checkpoint_seconds=saves.checkpoint_seconds,
            save_at_completion=True,
            enable_async_checkpointing=saves.async_checkpoints,
            on_loop=self.loop_length.observe,
            evaluated_step=getattr(self.checkpointing.checkpoint, "evaluated_step", None),
            eval_at_start=self.settings.evaluation.eval_at_start,
            global_step=self.objects.global_step,
            trainer=self.trainer if self.training else None,
            evaluator=self.trainer if self.evaluating else None,
            strategy=self.strategy,
            periodic=self._build_train_entries(),
            step_rate=self.progress.rate if self.progress else None,  # one steps/s for both
            eval_actions=self._build_eval_actions(),
            steps_per_loop=self.loop_length.steps_from,
            # None: no restore of the newest checkpoint; `_evaluate_saved` restores each one.
            checkpoint_manager=None if self.evaluates_saved else manager,
            summary_manager=self.summaries.train,
            eval_summary_manager=self.summaries.eval,
            # Not None, or Orbit reuses train/'s writer.
            eval_summary_dir=os.path.join(self.summary_dir or self.output_dir, "eval"),
        )
