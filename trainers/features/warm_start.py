"""Warm start: copy model weights (all, or a subset by name) from a pretrained checkpoint.

Runs once, eagerly, on a fresh run only (a run that restored its own checkpoint keeps it), and
never touches the optimizer, the step or the input position. Variables are matched by their
object path under the checkpoint's model root (`train_model` in orbitask checkpoints, `model` in
Model Garden's), so the init checkpoint may come from another orbitask run, Model Garden's
`train_lib.run_experiment`, or any `tf.train.Checkpoint(<root>=model)`.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import gin
import keras
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from orbitask.common import files
from orbitask.trainers.errors import ConfigError


def model_variables(model: Any) -> list[tuple[tuple[str, ...], Any]]:
    """(object path from the model, variable) for every variable of the model. Eager."""
    out, seen = [], set()
    queue = deque([((), model)])
    while queue:
        path, obj = queue.popleft()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, (tf.Variable, keras.Variable)):
            out.append((path, obj))
            continue
        for name, child in tf.train.TrackableView(obj).children(obj).items():
            queue.append(((*path, name), child))
    return out


# orbitask's name of the model in its checkpoints, and Model Garden's (official.core.base_trainer).
ROOT, MODEL_GARDEN_ROOT = "train_model", "model"


def _object_graph(reader) -> Any:
    """The object graph of the checkpoint `reader` reads (a `TrackableObjectGraph`)."""
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    return graph


def _checkpoint_keys(graph) -> Any:
    """A function mapping an object path (from the root of the object `graph`) to its
    variable's checkpoint key.

    Object-based checkpoints store each variable once, under the first path found (an
    optimizer's reference can come first), so paths are resolved through the object graph.
    """

    def key(path: tuple[str, ...]) -> str | None:
        node = graph.nodes[0]
        for name in path:
            child = next((c for c in node.children if c.local_name == name), None)
            if child is None:
                return None
            node = graph.nodes[child.node_id]
        for attribute in node.attributes:
            if attribute.name == "VARIABLE_VALUE":
                return attribute.checkpoint_key
        return None

    return key


def _display_name(variable: Any) -> str:
    return getattr(variable, "path", None) or variable.name.split(":")[0]


@gin.configurable("WarmStart", module="orbitask")
class WarmStart:
    """Initialises model weights from `init_checkpoint` before training.

    Args:
      init_checkpoint: a checkpoint path (prefix) or a directory (its latest checkpoint).
      root: the name the model has in that checkpoint (orbitask saves it as "train_model").
        At "train_model", a checkpoint without it but with Model Garden's "model" is read
        under "model".
      include: keep only variables whose object path (e.g. "train_model/_functional/...")
        starts with one of these prefixes, or
        whose Keras name contains one from a path component on (e.g. "dense/" matches
        "digits_mlp/dense/kernel"); None restores every match.
      exclude: drop variables whose name or key starts with one of these prefixes.
    """

    def __init__(
        self,
        init_checkpoint: str = gin.REQUIRED,
        root: str = ROOT,
        include: tuple | None = None,
        exclude: tuple = (),
    ):
        self.init_checkpoint = init_checkpoint
        self.root = root
        self.include = tuple(include) if include else None
        self.exclude = tuple(exclude)

    def _root(self, graph) -> str:
        """`root`, or Model Garden's "model" for the default root in a checkpoint without it."""
        top = {child.local_name for child in graph.nodes[0].children}
        if self.root == ROOT and ROOT not in top and MODEL_GARDEN_ROOT in top:
            return MODEL_GARDEN_ROOT
        return self.root

    def _wanted(self, key: str, name: str) -> bool:
        def hit(prefixes):
            # A prefix of the checkpoint key, or of the Keras name from any path component.
            return any(key.startswith(p) or f"/{p}" in f"/{name}" for p in prefixes)

        return (self.include is None or hit(self.include)) and not hit(self.exclude)

    def apply(self, model: Any) -> dict[str, list[str]]:
        """Eager: assigns matching weights. Returns {"restored", "missing", "mismatched",
        "skipped"} lists of variable names, and prints a one-paragraph report.

        Raises:
          ConfigError: when the checkpoint cannot be read or nothing at all matched.
        """
        path = self.init_checkpoint
        if path and files.is_folder(path):
            path = tf.train.latest_checkpoint(path)
        try:
            reader = files.checkpoint_reader(path)
        except (tf.errors.OpError, ValueError, TypeError) as e:
            raise ConfigError(
                f"WarmStart.init_checkpoint {self.init_checkpoint!r} cannot be read "
                f"({' '.join(str(e).split())[:200]}); point it at a checkpoint prefix or directory."
            ) from e
        shapes = reader.get_variable_to_shape_map()
        graph = _object_graph(reader)
        root = self._root(graph)
        key_of = _checkpoint_keys(graph)
        report: dict[str, list[str]] = {
            "restored": [],
            "missing": [],
            "mismatched": [],
            "skipped": [],
        }
        for object_path, variable in model_variables(model):
            name = _display_name(variable)
            key = key_of((root, *object_path))
            if not self._wanted("/".join((root, *object_path)), name):
                report["skipped"].append(name)
            elif key is None or key not in shapes:
                report["missing"].append(name)
            elif list(shapes[key]) != list(variable.shape):
                report["mismatched"].append(
                    f"{name} (checkpoint {list(shapes[key])} vs model {list(variable.shape)})"
                )
            else:
                variable.assign(reader.get_tensor(key))
                report["restored"].append(name)
        if not report["restored"]:
            raise ConfigError(
                f"WarmStart restored nothing from {path} under root {root!r} (missing: "
                f"{len(report['missing'])}, mismatched: {len(report['mismatched'])}); check "
                "WarmStart.root and include/exclude."
            )
        print(
            f"orbitask: warm start from {path} (root {root!r}): restored "
            f"{len(report['restored'])} variable(s); "
            f"not restored: {len(report['missing'])} missing, {len(report['mismatched'])} "
            f"shape-mismatched {report['mismatched']}, {len(report['skipped'])} excluded",
            flush=True,
        )
        return report
