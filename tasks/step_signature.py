"""Calls a Task's steps with the keywords their signatures declare.

A Task's own `train_step` may keep Model Garden's signature,
`train_step(self, inputs, model, optimizer, metrics=None)`, or take any of orbitask's
keywords (`loss_fn`, `lr`, `global_batch_size`), or `**kwargs` for all of them; its
`validation_step` likewise (`validation_step(self, inputs, model, metrics=None)`, or with
`loss_fn` and `lr`). The positional arguments are always given; a keyword only when the step
declares it. Each function's signature is read once, when the step is first traced.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any


def train_step(task: Any, batch, model, optimizer, metrics, **offered) -> dict:
    """Returns `task.train_step(batch, model, optimizer, metrics, ...)` given the keywords of
    `offered` that it declares. Traced, per replica."""
    step = task.train_step
    return step(batch, model, optimizer, metrics, **declared(step, offered))


def validation_step(task: Any, batch, model, metrics, **offered) -> dict:
    """Returns `task.validation_step(batch, model, metrics, ...)` given the keywords of
    `offered` that it declares. Traced, per replica."""
    step = task.validation_step
    return step(batch, model, metrics, **declared(step, offered))


def declared(method: Any, offered: dict) -> dict:
    """The items of `offered` whose names `method` takes as keywords (all with `**kwargs`)."""
    names = _keywords(getattr(method, "__func__", method))
    if names is None:
        return offered
    return {k: v for k, v in offered.items() if k in names}


@functools.lru_cache(maxsize=256)
def _keywords(fn: Any) -> frozenset | None:
    """The names `fn` accepts by keyword, or None when it takes `**kwargs`."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a C callable): offer all
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    by_keyword = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return frozenset(p.name for p in parameters if p.kind in by_keyword)
