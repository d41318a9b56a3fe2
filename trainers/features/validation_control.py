"""nabu's validation-driven control: keep the best checkpoints, halve the LR, go back, stop early.

An Orbit eval action (`trainers.features.validation_action`). Each evaluation's chosen
metric is compared with the best so far; a better one is exported to `model_dir/best/`
(`best_ckpt-<step>`, the newest `keep_best` kept, and `info.json` written by
`official.core.train_utils.BestCheckpointExporter`). A worse one (not better) is counted and,
with `halve_lr_on_worse` (the default), multiplies the learning rate by `lr_multiplier` (0.5);
training stops when the count reaches `early_stop_patience`. With `go_back` training first
returns to the best checkpoint (weights, optimizer, step, input position), keeping the learning
rate and the control's counts. With `restore_best` the final checkpoint and export hold the
best weights.

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

import os
from typing import Any

import gin
import numpy as np
import tensorflow as tf

from orbitask.common import setting_rules
from orbitask.trainers.errors import ConfigError
from orbitask.trainers.features.validation_action import ValidationAction, ValidationRun


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
        run = ValidationRun(checkpoint, manager, learning_rate, global_step, ema, strategy, trainer)
        return ValidationAction(self, os.path.join(model_dir, "best"), run, train_steps)


def _state(value, dtype, name: str) -> tf.Variable:
    aggregation = tf.VariableAggregation.ONLY_FIRST_REPLICA
    return tf.Variable(value, dtype=dtype, trainable=False, name=name, aggregation=aggregation)


def _check_metric(logs: dict, metric: str) -> float:
    """Returns the value of `metric` in `logs`; raises ConfigError when it is not there.

    Nested keys are joined with "|"; a validation set's log is `<set>/<key>` (its logs are the
    entry `{set: logs}` of the evaluation's, `trainers.engine.evaluation`)."""
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
