"""Ray Train as orbitask's engine: `run_on_ray` runs the usual binary on Ray's workers.

    import orbitask
    orbitask.run_on_ray(
        ["--gin_file=experiments/digits.gin", "--model_dir=/shared/runs/digits"], workers=2
    )

Ray Train's `TensorflowTrainer` starts `workers` Ray workers and sets `TF_CONFIG` in each; each
Ray worker runs the orbitask binary (`orbitask.trainers.commands.train.main`) in its process with
the given flags under `multi_worker_mirrored`, as `orbitask launch`'s processes do. A worker
that dies (SIGKILL, a lost node) fails the attempt; Ray's `FailureConfig(max_failures)` starts
every worker again and the binary resumes from the model directory, exactly with `seed`. The
model directory must be one that every worker reaches (a shared disk or object storage) on a
cluster of several machines.

Each row the chief logs (train logs, evaluations) goes to Ray with `ray.train.report` (the
`'ray'` logger, `ray_logger`): the chief's binary writes it to a pipe, and every worker reports
it, since Ray Train takes a report only when each worker makes it. Relative paths in the flags
are the driver's working directory's, where a worker has that folder.

With no `address` and no Ray started in this process, a local Ray cluster is started on this
machine, listening on its loopback only: its node address is 127.0.0.1, it has no dashboard, and
this process first moves into a network namespace of its own whose only interface is loopback
(`network.loopback_only`, as `orbitask launch` does), since TensorFlow's workers listen on every
interface, unauthenticated. `pip install 'orbitask[ray]'`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import sys
import threading
from typing import Any

from orbitask.trainers.errors import ConfigError

REPORTS_FD = "ORBITASK_RAY_REPORTS_FD"  # the pipe a worker's binary writes its rows to
_END = "end"  # what rank 0 broadcasts when its binary's pipe closes


def import_ray() -> Any:
    """Ray Train, imported. Eager.

    Raises:
      ConfigError: when Ray is not installed (naming the pip command).
    """
    try:
        import ray
        import ray.train.tensorflow  # noqa: F401 -- the TensorflowTrainer
    except ImportError as e:
        raise ConfigError(
            f"running on Ray needs Ray Train: pip install 'orbitask[ray]' ({e})"
        ) from None
    return ray


def run_on_ray(
    train_argv: list[str],
    workers: int = 2,
    *,
    address: str | None = None,
    max_failures: int = 0,
    storage_path: str | None = None,
    allow_open_ports: bool = False,
    temp_dir: str | None = None,
) -> Any:
    """Runs the orbitask binary with `train_argv` on `workers` Ray Train workers (module
    docstring); eager, returns when the run ends.

    Args:
      train_argv: the binary's flags (`--gin_file=...`, `--model_dir=...`, `--gin_params=...`).
      workers: Ray workers, one TensorFlow worker each.
      address: a Ray cluster's address (`ray://HOST:10001`, `HOST:6379`, `auto`); None: the Ray
        already started in this process, else a local cluster on loopback.
      max_failures: how many times Ray starts the workers again after a failure.
      storage_path: where Ray keeps the run's own records (default: Ray's, `~/ray_results`).
      allow_open_ports: a local cluster on this machine's network, not in a namespace.
      temp_dir: a local cluster's temporary folder (default: Ray's, `/tmp/ray`).

    Returns:
      Ray Train's `Result` of the run (`path`: where Ray keeps its records).

    Raises:
      ConfigError: Ray not installed, or no loopback-only namespace for a local cluster.
      ray.train.TrainingFailedError: the run failed more than `max_failures` times.
    """
    if importlib.util.find_spec("ray") is None:
        raise ConfigError("running on Ray needs Ray Train: pip install 'orbitask[ray]'")
    started = "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
    if started and address is None and not allow_open_ports:
        _isolate()  # before Ray's threads and processes start: they all stay in it
    ray = import_ray()
    if started:
        ray.init(**_init_arguments(address, workers, temp_dir))
    try:
        return _trainer(train_argv, workers, max_failures, storage_path).fit()
    finally:
        if started:
            ray.shutdown()


def _isolate() -> None:
    """This process, and what it starts, into a loopback-only network namespace.

    Raises:
      ConfigError: when the kernel refuses one (one line: what to do).
    """
    from orbitask.trainers.commands.network import loopback_only

    try:
        loopback_only()
    except OSError as e:
        raise ConfigError(
            f"cannot give the local Ray cluster a loopback-only network namespace "
            f"({e.strerror or e}), and TensorFlow's workers listen on every interface, "
            "unauthenticated. Run as root or where user namespaces are allowed, or pass "
            "--allow_open_ports (allow_open_ports=True) to run on this machine's network."
        ) from None


def _init_arguments(address, workers, temp_dir) -> dict:
    """`ray.init`'s arguments: a cluster's address, or a local cluster on loopback."""
    if address is not None:
        return {"address": address}
    local = dict(_node_ip_address="127.0.0.1", include_dashboard=False)
    local["runtime_env"] = {
        "env_vars": {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"},  # a cloud's spot notices
        "worker_process_setup_hook": "orbitask.trainers.commands.ray_train.quiet_cleaner",
    }
    local["num_cpus"] = max(os.cpu_count() or 1, workers)  # a worker takes one CPU
    if temp_dir is not None:
        local["_temp_dir"] = temp_dir
    return local


def quiet_cleaner() -> None:
    """Each process of a local cluster: Ray Train's placement group cleaner says nothing below
    an error. It asks Ray's state API, served by the dashboard, whether the run's controller
    lives, and a cluster without a dashboard would have it warn each second. Eager."""
    import logging

    name = "ray.train.v2._internal.execution.controller.placement_group_cleaner"
    logging.getLogger(name).setLevel(logging.ERROR)


def _trainer(train_argv, workers, max_failures, storage_path) -> Any:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    keep = {k: os.environ[k] for k in ("TF_USE_LEGACY_KERAS",) if k in os.environ}
    return TensorflowTrainer(
        _worker,
        train_loop_config={"argv": list(train_argv), "env": keep, "cwd": os.getcwd()},
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=False),
        run_config=RunConfig(
            name=_name(train_argv),
            storage_path=storage_path,
            failure_config=FailureConfig(max_failures=max_failures),
        ),
    )


def _name(train_argv: list[str]) -> str:
    """The Ray run's name: the model directory's last part (`--model_dir=runs/digits`)."""
    for flag in train_argv:
        if flag.startswith("--model_dir="):
            return os.path.basename(flag.partition("=")[2].rstrip("/")) or "orbitask"
    return "orbitask"


def _worker(config: dict) -> None:
    """One Ray worker: the binary, in this process, under the `TF_CONFIG` Ray set; its rows
    reported. Eager.

    Raises:
      RuntimeError: when the binary exits with a status other than 0 (Ray stops the other
        workers and starts them all again, while `max_failures` allows).
    """
    import ray.train

    from orbitask.trainers.commands import train

    os.environ.pop("TF_USE_LEGACY_KERAS", None)  # Ray Train sets it; the driver's choice stands
    os.environ.update(config["env"])
    if os.path.isdir(config["cwd"]):  # relative paths are the driver's, where it has a disk here
        os.chdir(config["cwd"])
    read, write = os.pipe()
    os.environ[REPORTS_FD] = str(write)
    rank = ray.train.get_context().get_world_rank()
    relay = threading.Thread(target=_relay, args=(read, rank), daemon=True)
    relay.start()
    strategy = "--gin_params=orbitask.run_experiment.strategy = 'multi_worker_mirrored'"
    try:
        status = train.main([*config["argv"], strategy])
    finally:
        os.close(write)  # rank 0's relay reads to the end, then every worker's relay stops
    if status != 0:
        raise RuntimeError(f"the orbitask binary on Ray worker {rank} exited with status {status}")
    relay.join()


def _relay(read: int, rank: int) -> None:
    """Rank 0 reads its binary's rows; every worker reports each one (Ray takes a report only
    when every worker makes it) until rank 0's pipe closes. Eager."""
    import ray.train
    from ray.train.collective import broadcast_from_rank_zero

    rows: queue.Queue = queue.Queue()
    with os.fdopen(read) as pipe:
        if rank == 0:
            threading.Thread(target=_read_rows, args=(pipe, rows), daemon=True).start()
        while True:
            row = broadcast_from_rank_zero(rows.get() if rank == 0 else None)
            if row == _END:
                return
            ray.train.report(row)


def _read_rows(pipe, rows: queue.Queue) -> None:
    for line in pipe:
        if line.endswith("\n"):  # a line cut short by a kill is not a row
            rows.put(json.loads(line))
    rows.put(_END)
