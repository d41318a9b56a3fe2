"""The eval action of a `ValidationControl`: export the best checkpoint, halve the learning rate,
go back to the best, put its weights into the model at the end, stop early
(`trainers.features.validation_control`).

A better validation is exported to `model_dir/best/`; under `go_back` this worker's input
position of that step is copied beside it (the run keeps only its newest positions), and put
back where the run reads it before going back.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any

import tensorflow as tf
from absl import logging

from orbitask.common import keras_compat
from orbitask.trainers.errors import EarlyStop
from orbitask.trainers.state import checkpoint_restore, input_position

if TYPE_CHECKING:
    from orbitask.trainers.features.validation_control import ValidationControl


class ValidationRun:
    """The run's objects the action reads and restores."""

    def __init__(self, checkpoint, manager, learning_rate, global_step, ema, strategy, trainer):
        self.checkpoint = checkpoint
        self.manager = manager
        self.learning_rate = learning_rate
        self.global_step = global_step
        self.ema = ema
        self.scope = strategy.scope if strategy is not None else contextlib.nullcontext
        self.trainer = trainer

    def step(self) -> int:
        return int(self.global_step.numpy())

    def rate_variables(self) -> list:
        """The variables holding the learning rate: orbitask's `lr`, its factor and the
        optimizers' own rates."""
        own = keras_compat.learning_rate_variable(self.checkpoint.optimizer)
        own = list(own.values()) if isinstance(own, dict) else [own]
        rates = [self.learning_rate.lr, self.learning_rate.factor]
        return rates + [v for v in own if v is not None]


class ValidationAction:
    """The eval action of a `ValidationControl` (the `validation_control` module docstring).
    Eager."""

    def __init__(self, control: ValidationControl, directory: str, run: ValidationRun, train_steps):
        from official.core import train_utils  # here: `official` is heavy to import

        self.control = control
        self.directory = directory
        self.run = run
        self.train_steps = train_steps
        self.exporter = train_utils.BestCheckpointExporter(
            directory, control.metric, "higher" if control.higher_is_better else "lower"
        )
        self.best_manager = tf.train.CheckpointManager(
            run.checkpoint,
            directory,
            max_to_keep=control.keep_best,
            checkpoint_name=train_utils.BEST_CHECKPOINT_NAME,
        )

    def __call__(self, eval_logs: dict[str, Any]) -> None:
        control, run = self.control, self.run
        step = run.step()
        values = control.values(eval_logs)
        if control.count(control.better(values), values):
            self.export(eval_logs, step)
            stopping = False
        else:
            stopping = control.stopped()
            if control.go_back and not stopping and self.train_steps is not None:
                step = self.go_back(step)
            if control.halve_lr_on_worse:
                run.learning_rate.scale(control.lr_multiplier)
                logging.info("validation worse at step %d: learning rate scaled", step)
        training = self.train_steps is not None
        if control.restore_best and training and (stopping or step >= self.train_steps):
            self.restore_best_weights()
        # Save the control state with the step it belongs to, so a resume agrees with it.
        run.manager.save(checkpoint_number=step, check_interval=False)
        if stopping:
            raise EarlyStop(
                f"early stop at step {step}: {control.metric} did not improve for "
                f"{control.early_stop_patience} validation(s)"
            )

    def export(self, eval_logs: dict, step: int) -> None:
        """Exports the current state as the best, with its input position under `go_back`."""
        run = self.run
        self.exporter.export_best_eval_metric(eval_logs, step)
        with run.ema.averaged() if run.ema is not None else contextlib.nullcontext():
            self.best_manager.save(checkpoint_number=step)
        if self.control.go_back:
            _keep_position(getattr(run.checkpoint, "input_position", None), step, self.directory)

    def go_back(self, step: int) -> int:
        """Restores the best checkpoint but keeps the learning rate and the control's state;
        returns the restored step."""
        run = self.run
        path = self.best_manager.latest_checkpoint  # the newest export is the best
        if path is None:
            return step
        back = int(path.rsplit("-", 1)[1])
        _bring_back_position(getattr(run.checkpoint, "input_position", None), back, self.directory)
        kept = [*run.rate_variables(), self.control.worse, self.control.best]
        values = [v.numpy() for v in kept]
        run.manager.sync()  # an async save under way reads the values before they change
        with run.scope():
            checkpoint_restore.restore(run.checkpoint, path)
            for variable, value in zip(kept, values, strict=True):
                variable.assign(value)
        if run.trainer is not None:
            run.trainer.last_step = run.step()
        print(f"orbitask: validation worse at step {step}: back to {path}", flush=True)
        return run.step()

    def restore_best_weights(self) -> None:
        """Puts the best checkpoint's model weights into the model."""
        path = self.best_manager.latest_checkpoint
        if path is None:
            return
        with self.run.scope():
            model = tf.train.Checkpoint(train_model=self.run.checkpoint.train_model)
            model.restore(path).expect_partial()
        print(f"orbitask: the model holds the best validated weights ({path})", flush=True)


def _position_copy(directory: str, step: int) -> str:
    return os.path.join(directory, "input", f"ckpt-{step}")


def _keep_position(position: Any, step: int, directory: str) -> None:
    """Copies this worker's saved input position of `step` under `directory/input/`, the only
    one kept there: the run keeps only its newest positions, and going back needs the best's."""
    if not isinstance(position, input_position.IteratorInput):
        return
    copies = os.path.join(directory, "input")
    if tf.io.gfile.isdir(copies):
        tf.io.gfile.rmtree(copies)
    target = _position_copy(directory, step)
    tf.io.gfile.makedirs(target)
    for name in tf.io.gfile.glob(position.path(step) + "*"):
        tf.io.gfile.copy(name, os.path.join(target, os.path.basename(name)), overwrite=True)


def _bring_back_position(position: Any, step: int, directory: str) -> None:
    """Puts the copy of `step`'s input position back where the run reads it, if it is gone."""
    if not isinstance(position, input_position.IteratorInput):
        return
    wanted = position.path(step)
    if tf.io.gfile.exists(wanted + ".index"):
        return
    source = _position_copy(directory, step)
    names = tf.io.gfile.glob(os.path.join(source, os.path.basename(wanted) + "*"))
    tf.io.gfile.makedirs(os.path.dirname(wanted))
    for name in names:
        tf.io.gfile.copy(name, os.path.join(os.path.dirname(wanted), os.path.basename(name)))
