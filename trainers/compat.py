"""The private Orbit, tf.train, tf.Graph and gin behaviour orbitask relies on (tf.data's:
`trainers/data_compat.py`).

Each function here names what it reaches into; tests/test_compat.py fails loudly when a new
version of a library changes it. Keras's private API is reached in
`orbitask/common/keras_compat.py` (which does not import this one). The other places that reach
private API, and why:

- `trainers/run/controller.py`: `Controller` subclasses `orbit.Controller` and overrides its
  `_train_n_steps` (one device loop and its schedule, without Orbit's step reads and log line) and
  `_maybe_save_checkpoint` (a save unless the step is saved already; when is the schedule's
  "checkpoint" entry; Orbit's public `save_checkpoint` calls it), and calls Orbit's `_require`
  and `_sync_on_async_checkpointing` as Orbit's own `train` does. Overrides must keep Orbit's
  names to be called by Orbit's code.
- `trainers/state/checkpoint_manager.py`, `trainers/state/checkpoint_restore.py`: a
  `tf.train.CheckpointManager`'s `_max_to_keep`, `_maybe_delete` and `_latest_checkpoint`
  (which checkpoints it keeps, set from the files when its state file is damaged or a corrupt
  newest one is skipped); `checkpoint_management.get_checkpoint_state`, replaced while a
  manager reads its state file so that a damaged one reads as none; and the object graph of a
  checkpoint and of its restore status (`_trackable_children`, `graph_view`,
  `_objects_with_attributes`, `status._checkpoint`), to name what a restore left unbound.
- `trainers/distribution/strategies.py` (through `own_collective_keys` here): a
  `MirroredStrategy`'s collective keys.
- `trainers/state/checkpoint_files.py`: `checkpoint_management.CheckpointState`, the proto of a
  manager's state file.
- `tasks/base.py`, `trainers/actions/callback_action.py`: `tf.__internal__.tracking.Trackable`,
  to tell what a checkpoint can hold.
- `trainers/actions/summaries.py` (`reopen`): an Orbit `SummaryManager`'s `_summary_writers`, and
  the `LoopSummaryManager`'s own writer thread and traced write, to drop the writers of files
  deleted with their folder.
"""

from __future__ import annotations

import contextlib
import logging as logging_std
import os
import random
import time
from collections.abc import Iterator
from typing import Any

import gin
import numpy as np
import orbit.controller
import tensorflow as tf
from absl import logging
from tensorflow.python.checkpoint import async_checkpoint_helper
from tensorflow.python.eager import context as eager_context
from tensorflow.python.framework import ops


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


def gin_macros() -> tuple[set[str], set[str]]:
    """The gin macros bound (`NAME = ...`) and those referenced (`%NAME`) by a binding. Eager.

    gin keeps its bindings in `gin.config._CONFIG`, a macro as the `value` of configurable
    `gin.macro` in a scope of its name; `gin.config.iterate_references` walks the values.
    """
    config = gin.config._CONFIG  # noqa: SLF001
    bound = {scope for scope, selector in config if selector == "gin.macro"}
    references = gin.config.iterate_references(config)
    return bound, {ref.scopes[-1] for ref in references if ref.selector == "gin.macro"}


def write_session_start(writer: Any, step: int) -> None:
    """Writes a `SessionLog.START` event at `step` into the summary `writer`: TensorBoard's reader
    then drops the points past `step` that an earlier process wrote (a resume's orphans). Eager.

    TF 2 has no public call for it; `summary_ops_v2.import_event` writes a raw `Event`.
    """
    from tensorflow.python.ops import summary_ops_v2

    start = tf.compat.v1.SessionLog(status=tf.compat.v1.SessionLog.START)
    event = tf.compat.v1.Event(wall_time=time.time(), step=int(step), session_log=start)
    with writer.as_default():
        summary_ops_v2.import_event(tf.constant(event.SerializeToString()))
    writer.flush()


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


class _AsyncSaver(async_checkpoint_helper.AsyncCheckpointHelper):
    """TensorFlow's async checkpoint writer over every child of a checkpoint, copying eagerly.

    TensorFlow builds its writer from the checkpoint's constructor arguments only (an attribute
    set later would be left out) and copies the values to host memory in a `tf.function`, where
    a Keras 3 variable creates a new `tf.Variable` at each save and fails from the second one.
    """

    def __init__(self, checkpoint: tf.train.Checkpoint):
        children = tf.train.TrackableView(checkpoint).children(checkpoint)
        children.pop("save_counter", None)  # the writer numbers nothing; the manager does
        super().__init__(tf.train.Checkpoint, **children)

    def _copy_to_cpu(self) -> None:
        for trackable in self._saveable_trackables:
            try:
                trackable._copy_trackable_to_cpu(object_map=self._object_map)  # noqa: SLF001
            except NotImplementedError as e:
                logging.warning("Trackable %s is written from the thread: %s", trackable, e)


class FrozenAtAsyncSave(tf.train.experimental.PythonState):
    """A `PythonState` that an async save writes as the copy `frozen_copy()` returns, taken on
    the training thread at every async save, the first included (TensorFlow's
    `_copy_trackable_to_cpu` hook); a sync save calls `serialize` as usual."""

    def frozen_copy(self) -> tf.train.experimental.PythonState:
        """Returns a `PythonState` holding this state now. Eager, on the training thread."""
        raise NotImplementedError

    def _copy_trackable_to_cpu(self, object_map) -> None:
        object_map[self] = self.frozen_copy()


