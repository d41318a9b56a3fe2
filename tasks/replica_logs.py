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


def warning(task: Any, replicas: int) -> str | None:
    """The start-up warning of a run on `replicas` replicas whose Task's own `train_step`
    declares no `replica_logs` (`undeclared`): how its logs and its gradients add up over the
    replicas, and the rule that makes both one device's; None without a cue. Eager."""
    if not undeclared(task, replicas):
        return None
    name = type(task).__name__
    return (
        f"{name}.train_step's logs are averaged over the {replicas} replicas, and the "
        f"optimizer sums their gradients: a loss that is its replica's own mean (a plain "
        f"tf.reduce_mean) trains with {replicas}x one device's gradients. Sum the per-example "
        "losses and divide by global_batch_size (tf.nn.compute_average_loss; a Keras 3 loss "
        "object with its default reduction divides by the replicas already). A log that is "
        f"such a share of the global batch's mean: declare {name}.replica_logs = 'sum' (or "
        "{key: 'sum'}). `orbitask verify` compares the logs and the weights with one device's."
    )


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
