"""Random state the task's objects own, found so that checkpoints save it (exact resume).

A `keras.random.SeedGenerator` keeps its state in a variable that `tf.train.Checkpoint` does not
reach through a Keras 3 model or a plain Python object; a `tf.random.Generator` on a task, or
behind a tf_keras dropout layer (made by `keras_compat.save_layer_draws`), is not
tracked either. `find` walks the task, its model(s) and its loss object for them, so the runner
checkpoints them under `random_state/`.

What no checkpoint can hold is named in one line at start, with the fix: host generators
(Python's `random.Random`, NumPy's), and TensorFlow's stateful random ops (`tf.random.normal`,
`tf.image.random_flip_left_right`, `tf.image.sample_distorted_bounding_box`, ...) in the train
step (`unsaved_step_draws`) or in the training input pipeline (`unsaved_input_draws`), whose
state lives in the op's kernel: a resumed run draws their sequence from its start again.
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

from orbitask.common import keras_compat
from orbitask.trainers import compat, data_compat

_HOST = (random.Random, np.random.RandomState, np.random.Generator)
_MAX_DEPTH = 64  # each nested Keras layer is two levels (its layer list, an item)
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
        if (generator := keras_compat.layer_generator(obj)) is not None:
            saved[path] = generator
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


# TensorFlow's random ops whose state is kept in the op's kernel, not in a variable.
STATEFUL_RANDOM_OPS = frozenset(
    {
        "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
        "ParameterizedTruncatedNormal", "RandomShuffle", "RandomCrop", "Multinomial",
        "RandomGamma", "RandomPoisson", "RandomPoissonV2", "SampleDistortedBoundingBox",
        "SampleDistortedBoundingBoxV2",
    }
)  # fmt: skip
_LIBRARY_PATHS = ("/tensorflow/", "/keras/", "/tf_keras/", "/orbit/", "/orbitask/", "/absl/")


@tf.autograph.experimental.do_not_convert
def unsaved_step_draws(graph: Any) -> list[str]:
    """Names the stateful random ops of a traced step (`graph`, a FuncGraph, with the functions
    it calls, conds and loops included), each as `"OpType (file:line)"` at the innermost frame
    of the user's code that created it (`file:line` left out when none is found). Eager."""
    found = []
    for op in compat.graph_ops(graph):
        if op.type in STATEFUL_RANDOM_OPS:
            where = _user_frame(op)
            found.append(f"{op.type} ({where})" if where else op.type)
    return sorted(set(found))


def unsaved_input_draws(dataset: tf.data.Dataset) -> list[str]:
    """Names the stateful random ops of a `tf.data` pipeline, each as `"OpType in fn"` with the
    name of the traced function (a `map` of `build_inputs`, ...) that holds it. Eager, once.

    Reads the pipeline's traced functions where they are (`data_compat.dataset_functions`), so
    its cost does not grow with in-memory data; serializes the pipeline only when a dataset's
    inputs are unknown (one made from a variant)."""
    functions = data_compat.dataset_functions(dataset)
    if functions is None:
        graph_def = data_compat.dataset_graph_def(dataset)
        found = {node.op for node in graph_def.node if node.op in STATEFUL_RANDOM_OPS}
        ops = [(f.signature.name, n.op) for f in graph_def.library.function for n in f.node_def]
    else:
        found = set()
        ops = [
            (name, op.type)
            for top, graph in functions
            for name, inner in compat.function_graphs(graph, top)
            for op in inner.get_operations()
        ]
    found |= {f"{op} in {_function_name(name)}" for name, op in ops if op in STATEFUL_RANDOM_OPS}
    return sorted(found)


def say_unsaved(where: str, draws: list[str], fix: str) -> None:
    """Warns, in one line on stdout and in the log, that `draws` in `where` are not saved in
    checkpoints, what that costs and `fix`. Eager; returns None."""
    message = (
        f"{where} draws random numbers with stateful ops ({', '.join(draws)}) whose state "
        "checkpoints cannot hold: a resumed run repeats or changes those draws, so it differs "
        f"from an uninterrupted one. {fix}"
    )
    logging.warning(message)
    print(f"orbitask: warning: {message}", flush=True)


STEP_FIX = (
    "Draw from a keras.random.SeedGenerator or a tf.random.Generator kept on the task or model "
    "(saved with the checkpoint), or use tf.random.stateless_* ops."
)
INPUT_FIX = (
    "Use stateless ops (tf.random.stateless_*, tf.image.stateless_random_*) with seeds from "
    "tf.data.Dataset.random() zipped in, or an orbitask.IndexedInput."
)


def _user_frame(op: Any) -> str | None:
    """`file:line` of the innermost frame outside TensorFlow, Keras, Orbit and orbitask."""
    for frame in reversed(op.traceback):
        name = frame.filename
        if "__autograph_generated" in name or any(p in name for p in _LIBRARY_PATHS):
            continue
        if name.startswith(sys.prefix) and "site-packages" not in name:
            continue  # the standard library
        return f"{name.rsplit('/', 1)[-1]}:{frame.lineno}"
    return None


def _function_name(name: str) -> str:
    """`__inference_Dataset_map_parse_example_123` -> `parse_example`."""
    for prefix in ("__inference_", "Dataset_map_", "Dataset_flat_map_", "Dataset_filter_"):
        name = name.removeprefix(prefix)
    head, _, tail = name.rpartition("_")
    return head if tail.isdigit() else name


def _key(path: str) -> str:
    return path.replace(".", "/").replace("-", "_")


REPLICA_SEED_STRIDE = 1_000_003  # replica r draws from seed + r * stride


class ReplicaDraws:
    """Gives every replica its own draws from the Keras 3 `SeedGenerator`s under `roots`.

    A `SeedGenerator`'s state `[seed, counter]` is a mirrored variable: every replica reads the
    same value and would draw the same noise and dropout masks. Before each device loop, each
    replica's copy gets `seed + replica * REPLICA_SEED_STRIDE` (the replica's number over all
    workers), its counter kept. Replica 0's copy, the one a checkpoint saves, keeps the
    generator's own seed, so a restored state spreads again to the same streams: exact resume.
    (`tf.random.Generator`s, tf_keras' included, fold in the replica already.)
    """

    def __init__(self, roots: dict[str, Any], strategy: tf.distribute.Strategy):
        self.strategy = strategy
        saved, _ = find(roots)
        self.states = []
        if strategy.num_replicas_in_sync > 1:
            for state in saved.values():
                variable = getattr(state, "value", None)  # a Keras 3 variable's tf.Variable
                if isinstance(state, keras.Variable) and isinstance(
                    variable, tf.distribute.DistributedValues
                ):
                    self.states.append(variable)
        self.seeds = [int(v.values[0].numpy()[0]) for v in self.states]
        self._spread = tf.function(self._spread_fn) if self.states else None

    def __call__(self) -> None:
        """Spreads the seeds over the replicas. Eager; one call of a tf.function, or none."""
        if self._spread is not None:
            self._spread()

    def _spread_fn(self) -> None:
        def per_replica():
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            for variable, seed in zip(self.states, self.seeds, strict=True):
                local = tf.convert_to_tensor(variable)
                own = tf.cast(seed, local.dtype) + tf.cast(replica, local.dtype) * tf.cast(
                    REPLICA_SEED_STRIDE, local.dtype
                )
                variable.assign(tf.stack([own, local[1]]))

        self.strategy.run(per_replica)
