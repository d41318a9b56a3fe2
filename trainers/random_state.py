"""Random state the task's objects own, found so that checkpoints save it (exact resume).

A `keras.random.SeedGenerator` keeps its state in a variable that `tf.train.Checkpoint` does not
reach through a Keras 3 model or a plain Python object, and a `tf.random.Generator` on a task is
not tracked either. `find` walks the task, its model(s) and its loss object for both, so the
runner checkpoints them under `random_state/`. Host random generators (Python's `random.Random`,
NumPy's) cannot be saved in a checkpoint: they are named in a warning.
"""

from __future__ import annotations

import random
import sys
from typing import Any

import keras
import numpy as np
import tensorflow as tf
import tf_keras
from absl import logging

_HOST = (random.Random, np.random.RandomState, np.random.Generator)
_MAX_DEPTH = 8
_LAYERS = (keras.layers.Layer, tf_keras.layers.Layer)
_LIBRARIES = {"tensorflow", "keras", "tf_keras", "numpy", "orbit", "official", "builtins", "gin"}


def find(roots: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Walks `roots` (`{name: object}`): their attributes, dict and list items, Keras layers.

    Eager, once. Returns `({path: trackable state}, [paths of host generators])`; a path names
    where the object was found, e.g. `task.noise` or `model.generator.seed_generator`.
    """
    saved: dict[str, Any] = {}
    host: list[str] = []
    seen: set[int] = set()

    def visit(obj: Any, path: str, depth: int) -> None:
        if id(obj) in seen or depth > _MAX_DEPTH or isinstance(obj, (str, bytes, int, float)):
            return
        seen.add(id(obj))
        if isinstance(obj, keras.random.SeedGenerator):
            saved[path] = obj.state
            return
        if isinstance(obj, tf.random.Generator):
            saved[path] = obj
            return
        if isinstance(obj, _HOST):
            host.append(path)
            return
        if isinstance(obj, dict):
            items = obj.items()
        elif isinstance(obj, (list, tuple)):
            items = enumerate(obj)
        elif _is_user_object(obj) or isinstance(obj, _LAYERS):
            items = vars(obj).items()  # a layer's attributes hold its sublayers and generators
        else:
            return  # TensorFlow, Keras and NumPy internals hold no generator of the task's
        for key, value in list(items):
            if not str(key).startswith("__"):
                visit(value, f"{path}.{str(key).lstrip('_')}", depth + 1)

    for name, root in roots.items():
        visit(root, name, 0)
    return saved, host


def _is_user_object(obj: Any) -> bool:
    module = type(obj).__module__.split(".")[0]
    library = module in _LIBRARIES or module in sys.stdlib_module_names
    return hasattr(obj, "__dict__") and not library


def checkpointable(roots: dict[str, Any]) -> tf.train.Checkpoint | None:
    """The random state under `roots` as one checkpoint object (None when there is none); warns
    once, naming them, about host generators a checkpoint cannot hold. Eager."""
    saved, host = find(roots)
    if host:
        message = (
            f"random generators outside TensorFlow ({', '.join(sorted(host))}) are not saved in "
            "checkpoints: a resumed run that draws from them after the start differs from an "
            "uninterrupted one. Use keras.random.SeedGenerator or tf.random.Generator instead."
        )
        logging.warning(message)
        print(f"orbitask: warning: {message}", flush=True)
    if not saved:
        return None
    return tf.train.Checkpoint(**{_key(path): state for path, state in saved.items()})


def _key(path: str) -> str:
    return path.replace(".", "/").replace("-", "_")
