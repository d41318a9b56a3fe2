"""A Task's model: restored from a checkpoint (`restored_model`: export, predict, verify), and
written as a SavedModel that plain TensorFlow loads and serves.

Layout, under an `export/` folder: `export/<step>/` holds one SavedModel; a task whose
`build_model` returns a dict of models gets one SavedModel per model, `export/<step>/<name>/`.
`<step>` is the global step of the weights, so serving systems that load the highest numbered
version (TensorFlow Serving) pick the newest export. A step's folder is written under a temporary
name, `temp-<step>-<host>-<pid>-<hex>`, and renamed into place (`files.rename_tree`; on object
storage a copy of each file), replacing an earlier export of the same step. Temporary folders
that a killed export of this host left are removed; another host's are left alone.

Each SavedModel has one signature, `serving_default`, calling the model with `training=False`:

- its inputs are the model's inputs, named `inputs` when there is one: the model's `Input` layer
  when it has one, else the structure the model receives in evaluation (a validation batch
  after `Task.input_pre`, traced; a dict's keys name its inputs, a list's are `inputs_0`,
  `inputs_1`, ...); a model of a dict needs `Input` layers (several: a list). The batch
  dimension is left free;
- its outputs are `outputs` for a single tensor, the keys of a dict of tensors (nested keys
  joined with `_`), `output_0`, `output_1`, ... for a list.

    serve = tf.saved_model.load("runs/digits/export/1000").signatures["serving_default"]
    logits = serve(inputs=images)["outputs"]
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import uuid
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from orbitask.common import files
from orbitask.common.errors import one_line
from orbitask.trainers.engine import eval_inputs
from orbitask.trainers.errors import ConfigError, NoSpaceError
from orbitask.trainers.state.full_disk import is_no_space

_NAME = re.compile(r"[^A-Za-z0-9_]")


def write(task: Any, model: Any, export_root: str, step: int, per_replica_batch_size: int) -> str:
    """Writes `model` (or each model of a dict) as a SavedModel under `export_root/<step>/`.

    Eager, outside any strategy's scope; the model's current weights are saved.

    Args:
      task: the `orbitask.Task` that built the model (its validation data gives the input
        structure of a model without `Input` layers).
      model: a Keras model (either flavour) or a dict `{name: model}`.
      export_root: the `export/` folder.
      step: the global step of the weights; the folder's name.
      per_replica_batch_size: the batch size to build the validation data with.

    Returns:
      The path of the step's folder.

    Raises:
      ConfigError: for a model whose inputs cannot be found (a model of a dict without `Input`
        layers) or a dict key that is not a folder name.
      NoSpaceError: when the device is full (nothing of this export is left).
    """
    final = os.path.join(export_root, str(int(step)))
    name = f"temp-{int(step)}-{_host()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    temporary = os.path.join(export_root, name)
    made_root = not tf.io.gfile.isdir(export_root)
    try:
        tf.io.gfile.makedirs(export_root)
        _remove_abandoned(export_root)
        _save_models(task, model, temporary, per_replica_batch_size)
        files.rmtree(final)
        files.rename_tree(temporary, final)
    except (tf.errors.OpError, OSError) as e:
        if _not_writable(e):
            raise ConfigError(
                f"cannot write the SavedModel under {export_root} ({one_line(e, 200)}); export "
                "to a folder you can write to (orbitask export --output_dir=DIR)."
            ) from None
        if not is_no_space(e):
            raise
        _remove(temporary)
        if made_root and tf.io.gfile.isdir(export_root) and not tf.io.gfile.listdir(export_root):
            tf.io.gfile.rmtree(export_root)
        raise NoSpaceError(
            f"no space left on the device to write the SavedModel {final}; the half-written "
            "export was removed. Free space, then rerun the same command."
        ) from None
    finally:
        _remove(temporary)
    return final


def _save_models(task: Any, model: Any, folder: str, per_replica_batch_size: int) -> None:
    """Saves `model` as a SavedModel in `folder`, or each model of a dict in `folder/<key>`."""
    if isinstance(model, dict):
        for name, one in model.items():
            if not isinstance(name, str) or _NAME.search(name):
                raise ConfigError(
                    f"build_model's dict key {name!r} names an export folder and must be "
                    "letters, digits and _; rename it in your Task's build_model."
                )
            _save(one, _model_inputs(one, name), os.path.join(folder, name))
    else:
        specs = _model_inputs(model, None)
        if specs is None:
            specs = _data_inputs(task, per_replica_batch_size)
        _save(model, specs, folder)


def _not_writable(error: BaseException) -> bool:
    if isinstance(error, (tf.errors.PermissionDeniedError, PermissionError)):
        return True
    return "Read-only file system" in str(error) or "Permission denied" in str(error)


def _remove_abandoned(export_root: str) -> None:
    """Removes the temporary folders of exports whose process has died (a kill -9) on this host:
    `temp-<step>-<host>-<pid>-<hex>` whose pid runs no more here. Another host's are left: its
    export may be running."""
    for name in files.listdir(export_root):
        found = re.fullmatch(r"temp-\d+-(.+)-(\d+)-[0-9a-f]{8}", name)
        if found and found.group(1) == _host() and not _running(int(found.group(2))):
            _remove(os.path.join(export_root, name))


def _host() -> str:
    """This host's name as a folder name's part (letters, digits, `.` and `_` kept)."""
    return re.sub(r"[^A-Za-z0-9._]", "_", socket.gethostname()) or "host"


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove(folder: str) -> None:
    if tf.io.gfile.exists(folder):
        tf.io.gfile.rmtree(folder)


def build_weights(task: Any, model: Any, per_replica_batch_size: int) -> None:
    """Creates the weights of a model without `Input` layers: one call, `training=False`, on
    zeros of what it receives in evaluation. Eager; returns None.

    Raises:
      ConfigError: when the model (or a model of a dict) still has no weights.
    """
    models = model.values() if isinstance(model, dict) else [model]
    if not isinstance(model, dict) and not model.weights:
        specs = _data_inputs(task, per_replica_batch_size)
        model(zeros(specs), training=False)
    if not all(m.weights for m in models):
        raise ConfigError(
            f"{type(task).__name__}.build_model() returned a model without weights; give it an "
            "input shape (e.g. keras.Input((64,)) as its first layer)."
        )


def zeros(spec: Any, batch: int = 1) -> Any:
    """A nest of zeros (empty strings for `tf.string`) of the TensorSpecs `spec`: a free
    leading dimension is `batch`, any other free dimension 1. Eager; returns it."""

    def make(s: tf.TensorSpec) -> tf.Tensor:
        dims = [d if d is not None else 1 for d in s.shape.as_list()]
        if dims and s.shape[0] is None:
            dims[0] = batch
        return tf.zeros(dims, s.dtype) if s.dtype != tf.string else tf.fill(dims, "")

    return tf.nest.map_structure(make, spec)


def _model_inputs(model: Any, name: str | None) -> Any:
    """TensorSpecs of the model's `Input` layers: one spec, or a list for a model `name` of a
    dict. None for the model (not of a dict) without one `Input` layer, whose evaluation data
    gives the structure instead."""
    try:
        tensors = model.inputs
    except (AttributeError, ValueError):
        tensors = None
    if not tensors or (name is None and len(tensors) > 1):
        if name is None:
            return None
        raise ConfigError(
            f"model {name!r} of build_model's dict has no Input layer, so its SavedModel has no "
            "known inputs; give it one (e.g. keras.Input((64,)) as its first layer)."
        )
    specs = [_free_batch(t.shape, t.dtype) for t in tensors]
    return specs[0] if len(specs) == 1 else specs


def _data_inputs(task: Any, per_replica_batch_size: int) -> Any:
    """TensorSpecs of what the model receives in evaluation: a validation batch through
    `task.input_pre`, traced (never run)."""
    dataset = eval_inputs.eval_dataset(task, tf.distribute.get_strategy(), per_replica_batch_size)
    lr = tf.constant(0.0)
    traced = tf.function(lambda batch: task.input_pre(batch, lr))
    outputs = traced.get_concrete_function(dataset.element_spec).structured_outputs
    return tf.nest.map_structure(lambda t: _free_batch(t.shape, t.dtype), outputs)


def _free_batch(shape: Any, dtype: tf.DType) -> tf.TensorSpec:
    dims = tf.TensorShape(shape).as_list()
    return tf.TensorSpec([None, *dims[1:]] if dims else [], tf.as_dtype(dtype))


def _named(structure: Any, single: str, prefix: str) -> Any:
    """`structure` with each leaf replaced by its name: `single` for a lone leaf, else its path
    of keys and indices joined with `_` (`prefix` before a leading index)."""
    if not tf.nest.is_nested(structure):
        return single
    names = ["_".join(path) for path in _paths(structure)]
    names = [f"{prefix}_{name}" if name[:1].isdigit() else name for name in names]
    return tf.nest.pack_sequence_as(structure, names)


def _paths(structure: Any, path: tuple = ()) -> list[tuple]:
    """The path of every leaf, in `tf.nest.flatten`'s order (a dict's keys sorted)."""
    if isinstance(structure, Mapping):
        return [p for key in sorted(structure) for p in _paths(structure[key], (*path, str(key)))]
    if isinstance(structure, (list, tuple)):
        return [p for i, item in enumerate(structure) for p in _paths(item, (*path, str(i)))]
    return [path]


def _save(model: Any, specs: Any, directory: str) -> None:
    names = _named(specs, "inputs", "inputs")
    named = tf.nest.map_structure(
        lambda spec, name: tf.TensorSpec(spec.shape, spec.dtype, name=name), specs, names
    )

    @tf.function(input_signature=[named])
    def serve(model_inputs):
        outputs = model(model_inputs, training=False)
        keys = tf.nest.flatten(_named(outputs, "outputs", "output"))
        return dict(zip(keys, tf.nest.flatten(outputs), strict=True))

    module = tf.Module()
    module.model = model  # tracks the weights the signature reads
    module.serve = serve
    tf.saved_model.save(module, directory, signatures={"serving_default": serve})


def restored_model(
    task: Any,
    path: str,
    ema: bool,
    mixed_precision: str | None,
    per_replica_batch_size: int,
    unset_ema: str = "drop --ema",
) -> tuple:
    """Builds the task's model and restores the checkpoint `path` into it. Eager.

    Args:
      task: the run's `orbitask.Task`.
      path: a checkpoint of the run (`ckpt-N`, or `best/best_ckpt-N`).
      ema: put the checkpoint's EMA averages into the trainable weights.
      mixed_precision: the run's `mixed_precision` policy, set while the model is built.
      per_replica_batch_size: the batch size of validation data that builds the weights of a
        model without `Input` layers.
      unset_ema: how the caller turns `ema` off, named in the error of a checkpoint without
        averages.

    Returns:
      `(model, global step of the checkpoint)`.

    Raises:
      ConfigError: when the checkpoint does not fit the model or holds no EMA averages.
    """
    from orbitask.trainers.features.ema import ExponentialMovingAverage
    from orbitask.trainers.features.precision import precision_policy

    with precision_policy(mixed_precision):
        model = task.build_model()
    build_weights(task, model, per_replica_batch_size)
    step = tf.Variable(0, dtype=tf.int64)
    objects = {"step": step, "train_model": model}
    averages = ExponentialMovingAverage() if ema else None
    if averages is not None:
        if not any(name.startswith("ema/") for name, _ in tf.train.list_variables(path)):
            raise ConfigError(
                f"--ema: checkpoint {path} holds no EMA averages; train with "
                f"orbitask.run_experiment.ema = @orbitask.ExponentialMovingAverage(), or "
                f"{unset_ema}."
            )
        objects["ema"] = averages.build(model)
    try:
        status = tf.train.Checkpoint(**objects).restore(path).expect_partial()
        status.assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.InvalidArgumentError) as e:
        raise ConfigError(
            f"checkpoint {path} does not fit the model {type(task).__name__} builds "
            f"({one_line(e, 200)}); pass the gin files the run was trained with."
        ) from e
    if averages is not None:
        for variable, shadow in zip(averages.variables, averages.shadows, strict=True):
            variable.assign(shadow)
    return model, int(step.numpy())


def export_trained(task: Any, objects: Any, root: str, step: int) -> str:
    """Writes the trained model of `objects` (a `steps.RunObjects`; its EMA averages if set) as
    a SavedModel under `root/export` at `step`. Eager; returns its folder."""
    ema, model = objects.ema, objects.model
    batch = objects.global_batch_size // objects.strategy.num_replicas_in_sync
    with ema.averaged() if ema else contextlib.nullcontext():
        return write(task, model, os.path.join(root, "export"), step, batch)
