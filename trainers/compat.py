"""The private Orbit, Keras, tf.data and gin behaviour orbitask relies on, in one place.

Each function here names what it reaches into; tests/test_compat.py fails loudly when a new
version of a library changes it.
"""

from __future__ import annotations

import contextlib
import logging as logging_std
import os
from collections.abc import Iterator

import gin
import orbit.controller
import tensorflow as tf
from absl import logging
from tensorflow.python.data.ops import dataset_ops, prefetch_op


@contextlib.contextmanager
def orbit_messages_to_absl() -> Iterator[None]:
    """While open, Orbit's controller messages go to the absl log instead of stdout. Eager.

    `orbit.controller._log` prints a line after every evaluation and restore; the progress
    display replaces it. Yields nothing; restores Orbit's function on exit.
    """
    original = orbit.controller._log  # noqa: SLF001
    orbit.controller._log = logging.info  # noqa: SLF001
    try:
        yield
    finally:
        orbit.controller._log = original  # noqa: SLF001


def gin_search_first(paths: list[str]) -> None:
    """Puts `paths` first on gin's include search path, in order. Eager; returns None.

    gin's public `add_config_file_search_path` appends; an include that is not under the working
    directory then reaches gin's Python-path reader first, which fails on a folder without
    `__init__.py`. gin keeps the order in `gin.config._LOCATION_PREFIXES`.
    """
    prefixes = gin.config._LOCATION_PREFIXES  # noqa: SLF001
    for path in reversed(paths):
        if path in prefixes:
            prefixes.remove(path)
        prefixes.insert(0, path)


def manager_settings(manager: tf.train.CheckpointManager) -> dict:
    """The constructor arguments a `tf.train.CheckpointManager` was built with that it does not
    expose: max_to_keep, keep_checkpoint_every_n_hours, checkpoint_name, step_counter. Eager;
    returns them as keyword arguments."""
    return dict(
        max_to_keep=manager._max_to_keep,  # noqa: SLF001
        keep_checkpoint_every_n_hours=manager._keep_checkpoint_every_n_hours,  # noqa: SLF001
        checkpoint_name=os.path.basename(manager._checkpoint_prefix),  # noqa: SLF001
        step_counter=getattr(manager, "_step_counter", None),  # set with checkpoint_interval only
    )


def checkpoint_prefix(manager: tf.train.CheckpointManager) -> str:
    """The path a manager's checkpoints start with (`<its folder>/ckpt`), its own folder even
    where `directory` is overridden. Eager; returns it."""
    return manager._checkpoint_prefix  # noqa: SLF001


def ps_num_workers(strategy: tf.distribute.Strategy) -> int:
    """The number of workers a `ParameterServerStrategy` schedules on. Eager; returns it."""
    return strategy.extended._num_workers  # noqa: SLF001 (its cluster_resolver is not public)


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


class _GinPathProbe(logging_std.Filter):
    def filter(self, record: logging_std.LogRecord) -> bool:
        probe = record.pathname.endswith(os.path.join("gin", "resource_reader.py"))
        return not (probe and record.getMessage().startswith("Path not found"))


@contextlib.contextmanager
def quiet_gin_path_probes() -> Iterator[None]:
    """While open, gin's "Path not found" errors are dropped. Eager; yields nothing.

    gin tries an include under each search path with each file reader; its Python-package reader
    logs an ERROR on the root logger for every path that is not a package, before a later search
    path resolves the include.
    """
    probe = _GinPathProbe()
    root = logging_std.getLogger()
    root.addFilter(probe)
    try:
        yield
    finally:
        root.removeFilter(probe)
