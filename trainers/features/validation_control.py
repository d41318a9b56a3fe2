"""nabu's validation-driven control: keep the best checkpoints, halve the LR, go back, stop early.

An Orbit eval action. Each evaluation's chosen metric is compared with the best so far; a better
one is exported to `model_dir/best/` (`best_ckpt-<step>`, the newest `keep_best` kept, and
`info.json` written by `official.core.train_utils.BestCheckpointExporter`). A worse one (not
better) is counted and halves the learning rate; with `go_back` training first returns to the
best checkpoint (weights, optimizer, step, input position), keeping the learning rate and the
control's counts. With `restore_best` the final checkpoint and export hold the best weights.

The state that decides what happens next (the best value, the count of worse validations; the
learning-rate factor is the run's) lives in variables of the run's checkpoint, which the action
saves after each evaluation: a checkpoint says how far validation had got, never the JSON file,
which a killed run may have written past its last checkpoint. An evaluation repeated after a
resume compares with the same best value and rewrites the same export. After going back, the
run's checkpoint of the best step is saved again with the new counts and rate, so a resume
continues from there.

With `per_task` (a `MultiTask`) every validated task has its own best value and count, its
metric read from the eval log `<metric>/<task>`. An evaluation is better only when every task is
better: then the bests move and `best/` is exported. When any task is worse the control acts
once (halve, go back) and counts one for each worse task; training stops when any task's count
reaches the patience.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import gin
import numpy as np
import tensorflow as tf
from absl import logging

from orbitask.tasks import keras_compat, setting_rules
from orbitask.trainers.errors import ConfigError, EarlyStop
from orbitask.trainers.state import checkpoints, input_position


@gin.configurable("ValidationControl", module="orbitask")
class ValidationControl:
    """What to do when a validation is not better than the best so far.

    Args:
      metric: the eval log to watch (nested keys joined with "|"), e.g. "loss" or "accuracy";
        of validation sets (`Task.build_inputs`), one set's, e.g. "valid/accuracy".
      higher_is_better: True for accuracy-like metrics.
      halve_lr_on_worse: multiply the learning rate by `lr_multiplier` after a worse validation.
      lr_multiplier: nabu halves (0.5).
      early_stop_patience: stop after this many worse validations (None: never).
      reset_patience_on_improvement: True: the patience counts worse validations in a row (a
        better one resets the count); False: in total (nabu's `reset_tries=False`).
      go_back: after a worse validation, restore the best checkpoint (weights, optimizer, step,
        input position) before halving; needs `early_stop_patience`.
      restore_best: when training ends (at `train_steps` or an early stop), put the best
        validated weights into the model, so the final checkpoint and export hold them.
      keep_best: how many of the best checkpoints `best/` keeps.
      per_task: for a `MultiTask`, a best value and a count per validated task (module
        docstring).

    Raises:
      ConfigError: for a bad setting, naming it.
    """

    def __init__(
        self,
        metric: str = "loss",
        higher_is_better: bool = False,
        halve_lr_on_worse: bool = True,
        lr_multiplier: float = 0.5,
        early_stop_patience: int | None = None,
        reset_patience_on_improvement: bool = True,
        go_back: bool = False,
        restore_best: bool = False,
        keep_best: int = 1,
        per_task: bool = False,
    ):
        setting_rules.check("ValidationControl", dict(locals()))
        if go_back and early_stop_patience is None:
            raise ConfigError(
                "`ValidationControl.go_back = True` needs `early_stop_patience` (going back "
                "without a limit can repeat forever); set orbitask.ValidationControl."
                "early_stop_patience in your .gin file."
            )
        self.metric = metric
        self.higher_is_better = higher_is_better
        self.halve_lr_on_worse = halve_lr_on_worse
        self.lr_multiplier = lr_multiplier
        self.early_stop_patience = early_stop_patience
        self.reset_patience_on_improvement = reset_patience_on_improvement
        self.go_back = go_back
        self.restore_best = restore_best
        self.keep_best = keep_best
        self.per_task = per_task
        self.names: tuple[str, ...] | None = None
        self.worse = None
        self.best = None

    def build(self, task: Any = None) -> tf.train.Checkpoint:
        """Eager, in strategy scope: creates the state (per validated task of `task` with
        `per_task`); returns it (a Checkpoint) to save.

        Raises:
          ConfigError: with `per_task` when `task` is not a `MultiTask`.
        """
        shape: list[int] = []
        if self.per_task:
            names = getattr(task, "validation_names", None)
            if not names:
                raise ConfigError(
                    "`ValidationControl.per_task = True` needs a MultiTask (its validated "
                    f"tasks); received a {type(task).__name__}. Set orbitask.ValidationControl."
                    "per_task = False in your .gin file."
                )
            self.names = tuple(names)
            shape = [len(self.names)]
        self.worse = _state(np.zeros(shape, np.int64), tf.int64, "worse_validations")
        # NaN: no validation yet.
        self.best = _state(np.full(shape, np.nan), tf.float64, "best_value")
        return tf.train.Checkpoint(worse_validations=self.worse, best_value=self.best)

    def values(self, eval_logs: dict) -> np.ndarray:
        """Eager. Returns the watched values in `eval_logs` (one per task with `per_task`).

        Raises:
          ConfigError: when a metric is not in the logs.
        """
        if self.names is None:
            return np.array([_check_metric(eval_logs, self.metric)])
        return np.array([_check_metric(eval_logs, f"{self.metric}/{n}") for n in self.names])

    def better(self, values: np.ndarray) -> np.ndarray:
        """Eager. Returns, per value, whether it beats the best so far (any value beats none)."""
        best = np.atleast_1d(self.best.numpy())
        beats = values > best if self.higher_is_better else values < best
        return np.isnan(best) | beats

    def count(self, better: np.ndarray, values: np.ndarray) -> bool:
        """Eager. Updates the state after an evaluation whose per-task outcome is `better`;
        returns whether the evaluation is a new best (every task better)."""
        shape = self.best.shape.as_list()
        improved = bool(better.all())
        worse = np.atleast_1d(self.worse.numpy()) + (~better).astype(np.int64)
        if self.reset_patience_on_improvement:
            worse = np.where(better, 0, worse)
        self.worse.assign(worse.reshape(shape))
        if improved:
            self.best.assign(values.reshape(shape))
        return improved

    def stopped(self) -> bool:
        """Eager. Returns True if the (restored) state says training already stopped early."""
        patience = self.early_stop_patience
        return patience is not None and bool((self.worse.numpy() >= patience).any())

    def action(
        self,
        model_dir,
        checkpoint,
        manager,
        learning_rate,
        global_step,
        ema=None,
        *,
        strategy=None,
        trainer=None,
        train_steps=None,
    ):
        """Eager. Returns the eval action, a callable run eagerly after each evaluation.

        `strategy` scopes a restore, `trainer.last_step` follows the step after going back, and
        `restore_best` acts at `train_steps` (and at an early stop). With `train_steps` None
        (an evaluation-only mode) `go_back` and `restore_best` do nothing.

        Raises:
          ConfigError: for `go_back` or `restore_best` with `ema` (the best export holds the
            averages, not the weights training continues from).
        """
        if ema is not None and (self.go_back or self.restore_best):
            raise ConfigError(
                "`ValidationControl.go_back` and `.restore_best` cannot be used with "
                "run_experiment.ema (the best export holds the averaged weights); unset one."
            )
        run = _Run(checkpoint, manager, learning_rate, global_step, ema, strategy, trainer)
        return _Action(self, os.path.join(model_dir, "best"), run, train_steps)


class _Run:
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


class _Action:
    """The eval action of a `ValidationControl` (see the module docstring). Eager."""

    def __init__(self, control: ValidationControl, directory: str, run: _Run, train_steps):
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
            checkpoints.restore(run.checkpoint, path)
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


def _state(value, dtype, name: str) -> tf.Variable:
    aggregation = tf.VariableAggregation.ONLY_FIRST_REPLICA
    return tf.Variable(value, dtype=dtype, trainable=False, name=name, aggregation=aggregation)


def _check_metric(logs: dict, metric: str) -> float:
    """Returns the value of `metric` in `logs`; raises ConfigError when it is not there.

    Nested keys are joined with "|"; a validation set's log is `<set>/<key>` (its logs are the
    entry `{set: logs}` of the evaluation's, `trainers.evaluation`)."""
    node: Any = logs
    for key in metric.split("|"):
        node = _entry(node, key)
        if node is None:
            raise ConfigError(
                f"ValidationControl.metric {metric!r} is not in the eval logs (keys: "
                f"{_names(logs)}); set it to one of them in your .gin file."
            )
    return float(np.asarray(node))


def _entry(node: Any, key: str) -> Any:
    """`node[key]`, or for `<set>/<rest>` the entry `rest` of the dict `node[set]`; None when
    neither is there."""
    if not isinstance(node, dict):
        return None
    if key in node:
        return node[key]
    head, _, rest = key.partition("/")
    return _entry(node.get(head), rest) if rest else None


def _names(logs: dict) -> list[str]:
    """The keys of `logs`, a validation set's as `<set>/<key>`, sorted."""
    return sorted(
        f"{key}/{inner}" if isinstance(value, dict) else key
        for key, value in logs.items()
        for inner in (value if isinstance(value, dict) else [None])
    )
