"""The default reduction of evaluation logs (`Task.aggregate_logs` / `reduce_aggregated_logs`).

The rule, for the logs a `validation_step` returns on each replica:

- with `num_examples` among them, the step's values are sums over its batch: every key is summed
  over replicas and steps and divided by the summed `num_examples` (an exact per-example mean,
  partial batches included);
- without it, each key is the mean of its per-replica, per-step values (Model Garden's rule for a
  step that returns its batch's mean loss, as Keras and Model Garden steps do).

Both run eagerly, once per evaluation step and once per evaluation. `to_python` turns a log value
(a tensor, a NumPy scalar) into what the logs hold: a Python float for a number.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

VALUES = "_orbitask_values"  # the state's count of per-replica, per-step values folded in


def aggregate(state: Any, step_logs: Mapping[str, Any]) -> dict:
    """Folds one step's per-replica logs (`{key: tuple of replica values}`) into `state`. Eager;
    returns the new state: every key summed over replicas and steps, and the values counted."""
    state = dict(state or {})
    for key, values in step_logs.items():
        total = np.sum([np.asarray(v, dtype=np.float64) for v in values], axis=0)
        state[key] = state.get(key, 0.0) + total
    state[VALUES] = state.get(VALUES, 0) + max((len(v) for v in step_logs.values()), default=0)
    return state


def reduce(state: Any) -> dict:
    """Returns the final logs of an evaluation from the aggregated `state` (module docstring).
    Eager; Python floats for scalars, NumPy arrays otherwise."""
    logs = dict(state or {})
    values = logs.pop(VALUES, 0)
    count = logs.pop("num_examples", None)
    divisor = count if count else values
    if divisor:
        logs = {k: v / divisor for k, v in logs.items()}
    return {k: to_python(v) for k, v in logs.items()}


def to_python(value: Any) -> Any:
    """Returns a log value in Python terms. Eager.

    A tensor gives its value; a numeric or boolean scalar becomes a Python float, another scalar
    (a string) its Python value; an array stays a NumPy array, and anything else is returned as
    it is.
    """
    value = value.numpy() if hasattr(value, "numpy") else value
    if isinstance(value, (np.generic, np.ndarray)) and np.ndim(value) == 0:
        return float(value) if value.dtype.kind in "biuf" else value.item()
    return value
