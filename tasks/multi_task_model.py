"""The one Keras model of a `MultiTask`: its tasks' models joined as `sharing` says.

The model maps a dict of per-task inputs to a dict of per-task outputs, calling each task's input
through its route of parts (each an attribute, so `tf.train.Checkpoint` tracks it by name):
"shared" one part `shared`; "separate" a part `model_<task>` per task; "trunk" the first task's
layers but the last `head_layers` as `trunk_<i>`, then the task's own last layers as
`head_<task>_<i>`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import keras
import tf_keras

from orbitask.common import keras_compat
from orbitask.common.errors import ConfigError


class _Routed:
    """Calls each task's input through its chain of parts (trunk, head, ...) -> dict outputs."""

    def __init__(self, parts: Mapping[str, Any], routes: Mapping[str, tuple], **kwargs):
        super().__init__(**kwargs)
        for attribute, part in parts.items():
            setattr(self, attribute, part)  # attributes, so tf.train.Checkpoint tracks them
        self.routes = {name: tuple(route) for name, route in routes.items()}
        self.built = True  # every part is built by its task's build_model

    def call(self, inputs, training=None):
        outputs = {}
        for name, x in inputs.items():
            for attribute in self.routes[name]:
                x = getattr(self, attribute)(x, training=training)
            outputs[name] = x
        return outputs


class _KerasMultiModel(_Routed, keras.Model):
    pass


class _TfKerasMultiModel(_Routed, tf_keras.Model):
    pass


def build_multi_model(
    models: Mapping[str, Any], names: Sequence[str], sharing: str, head_layers: int
) -> Any:
    """Returns the model joining `models` (`{task: model}`, built by the tasks: the first task's
    alone for "shared") for the tasks `names`, of the models' Keras flavour. Eager, in scope.

    Raises:
      ConfigError: models of mixed or no Keras flavour; for "trunk", a model that is not a
        `Sequential` or has too few layers.
    """
    flavours = {name: keras_compat.model_flavour(model) for name, model in models.items()}
    if None in flavours.values() or len(set(flavours.values())) != 1:
        raise ConfigError(
            "MultiTask needs Keras models of one flavour (all Keras 3 or all tf_keras) from "
            f"its tasks' build_model; received {flavours}."
        )
    if sharing == "shared":
        parts = {"shared": models[names[0]]}
        routes = {name: ("shared",) for name in names}
    elif sharing == "separate":
        parts = {f"model_{name}": model for name, model in models.items()}
        routes = {name: (f"model_{name}",) for name in names}
    else:
        parts, routes = _trunk_and_heads(models, names[0], head_layers)
    tf_keras_parts = keras_compat.TF_KERAS in flavours.values()
    model_class = _TfKerasMultiModel if tf_keras_parts else _KerasMultiModel
    return model_class(parts, routes, name="multi_task")


def _trunk_and_heads(models: Mapping[str, Any], first: str, k: int) -> tuple[dict, dict]:
    """`(parts, routes)` of "trunk" sharing: `first`'s model's layers but its last `k` are the
    trunk, each model's last `k` layers its head."""
    for name, model in models.items():
        if not isinstance(model, (keras.Sequential, tf_keras.Sequential)):
            raise ConfigError(
                f"MultiTask(sharing='trunk') splits each task's model into trunk and head by "
                f"layers and needs a Sequential; task {name!r} built a "
                f"{type(model).__name__}. Use sharing='shared' or 'separate'."
            )
        if len(model.layers) <= k:
            raise ConfigError(
                f"MultiTask(sharing='trunk'): task {name!r}'s model has "
                f"{len(model.layers)} layer(s), too few for a trunk and {k} head layer(s); "
                "lower MultiTask.head_layers."
            )
    # Layers, not Sequentials of them: a Keras 3 Sequential without an Input layer is not
    # checkpointed until it is called once.
    parts = {f"trunk_{i}": layer for i, layer in enumerate(models[first].layers[:-k])}
    routes = {}
    for name, model in models.items():
        head = {f"head_{name}_{i}": layer for i, layer in enumerate(model.layers[-k:])}
        parts.update(head)
        routes[name] = (*[p for p in parts if p.startswith("trunk_")], *head)
    return parts, routes
