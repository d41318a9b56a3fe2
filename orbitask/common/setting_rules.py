"""The type and range rule of every framework setting, keyed by its gin binding, and their check.

`RULES` is the table for the settings `configs/defaults.gin` lists of `NanGuard`,
`ValidationControl`, `learning_rate_schedule`, `ExponentialMovingAverage` and `Task`, and for
`run_experiment.fast_dev_run`; `run_experiment`'s settings declare their rules with themselves
(`trainers.run.settings`) and are checked against them here. A value that breaks its rule is
one `ConfigError` line, raised before any work:

    Expected a positive integer. Received: steps_per_loop=0 of type int. Fix
    orbitask.run_experiment.steps_per_loop in your experiment's .gin file or with --gin_params.

`require` checks one value of a constructor or table that is not in `RULES` (a `Trigger`'s steps,
`MultiTask.head_layers`, a callback table's keys) against the same rules.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
import signal
from collections.abc import Callable, Mapping
from typing import Any

from orbitask.common.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Rule:
    """What a setting accepts: `expected` names it in the message, `accepts` decides."""

    expected: str
    accepts: Callable[[Any], bool]

    def or_none(self) -> Rule:
        """Returns this rule that also accepts None."""
        return Rule(f"{self.expected} or None", lambda v: v is None or self.accepts(v))


def _integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


POSITIVE_INT = Rule("a positive integer", lambda v: _integer(v) and v > 0)
NON_NEGATIVE_INT = Rule("a non-negative integer", lambda v: _integer(v) and v >= 0)
POSITIVE_NUMBER = Rule("a positive finite number", lambda v: _number(v) and v > 0)
NON_NEGATIVE_NUMBER = Rule("a non-negative finite number", lambda v: _number(v) and v >= 0)
FRACTION = Rule("a number in (0, 1)", lambda v: _number(v) and 0 < v < 1)
BOOL = Rule("True or False", lambda v: isinstance(v, bool))
LEARNING_RATE = Rule(
    "a positive finite number, a `step -> rate` schedule such as "
    "@orbitask.learning_rate_schedule(), or None",
    lambda v: v is None or callable(v) or POSITIVE_NUMBER.accepts(v),
)

_HMS = re.compile(r"^\d+:[0-5]?\d:[0-5]?\d(\.\d+)?$")
# A job's time limit: seconds, or "HH:MM:SS" (`trainers.actions.time_budget`).
DURATION = Rule(
    "a positive number of seconds, 'HH:MM:SS' or None",
    lambda v: (
        v is None
        or POSITIVE_NUMBER.accepts(v)
        or (isinstance(v, str) and bool(_HMS.match(v)) and any(c not in "0:." for c in v))
    ),
)
_CATCHABLE = {s.name for s in signal.Signals} - {"SIGKILL", "SIGSTOP"}
# Python's names of catchable signals ('SIGTERM', 'SIGUSR1', ...): those that stop a run.
SIGNAL_NAMES = Rule(
    "a list of signal names such as ['SIGTERM', 'SIGINT', 'SIGHUP', 'SIGUSR1']",
    lambda v: (
        isinstance(v, list | tuple) and all(isinstance(n, str) and n in _CATCHABLE for n in v)
    ),
)

# None (train by `train_epochs`) is allowed; a wrong value is told "a positive integer".
STEPS = Rule(POSITIVE_INT.expected, lambda v: v is None or POSITIVE_INT.accepts(v))

# gin binding (without the `orbitask.` prefix) -> rule.
RULES: Mapping[str, Rule] = {
    "run_experiment.fast_dev_run": BOOL,
    "ValidationControl.higher_is_better": BOOL,
    "ValidationControl.halve_lr_on_worse": BOOL,
    "ValidationControl.lr_multiplier": POSITIVE_NUMBER,
    "ValidationControl.early_stop_patience": POSITIVE_INT.or_none(),
    "ValidationControl.reset_patience_on_improvement": BOOL,
    "ValidationControl.go_back": BOOL,
    "ValidationControl.restore_best": BOOL,
    "ValidationControl.keep_best": POSITIVE_INT,
    "ValidationControl.per_task": BOOL,
    "NanGuard.patience": POSITIVE_INT,
    "NanGuard.max_rollbacks": NON_NEGATIVE_INT,
    "NanGuard.spike_factor": POSITIVE_NUMBER.or_none(),  # and > 1 (`NanGuard`)
    "NanGuard.spike_warmup": POSITIVE_INT,
    "learning_rate_schedule.initial": POSITIVE_NUMBER,
    "learning_rate_schedule.decay_steps": POSITIVE_INT.or_none(),
    "learning_rate_schedule.decay_rate": POSITIVE_NUMBER,
    "learning_rate_schedule.alpha": NON_NEGATIVE_NUMBER,
    "learning_rate_schedule.warmup_steps": NON_NEGATIVE_INT,
    "learning_rate_schedule.warmup_start": NON_NEGATIVE_NUMBER,
    "learning_rate_schedule.end": NON_NEGATIVE_NUMBER,
    "learning_rate_schedule.power": POSITIVE_NUMBER,
    "learning_rate_schedule.t_mul": POSITIVE_NUMBER,
    "learning_rate_schedule.m_mul": POSITIVE_NUMBER,
    "ExponentialMovingAverage.decay": FRACTION,
    "Task.clip_norm": POSITIVE_NUMBER.or_none(),
    "Task.optimizer_epsilon": POSITIVE_NUMBER,
    "Task.save_layer_draws": BOOL,
}


def check(owner: str, values: Mapping[str, Any], rules: Mapping[str, Rule] = RULES) -> None:
    """Checks `values` (setting name -> value) of `owner` ("run_experiment", "NanGuard",
    "ValidationControl" or "Task") against `rules` (gin binding -> rule), in table order.
    Eager; returns None.

    Raises:
      ConfigError: for the first value its rule refuses, naming the gin binding to fix.
    """
    prefix = f"{owner}."
    for binding, rule in rules.items():
        name = binding[len(prefix) :]
        if not binding.startswith(prefix) or name not in values:
            continue
        value = values[name]
        if not rule.accepts(value):
            raise ConfigError(
                f"Expected {rule.expected}. Received: {name}={value!r} of type "
                f"{type(value).__name__}. Fix orbitask.{binding} in your experiment's .gin "
                "file or with --gin_params."
            )


def require(rule: Rule, value: Any, name: str, fix: str = "", *, must: str = "") -> None:
    """Checks one value of a constructor or table against `rule`. Eager; returns None.

    Args:
      rule: what `value` must be, e.g. `POSITIVE_INT`.
      value: the value received.
      name: what the message names, e.g. "`MultiTask.head_layers`".
      fix: a sentence added to the message: where to fix it.
      must: the rule in the message; default: "must be " and `rule.expected`.

    Raises:
      ConfigError: `<name> must be <rule>; received <value>. <fix>` unless `rule` accepts it.
    """
    if not rule.accepts(value):
        tail = f" {fix}" if fix else ""
        must = must or f"must be {rule.expected}"
        raise ConfigError(f"{name} {must}; received {value!r}.{tail}")
