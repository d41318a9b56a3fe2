"""The private tf.data behaviour orbitask relies on: a pipeline's structure, read from its Python
datasets. tests/test_compat.py fails loudly when a new version of TensorFlow changes it."""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.data.ops import dataset_ops, prefetch_op
from tensorflow.python.data.ops.structured_function import StructuredFunctionWrapper as _Wrapper


def strip_options(dataset: tf.data.Dataset) -> tuple[tf.data.Dataset, tf.data.Options]:
    """Returns `dataset` without its `with_options` layers, and the options they set. Eager."""
    top, options = dataset, dataset.options()
    while isinstance(top, dataset_ops._OptionsDataset):  # noqa: SLF001
        top = top._input_dataset  # noqa: SLF001
    return top, options


def autotuned_prefetch_input(dataset: tf.data.Dataset) -> tf.data.Dataset | None:
    """The input of `dataset` when it is a `prefetch(tf.data.AUTOTUNE)`, else None. Eager."""
    if not isinstance(dataset, prefetch_op._PrefetchDataset):  # noqa: SLF001
        return None
    value = tf.get_static_value(dataset._buffer_size)  # noqa: SLF001
    if value is None or int(value) != tf.data.AUTOTUNE:
        return None
    return dataset._input_dataset  # noqa: SLF001


def dataset_inputs(dataset: tf.data.Dataset) -> list:
    """The Python datasets `dataset` reads (none for one made from a variant). Eager."""
    try:
        return list(dataset._inputs())  # noqa: SLF001
    except NotImplementedError:
        return []


def dataset_functions(dataset: tf.data.Dataset) -> list[tuple[str, tf.Graph]] | None:
    """The traced functions (`map`, `filter`, `interleave`, ...) of `dataset` and of every
    dataset it reads, each as `(library name, graph)`; None when a dataset's inputs are unknown
    (one made from a variant). Eager. Unlike serializing the pipeline (`dataset_graph_def`), it
    copies no in-memory data (a `from_tensor_slices` source): its cost does not grow with the
    data. Uses `Dataset._inputs`, `Dataset._functions`, `_VariantDataset` and
    `StructuredFunctionWrapper`."""
    found, todo, seen = [], [dataset], set()
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, dataset_ops._VariantDataset):  # noqa: SLF001
            return None
        try:
            todo.extend(current._inputs())  # noqa: SLF001
        except NotImplementedError:
            return None
        wrappers = [v for v in vars(current).values() if isinstance(v, _Wrapper)]
        wrappers += [w for w in current._functions() if not any(w is v for v in wrappers)]  # noqa: SLF001
        found += [(tf.compat.as_str(w.function.name), w.function.graph) for w in wrappers]
    return found


def dataset_graph_def(dataset: tf.data.Dataset) -> tf.compat.v1.GraphDef:
    """The GraphDef of `dataset`'s pipeline, functions included, stateful ops kept. Eager.
    Uses `Dataset._as_serialized_graph`; it holds (copies) the pipeline's in-memory data."""
    policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    serialized = dataset._as_serialized_graph(external_state_policy=policy)  # noqa: SLF001
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(serialized.numpy())
    return graph_def
