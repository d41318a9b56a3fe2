"""Running the mode of a built run and finishing it: the final evaluation, the export at the end,
the results line, and a save when SIGTERM or a full disk ends the run.

`ModeRunning` is the running half of `runner.ExperimentRunner`: its methods read the objects
`ExperimentRunner.build` assigned (`objects`, `checkpointing`, `summaries`, `controller`, ...),
and the built actions call back into it (`_step_now`, `_callback_context`, `_keep_train_logs`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

import tensorflow as tf
from absl import logging

from orbitask.common.errors import one_line
from orbitask.tasks import CallbackContext
from orbitask.trainers.actions import summaries
from orbitask.trainers.engine import evaluation, step_errors
from orbitask.trainers.engine.task_trainer import step_now
from orbitask.trainers.errors import EarlyStop
from orbitask.trainers.features.nan_guard import ZeroedSteps
from orbitask.trainers.run import best, checkpoint_setup, entries, messages, saved_model
from orbitask.trainers.run.controller import Controller
from orbitask.trainers.run.settings import EvalSettings
from orbitask.trainers.state import checkpoint_restore, full_disk, run_facts, settings_record


class ModeRunning:
    """Runs one mode of a run `build` has built, then finishes it. Eager.

    A mixin of `runner.ExperimentRunner`, which sets every attribute these methods read.
    """

    def _run(self) -> dict:
        objects, manager = self.objects, self.checkpointing.manager
        self.controller.on_saved = self._saved
        warm_start = self.settings.checkpoints.warm_start
        if manager.latest_checkpoint is None:  # fresh run only: a resumed run keeps its own
            self.task.initialize(objects.model)
            if warm_start is not None:
                warm_start.apply(objects.model)
        self.facts = None
        if self.training and self.chief:  # run.json, model_summary.txt, the models' sizes
            self.facts = run_facts.RunFacts(self.model_dir)
            batch, step = self.settings.loop.global_batch_size, self._step_now()
            for line in self.facts.start(objects.model, self.strategy, batch, self.mode, step):
                messages.say(line)
        attached = self.progress.attached() if self.progress else contextlib.nullcontext()
        self.zeroed = ZeroedSteps.of_run(self.training and self.chief, self.strategy, objects)
        counting = self.zeroed.counting() if self.zeroed else contextlib.nullcontext()
        failed = ""  # the exception that stopped the run, by name
        with attached, counting:
            try:
                result = self._run_mode()  # under `run_eagerly` when set (`runner.run`)
            except EarlyStop as stop:
                step = int(objects.global_step.numpy())
                manager.save(checkpoint_number=step, check_interval=False)
                messages.say(str(stop))
                self.results["early_stop"] = str(stop)
                self._export_at_end()
                self._end_facts("EarlyStop")
                return self.results
            except BaseException as e:  # SIGTERM (exit 75) and errors: the async write ends first
                failed = type(e).__name__
                if full_disk.is_unhandled(e):  # e.g. summaries: the steps taken are saved first
                    raise self._save_for_full_disk(e) from None
                manager.sync_after_error()
                raise
            finally:  # also on SIGTERM (exit 75) and errors: the kept train scalars
                if self.profiler:
                    self.profiler.close()
                self._write_train_summaries(bool(failed))
                if failed and self.zeroed is not None:
                    self.zeroed.end()
                if failed:
                    self._end_facts(failed)
            manager.sync()  # raises NoSpaceError if the last async write found a full disk
            return result

    def _end_facts(self, ended: str) -> None:
        """Ends run.json's entry of a run that stopped (`ended`: why); a failure to write it is
        logged, never raised over the run's own error; the loggers record the end. Eager."""
        self._end_records(ended)
        if self.facts is None:
            return
        try:
            self.facts.end(self._step_now(), ended)
        except (tf.errors.OpError, OSError, ValueError) as e:  # NoSpaceError is a ValueError
            logging.info("run.json could not be completed: %s", one_line(e, 300))

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
        manager = self.checkpointing.manager
        multi_worker = isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy)
        if not self.training or multi_worker:
            manager.sync_after_error()
            kept = f"the checkpoints are as they were (newest: {manager.latest_checkpoint})"
            return full_disk.no_space_error(error, self.model_dir, kept)
        step = int(self.objects.global_step.numpy())
        saved = manager.latest_checkpoint
        if not (saved and saved.endswith(f"-{step}")):
            saved = manager.save(checkpoint_number=step, check_interval=False)
        manager.sync()
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
            self.summaries.train.write_pending()
            self.summaries.train.flush()
        except (tf.errors.OpError, OSError) as e:
            if not failed:
                if full_disk.is_unhandled(e):
                    raise self._save_for_full_disk(e) from None
                raise
            log = logging.info if full_disk.is_no_space(e) else logging.error
            log("the train summaries could not be written: %s", one_line(e, 300))

    def _save_for_preemption(self) -> str:
        """Saves the training state at the current step for SIGTERM's exit 75, unless the
        newest checkpoint holds it. Eager; returns the checkpoint's path (the chief's, on every
        worker)."""
        path = self.controller.save_now()
        return path if self.chief else os.path.join(self.model_dir, os.path.basename(path))

    def _recreate_if_deleted(self) -> None:
        """After each device loop (before its summaries and saves): a model directory deleted
        during the run is said in one line and made again whole (the next save writes the
        checkpoint): the lock, the settings record, `run.json`, `model_summary.txt` and new
        summary files. Eager, the chief of a training run."""
        if tf.io.gfile.isdir(self.model_dir):
            return
        messages.say(
            f"--model_dir {self.model_dir} was deleted during the run at step {self._step_now()}; "
            "making it again: the lock, the settings record, run.json, model_summary.txt and new "
            "summary files now, the checkpoints from the next save on"
        )
        tf.io.gfile.makedirs(self.model_dir)
        self.model_dir_lock.release()
        self.model_dir_lock.take(True)
        settings_record.record(self.model_dir, self._step_now(), resumed=False, lr_now=None)
        if self.facts is not None:
            self.facts.write_again()
        for manager in (self.summaries.train, self.summaries.eval):
            summaries.reopen(manager)
        self.callbacks.summary_writer = self.summaries.train.summary_writer()

    def _where(self) -> str | None:
        """What the run is doing: a schedule entry's name, or the trainer's phase."""
        return self.controller.schedule.running or self.trainer.phase

    def _step_now(self) -> int:
        """The global step (`engine.task_trainer.step_now`)."""
        return step_now(self.trainer, self.objects.global_step)

    def _saved(self, path: str) -> None:
        """The Controller's `on_saved`: the Task's `on_checkpoint_saved`, once a path (a save
        again of one step, for its evaluation record, is not a new checkpoint). Eager."""
        if path != getattr(self, "_last_saved", None):
            self._last_saved = path
            self.task.on_checkpoint_saved(self._callback_context(self._step_now(), {}, path))

    def _callback_context(self, step: int, logs: dict, path: str | None = None) -> CallbackContext:
        objects, state = self.objects, self.checkpointing
        kept = getattr(getattr(self, "trainer", None), "kept", None)  # a step's tensors
        return CallbackContext(
            step=step,
            logs=dict(logs),
            lr=objects.lr,
            optimizer=objects.optimizer,
            model=objects.model,
            loss_fn=objects.loss_fn,
            checkpoint=state.checkpoint,
            manager=state.manager,
            strategy=self.strategy,
            summary_writer=self.summaries.train.summary_writer(),
            scalars=self.summaries.train.scalars,
            checkpoint_path=path,
            **(kept.at(step) if kept is not None else {}),
        )

    def _keep_train_logs(self, output: dict) -> None:
        self.results["train"] = dict(output)
        if self.zeroed is not None:
            self.zeroed.after_loop(self._step_now(), self.summaries.train.summary_writer())

    def _keep_eval_logs(self, output: dict) -> None:
        """Keeps an evaluation's logs, and says its line (the chief; eval_all says its own)."""
        sets = self.eval_dataset if isinstance(self.eval_dataset, dict) else ()
        self.results["eval"] = evaluation.flat_set_logs(output, sets)  # "<set>/<key>"
        self.evaluations.append((self._step_now(), self.results["eval"]))  # for `best`
        line = messages.eval_line(self._step_now(), self.results["eval"])
        if line and self.chief and not self.evaluates_saved:
            messages.say(line)
        self.task.on_evaluation_end(self._callback_context(self._step_now(), self.results["eval"]))

    def _best(self) -> best.Best | None:
        """The run's best evaluation of its ranked metric (`best`), said in one line; None on a
        worker other than the chief or when nothing ranked was evaluated. Eager."""
        if not (self.chief and self.evaluating):
            return None
        saved = None
        if self.evaluates_saved:
            saved = {e["step"]: e["checkpoint"] for e in self.results["evaluated"]}
            self.evaluations = [(e["step"], e["eval"]) for e in self.results["evaluated"]]
        found = best.of_run(
            self.model_dir, self.evaluations, self.validation_control, saved, self.training
        )
        if found is not None:
            messages.say(found.line())
        return found

    def _run_mode(self) -> dict:
        eval_settings, global_step = self.settings.evaluation, self.objects.global_step
        control = self.validation_control  # the run's own, built copy
        if self.training and control is not None and control.stopped():
            raise EarlyStop(f"already stopped early at step {int(global_step.numpy())}")
        step = self._step_now()
        if self.training and self.chief and step >= self.train_steps:
            messages.say(
                f"already at step {step} >= train_steps {self.train_steps}; nothing to train"
            )
        manager = self.checkpointing.manager
        save = self._save_for_preemption if self.training else None
        with step_errors.named_by_step(global_step, manager, self.train_steps, self._where, save):
            if self.training:
                self.task.on_train_begin(self._callback_context(step, {}))
            if self.evaluates_saved:
                self._evaluate_saved(eval_settings.eval_steps or -1)
            else:
                run_controller(
                    self.controller,
                    self.mode,
                    self.train_steps,
                    eval_settings,
                    global_step,
                    waiting=self.preemption.waiting,  # SIGTERM ends a wait at once
                )
            if self.training:
                logs = self.results["train"]
                self.task.on_train_end(self._callback_context(self._step_now(), logs))
        self._export_at_end()
        self._finish()
        return self.results

    def _evaluate_saved(self, eval_steps: int) -> None:
        """Evaluates each of `self.saved` in order at its own step: restored, evaluated, its
        summaries written under `eval/` at that step, one line printed (eval_all). Eager.

        eval_all records each checkpoint it evaluated in `eval/evaluated_checkpoints.txt`, and
        goes on after them when started again (a stop, SIGTERM)."""
        record = os.path.join(self.output_dir, "eval", "evaluated_checkpoints.txt")
        done = checkpoint_setup.evaluated_before(record) if self.mode == "eval_all" else []
        if done:
            messages.say(f"eval_all: {len(done)} checkpoint(s) evaluated before ({record})")
        for path in self.saved:
            if os.path.basename(path) in done:
                continue
            with self.strategy.scope():
                checkpoint_restore.restore(self.checkpointing.checkpoint, path)
            step = int(self.objects.global_step.numpy())
            self.controller.evaluate(eval_steps)
            self.summaries.eval.flush()
            logs = dict(self.results["eval"])
            self.results["evaluated"].append({"checkpoint": path, "step": step, "eval": logs})
            line, name = messages.eval_line(step, logs), os.path.basename(path)
            if line and self.chief:
                messages.say(f"{name}: {line}" if self.mode == "eval_all" else line)
            if self.mode == "eval_all":
                done.append(name)
                if self.chief:
                    full_disk.write_text(record, "".join(f"{n}\n" for n in done))

    def _export_at_end(self) -> None:
        """With `export_at_end`, the trained model (EMA averages if set) as a SavedModel."""
        if not (self.settings.features.export_at_end and self.training):
            return
        manager = self.checkpointing.manager
        root = getattr(manager, "temp_directory", self.model_dir)  # a non-chief: its own
        path = saved_model.export_trained(self.task, self.objects, root, self._step_now())
        if self.chief:
            self.results["export"] = path
            messages.say(f"SavedModel in {path}")

    def _finish(self) -> None:
        self.summaries.train.write_pending()
        self.summaries.train.flush()
        self.summaries.eval.flush()
        if self.facts is not None and (line := self.facts.end(self._step_now(), "finished")):
            messages.say(line)
        self._end_records("finished")
        if self.zeroed is not None:
            self.zeroed.end()
        where = self.model_dir if self.training else self.output_dir
        messages.run_end(where, self.training, self.summary_dir)

    def _end_records(self, ended: str) -> None:
        """The run's loggers record its end (`loggers.Records.end`). Eager."""
        if self.summaries.train.metrics is not None:  # a training run's chief
            self.summaries.train.metrics.end(ended)


def run_controller(
    controller: Controller,
    mode: str,
    train_steps: int | None,
    evaluation: EvalSettings,
    global_step: tf.Variable,
    waiting: Callable,
) -> None:
    """Runs `mode` ("train", "train_and_eval", "eval" of the newest checkpoint, or
    "continuous_eval") on `controller`; `waiting` is the wait of continuous evaluation, which
    SIGTERM ends at once. Eager; returns None."""
    eval_steps = evaluation.eval_steps or -1
    if mode == "train":
        controller.train(train_steps)
    elif mode == "train_and_eval":
        when = entries.evaluation_trigger(train_steps, evaluation)
        controller.train_and_evaluate(train_steps, eval_steps, when=when)
    elif mode == "eval":
        controller.evaluate(eval_steps)
    else:
        # Poll for new checkpoints; stop once the one at train_steps has been evaluated.
        controller.evaluate_continuously(
            eval_steps,
            timeout=evaluation.continuous_eval_timeout or 30,
            # By epochs (train_steps None) the last step is unknown here: it polls on.
            timeout_fn=lambda: train_steps is not None and int(global_step.numpy()) >= train_steps,
            waiting=waiting,
        )
