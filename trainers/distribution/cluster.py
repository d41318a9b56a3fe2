"""Cluster roles from TF_CONFIG: the chief, agreement between workers, parameter-server tasks.

Multi-worker rules:

- Every worker calls save: reading a SyncOnRead variable is a collective, so a save on the chief
  alone deadlocks. Non-chief workers save into their own temporary folder (one checkpoint kept,
  removed when the process exits; `trainers.state.checkpoint_manager`); only the chief's
  checkpoints, in the model directory, count.
- Every worker restores from the chief's checkpoints, so the model directory must be storage
  that every machine reads (GCS, NFS, ...). Each worker restores its own input position
  (`trainers.state.input_position`).
- Only the chief writes summaries and the operative config.

Under `parameter_server`, the chief is the coordinator that runs the program; `worker` and `ps`
tasks only serve TensorFlow's runtime (`serve`) until the job stops them.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Sequence

import tensorflow as tf

from orbitask.trainers import compat

SERVER_TASKS = ("worker", "ps")


def tf_config() -> dict:
    """TF_CONFIG parsed (`{}` when unset)."""
    return json.loads(os.environ.get("TF_CONFIG") or "{}")


def task_type() -> str | None:
    """This process's task type in TF_CONFIG ("chief", "worker", "ps", ...), or None."""
    return tf_config().get("task", {}).get("type")


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True on the process whose checkpoints, summaries and config are kept (one machine: True)."""
    return bool(strategy.extended.should_checkpoint)


def describe(strategy: tf.distribute.Strategy) -> str:
    """One line naming the strategy, its replicas and their devices. Eager; returns it."""
    replicas = strategy.num_replicas_in_sync
    devices = ", ".join(d.split("/device:")[-1] for d in strategy.extended.worker_devices)
    where = f"this worker: {devices}" if task_type() else devices
    plural = "s" if replicas != 1 else ""
    return f"{type(strategy).__name__}, {replicas} replica{plural} ({where})"


def is_parameter_server(strategy: tf.distribute.Strategy) -> bool:
    """True for a `ParameterServerStrategy` (trained by `trainers.engine.ps_trainer`)."""
    return isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)


def num_ps_workers(strategy: tf.distribute.Strategy) -> int:
    """The number of workers a `ParameterServerStrategy` schedules on."""
    return compat.ps_num_workers(strategy)


def all_replica_values(strategy: tf.distribute.Strategy, value) -> tuple:
    """`value`'s per-replica values as a tuple, of every worker's replicas (traced, cross-replica).

    One machine: the local values. `multi_worker_mirrored`: a gather (a collective), so that every
    worker, the chief included, aggregates the eval logs of all replicas: a scalar gives one
    value per replica; a tensor gives one concatenation of all replicas' along axis 0.
    """
    local = strategy.experimental_local_results(value)
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return local
    if local[0].shape.rank == 0:
        rows = strategy.run(lambda v: tf.expand_dims(v, 0), args=(value,))
        return tuple(tf.unstack(strategy.gather(rows, axis=0), num=strategy.num_replicas_in_sync))
    return (strategy.gather(value, axis=0),)


def every_worker(strategy: tf.distribute.Strategy, flag: bool) -> bool:
    """Whether `flag` holds on every worker. Eager; under `multi_worker_mirrored` a collective
    (every worker must call it at the same point), else `flag` itself."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return flag
    return _replicas_with(strategy, flag) == strategy.num_replicas_in_sync


def smallest(strategy: tf.distribute.Strategy, value: int) -> int:
    """The smallest of every worker's `value`. Eager; under `multi_worker_mirrored` a collective
    as in `every_worker`, else `value` itself."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return value
    values = strategy.experimental_distribute_values_from_function(
        lambda _: tf.constant([value], tf.int64)
    )
    return int(tf.reduce_min(strategy.gather(values, axis=0)))


def agreement(strategy: tf.distribute.Strategy) -> Callable[[list], list[int]] | None:
    """`Schedule.agree` for `strategy`: with several `multi_worker_mirrored` workers,
    `largest_each` on it (a collective); else None (a process decides alone)."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return None
    if not strategy.cluster_resolver.cluster_spec().jobs:
        return None
    return functools.partial(largest_each, strategy)


def signal_agreement(
    strategy: tf.distribute.Strategy, bound: int | None = None
) -> Callable[[int], int] | None:
    """`PreemptionWatcher.agree` for `strategy`: with several `multi_worker_mirrored` workers,
    the largest of every worker's code, an int in [0, bound) (`PreemptionWatcher.codes`: 0
    none, then a spent `max_time`, then the stop signals; None: the default signals' codes,
    `actions.preemption.CODES`; `largest_each`); else None."""
    from orbitask.trainers.actions.preemption import CODES

    agree, bound = agreement(strategy), bound or len(CODES)
    return None if agree is None else lambda code: agree([(code, bound)])[0]


def largest_each(strategy: tf.distribute.Strategy, votes: Sequence[tuple[int, int]]) -> list[int]:
    """For each `(value, bound)` of `votes`, the largest of every replica's `value`, an int in
    [0, bound). Eager; one SUM all-reduce of each vote's `bound - 1` flags (`value >= 1`,
    `value >= 2`, ...), under `multi_worker_mirrored` a collective as in `every_worker` (a
    gather would trace a new function at every call: tens of ms after each device loop).
    Returns the list."""
    if not votes:
        return []
    flags = [int(value >= v) for value, bound in votes for v in range(1, bound)]
    per_replica = strategy.experimental_distribute_values_from_function(
        lambda _: tf.constant(flags, tf.int32)
    )
    counts = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None).numpy() > 0
    agreed, first = [], 0
    for _, bound in votes:  # every replica's flags of a vote are 1s, then 0s
        agreed.append(int(counts[first : first + bound - 1].sum()))
        first += bound - 1
    return agreed


def _replicas_with(strategy: tf.distribute.Strategy, flag: bool) -> int:
    flags = strategy.experimental_distribute_values_from_function(lambda _: tf.constant(int(flag)))
    return int(strategy.reduce(tf.distribute.ReduceOp.SUM, flags, axis=None))


def is_server_task(strategy_name: object) -> bool:
    """True for a `worker` or `ps` task of a `parameter_server` job: it only serves (`serve`)."""
    return strategy_name == "parameter_server" and task_type() in SERVER_TASKS


def serve() -> dict:
    """Runs this worker / ps task's TensorFlow server; blocks until the process is stopped. Eager.

    The coordinator (the chief) sends these servers the functions and variables to run and hold.
    """
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")  # TF's advice for PS fault tolerance
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    print(f"orbitask: {resolver.task_type} {resolver.task_id} serving at {server.target}")
    server.join()
    return {}
