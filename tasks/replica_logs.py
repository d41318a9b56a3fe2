"""How the replicas' logs of a step add up to what one device logs: `Task.replica_logs`.

Each replica returns its own logs; the trainer reduces each key over replicas with the rule the
Task declares. The default step's logs are one device's whatever it declares ("mean"). A
task's own `train_step` declares "mean" (each value is for the replica's own batch), "sum"
(each is already a share of the global batch's mean, as `tf.nn.compute_average_loss` and a
Keras 3 loss object's result under tf.distribute are) or a dict of those by key; None is
"mean". Nothing is guessed: TensorFlow and Keras run as they are.
"""

from __future__ import annotations

from typing import Any

from orbitask.common.errors import ConfigError

RULES = ("mean", "sum")


def convention(task: Any) -> str | dict:
    """The rule of `task`'s train logs: "mean" for the default `train_step`, else its
    `replica_logs` ("mean" when None). Eager; returns "mean", "sum" or `{key: rule}`."""
    if not task.own_train_step:
        return "mean"
    declared = getattr(task, "replica_logs", None)
    return "mean" if declared is None else declared


def summed(rule: str | dict, key: str) -> bool:
    """Whether the log `key` is summed over replicas under `rule` (`convention`). Eager or
    traced (Python); returns it."""
    if isinstance(rule, dict):
        return rule.get(key, "mean") == "sum"
    return rule == "sum"


def undeclared(task: Any, replicas: int) -> bool:
    """Whether a run on `replicas` replicas averages `task`'s own `train_step` logs without the
    Task saying so (a warning's cue). Eager; returns it."""
    return replicas > 1 and task.own_train_step and getattr(task, "replica_logs", None) is None


def check(task: Any) -> None:
    """Refuses a `replica_logs` that is not None, "mean", "sum" or a dict of those by log key.
    Eager; returns None.

    Raises:
      ConfigError: naming the class and the value.
    """
    declared = getattr(task, "replica_logs", None)
    good = declared is None or declared in RULES
    if isinstance(declared, dict):
        good = all(isinstance(k, str) and v in RULES for k, v in declared.items())
    if not good:
        raise ConfigError(
            f"`{type(task).__name__}.replica_logs` must be None, 'mean', 'sum' or a dict of "
            f"those by log key; received {declared!r}. Set it on your Task class (see "
            "Task.replica_logs)."
        )