def enable_async_writes(checkpoint: tf.train.Checkpoint) -> None:
    """Makes `checkpoint`'s async saves (`CheckpointOptions(enable_async=True)`) write every
    child it holds now, Keras 3 variables included (a `FrozenAtAsyncSave` as its frozen copy).
    Eager; returns None. Call once, before the first save.

    Reaches into `tf.train.Checkpoint._async_checkpointer_impl` (made lazily from the
    constructor's arguments) and `AsyncCheckpointHelper._copy_to_cpu`.
    """
    checkpoint._async_checkpointer_impl = _AsyncSaver(checkpoint)  # noqa: SLF001


def take_async_error(checkpoint: tf.train.Checkpoint) -> BaseException | None:
    """The error of `checkpoint`'s last background write, if any, cleared so that TensorFlow
    does not raise it again at exit; None when the write succeeded or none ran. Eager; call
    after `sync()` (`AsyncCheckpointHelper._async_error`)."""
    helper = getattr(checkpoint, "_async_checkpointer_impl", None)
    error = getattr(helper, "_async_error", None)
    if error is not None:
        helper._async_error = None  # noqa: SLF001
    return error


# Collective key ranges handed out in this process (TensorFlow's own strategies start at 0).
_KEY_RANGE = 100_000
_key_ranges = iter(range(_KEY_RANGE, 2**31 - _KEY_RANGE, _KEY_RANGE))


def own_collective_keys(strategy: tf.distribute.Strategy) -> None:
    """Gives a `MirroredStrategy` collective keys of its own in this process, once per strategy
    object. Eager; returns None; other strategies are left as they are.

    Every `MirroredStrategy` numbers its collectives (all-reduces on CPUs, and under XLA) from
    group key 1 and instance key 100, and the collective runtime remembers each key's shape for
    the process's life: a second strategy whose key 100 reduces another shape aborts with
    "Shape mismatch in the collective instance 100" (a run of another model after a first one).
    TensorFlow's own tests move `_collective_key_base` for the same reason. This re-makes the
    strategy's `CollectiveAllReduce` (`MirroredExtended._collective_ops`, and
    `_cross_device_ops` where that is it) from a key base no other strategy here uses.
    """
    extended = strategy.extended
    if not isinstance(strategy, tf.distribute.MirroredStrategy):
        return
    if getattr(extended, "_orbitask_own_keys", False):
        return
    extended._orbitask_own_keys = True  # noqa: SLF001
    old = extended._collective_ops  # noqa: SLF001
    extended._collective_key_base = next(_key_ranges)  # noqa: SLF001
    extended._collective_ops = extended._make_collective_ops_with_fallbacks()  # noqa: SLF001
    if extended._cross_device_ops is old:  # noqa: SLF001
        extended._cross_device_ops = extended._collective_ops  # noqa: SLF001


def ps_num_workers(strategy: tf.distribute.Strategy) -> int:
    """The number of workers a `ParameterServerStrategy` schedules on. Eager; returns it."""
    return strategy.extended._num_workers  # noqa: SLF001 (its cluster_resolver is not public)


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


def function_graphs(graph: tf.Graph, name: str = "") -> Iterator[tuple[str, tf.Graph]]:
    """`(name, graph)`, then `(library name, graph)` of every function it calls (`If`/`While`
    branches and bodies, `PartitionedCall`s, a `map` inside an `interleave`), each once. Eager.
    Uses `Graph._get_function`."""
    seen: set[str] = set()
    todo = [(name, graph)]
    while todo:
        name, current = todo.pop()
        yield name, current
        for op in current.get_operations():
            for attr in op.node_def.attr.values():
                names = [attr.func.name] if attr.func.name else [f.name for f in attr.list.func]
                for called in names:
                    function = current._get_function(called)  # noqa: SLF001
                    if called not in seen and function is not None:
                        seen.add(called)
                        todo.append((called, function.graph))


def graph_ops(graph: tf.Graph) -> Iterator[tf.Operation]:
    """Every op of `graph` and of the functions it calls (`function_graphs`). Eager."""
    for _, current in function_graphs(graph):
        yield from current.get_operations()


@contextlib.contextmanager
def host_random_state_kept() -> Iterator[None]:
    """While open, draws from Python's `random`, NumPy's global generator and TensorFlow's eager
    op-seed sequence are undone on exit. Eager; yields nothing.

    Each random op built eagerly without an op seed under a global seed (a `shuffle(n)` after
    `tf.random.set_seed`) takes the next number of the eager context's private `random.Random`,
    `context.context()._rng` (absent until a global seed is set), derived from
    `context.context()._seed`; both are put back.
    """
    ctx = eager_context.context()
    python_state, numpy_state = random.getstate(), np.random.get_state()
    seed, rng = ctx._seed, getattr(ctx, "_rng", None)  # noqa: SLF001
    rng_state = None if rng is None else rng.getstate()
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        ctx._seed = seed  # noqa: SLF001
        if rng is not None:
            ctx._rng = rng  # noqa: SLF001
            rng.setstate(rng_state)
        elif hasattr(ctx, "_rng"):
            del ctx._rng  # noqa: SLF001


@contextlib.contextmanager
def custom_gradients_released() -> Iterator[None]:
    """While open, the custom gradients TensorFlow registers are noted, and on leaving they are
    removed from its gradient registry (`ops._gradient_registry._registry`). Eager; yields
    nothing.

    `ReplicaContext.all_reduce` is a `tf.custom_gradient`, registered under a new name each time
    a step traces on several replicas, and the entry holds the step's whole graph: without
    this, runs made one after another in one process (a sweep, a notebook) keep every earlier
    run's step graphs. A run's graphs are not differentiated after it ends.
    """
    registry = ops._gradient_registry._registry  # noqa: SLF001
    before = set(registry)
    try:
        yield
    finally:
        for name in [n for n in registry if n.startswith("CustomGradient-") and n not in before]:
            del registry[name]
