"""The trainings `orbitask verify` compares: one device, N replicas, and two one-device variants.

Every run trains the gin-bound experiment with the same global batch and seed 0. The variants
change one thing of one device's run: `nudged` moves each floating input to the next float32
(the rounding a different reduction order leaves, grown by the training as the replicas'
rounding is), and `gradient_factor` has each Keras 3 optimizer apply its gradients times N
(through its `loss_scale_factor`), which is what a loss averaged per replica does on N
replicas.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
from typing import Any

import numpy as np
import tensorflow as tf

# Logs the run adds beside the step's own: how fast it went.
_TIMING = re.compile(r"per_second$")


@dataclasses.dataclass
class Trained:
    """What one run left: its trainable weights after step 1 and at the end, its step logs by
    name (a value per step, in step order), and what its model holds that trains differently
    on replicas (`unsynchronized_norms`, `random_layers`: class names)."""

    first: dict[str, np.ndarray]
    last: dict[str, np.ndarray]
    logs: dict[str, list[float]]
    unsynchronized_norms: list[str] = dataclasses.field(default_factory=list)
    random_layers: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Variant:
    """How a one-device run differs from the plain one (both unset: it is the plain one)."""

    nudged: bool = False
    gradient_factor: int | None = None


PLAIN = Variant()


def _next_floats(*element: Any) -> Any:
    """`element` (a dataset's, its parts when a tuple) with each floating tensor moved to the
    next float toward +inf. Traced."""

    def nudge(t: Any) -> Any:
        if not isinstance(t, tf.Tensor) or not t.dtype.is_floating:
            return t
        return tf.math.nextafter(t, tf.fill(tf.shape(t), tf.constant(np.inf, t.dtype)))

    moved = tf.nest.map_structure(nudge, element)
    return moved if len(moved) > 1 else moved[0]


def _times(optimizer: Any, factor: int) -> Any:
    """A copy of a Keras 3 `optimizer` (by its config) that applies its gradients times
    `factor`. Eager, in strategy scope.

    Raises:
      TypeError: for an optimizer other than Keras 3's, which has no `loss_scale_factor`.
    """
    import keras

    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"{type(optimizer).__name__} is not a Keras 3 optimizer")
    config = {**optimizer.get_config(), "loss_scale_factor": 1.0 / factor}
    return type(optimizer).from_config(config)


def build_variant_task(variant: Variant) -> Any:
    """The gin-bound task, of a subclass of its class that applies `variant`. Eager."""
    from orbitask.trainers.commands.train import build_task

    task = build_task()
    if variant == PLAIN:
        return task
    base = type(task)

    def build_inputs(self, *args, **kwargs):
        data = base.build_inputs(self, *args, **kwargs)
        if variant.nudged and isinstance(data, tf.data.Dataset):
            return data.map(_next_floats)
        return data

    def build_optimizer(self, learning_rate):
        built = base.build_optimizer(self, learning_rate)
        if variant.gradient_factor is None:
            return built
        return tf.nest.map_structure(lambda o: _times(o, variant.gradient_factor), built)

    methods = {"build_inputs": build_inputs, "build_optimizer": build_optimizer}
    task.__class__ = type(base.__name__, (base,), methods)
    return task


def _layers(model: Any) -> list:
    """Every object `model` tracks (its layers at any depth among them). Eager."""
    models = model.values() if isinstance(model, dict) else [model]
    return [d for one in models for d in tf.train.TrackableView(one).descendants()]


def per_replica_layers(objects: list) -> tuple[list[str], list[str]]:
    """The class names, among `objects`, of the layers that compute differently on each replica:
    `(batch normalizations not synchronized, random layers)`."""
    names = [type(x).__name__ for x in objects]
    norms = [n for x, n in zip(objects, names, strict=True) if "BatchNorm" in n
             and not getattr(x, "synchronized", n.startswith("Sync"))]  # fmt: skip
    random = [n for n in names if re.search(r"Dropout|Noise|^Random", n)]
    return sorted(set(norms)), sorted(set(random))


def _weights(task: Any, folder: str, step: int) -> tuple[dict[str, np.ndarray], list]:
    """The trainable weights of `folder`'s checkpoint at `step`, each keyed by its place and
    name (each build numbers its layers anew: dense_3, ...), and the model's tracked objects."""
    from orbitask.trainers.run.saved_model import restored_model

    model, _ = restored_model(task, os.path.join(folder, f"ckpt-{step}"), False, None, 1)
    models = model.items() if isinstance(model, dict) else [("", model)]
    found = [(f"{key}{getattr(v, 'path', None) or v.name}", v.numpy())
             for key, one in models for v in one.trainable_weights]  # fmt: skip
    named = {f"{i}:{re.sub(r'_[0-9]+(?=/|:|$)', '', n)}": v for i, (n, v) in enumerate(found)}
    return named, _layers(model)


def _step_logs(folder: str) -> dict[str, list[float]]:
    """The train logs of `folder`'s metrics.jsonl by name, a value a step (one step a line)."""
    from orbitask.trainers.state import metrics_file

    rows = [r for r in metrics_file.read(os.path.join(folder, metrics_file.NAME))
            if r["split"] == "train"]  # fmt: skip
    names = {k for r in rows for k in r if k not in ("step", "split") and not _TIMING.search(k)}
    return {k: [float(r.get(k, np.nan)) for r in rows] for k in sorted(names)}


def train(replicas: int, steps: int, folder: str, variant: Variant = PLAIN) -> Trained:
    """Trains the gin-bound experiment `steps` steps on `replicas` replicas into `folder`.
    Eager; returns what it left. The run's own lines are not printed: they name `folder`,
    which `verify` deletes."""
    from orbitask.trainers.run.experiment import run_experiment

    one = replicas == 1
    with contextlib.redirect_stdout(io.StringIO()):
        run_experiment(
            task=build_variant_task(variant), model_dir=folder, mode="train", train_steps=steps,
            seed=0, strategy="one_device" if one else "mirrored",
            cpu_devices=None if one else replicas, steps_per_loop=1, loop_seconds=None,
            checkpoint_interval=1, checkpoint_seconds=None, max_to_keep=None, progress=False,
            export_at_end=False, loggers=("tensorboard", "jsonl"),
        )  # fmt: skip
        first, _ = _weights(build_variant_task(PLAIN), folder, 1)
        last, layers = _weights(build_variant_task(PLAIN), folder, steps)
    norms, random = per_replica_layers(layers)
    return Trained(first, last, _step_logs(folder), norms, random)
