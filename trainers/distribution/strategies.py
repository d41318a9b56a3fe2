"""Builds a `tf.distribute.Strategy` from its gin name."""

from __future__ import annotations

import tensorflow as tf

from orbitask.trainers import compat
from orbitask.trainers.distribution import platforms
from orbitask.trainers.errors import ConfigError

NAMES = ("auto", "one_device", "mirrored", "multi_worker_mirrored", "parameter_server")


def build_strategy(strategy: str | tf.distribute.Strategy = "auto") -> tf.distribute.Strategy:
    """Returns the strategy named by `strategy`, or `strategy` itself if it is one. Eager.

    `auto`: MirroredStrategy over all GPUs when there are several, else one device (GPU or CPU).
    `mirrored`: all GPUs, else all logical CPU devices (`trainers.logical_cpus`;
    `official.common.distribute_utils` would ignore logical CPUs). `one_device`: the first GPU,
    else the CPU. `multi_worker_mirrored` reads TF_CONFIG, or the cluster of the platform it
    runs on (`trainers.distribution.platforms`: Vertex AI, Kubernetes, SageMaker, SLURM). A
    `MirroredStrategy`, given or built, gets collective keys no other strategy in the process
    uses (`compat.own_collective_keys`).

    Raises:
      ConfigError: for an unknown name, or parameter_server without a cluster in TF_CONFIG.
    """
    built = strategy if isinstance(strategy, tf.distribute.Strategy) else _build(strategy)
    compat.own_collective_keys(built)  # a MirroredStrategy numbers its collectives apart
    return built


def _build(strategy: str) -> tf.distribute.Strategy:
    """The strategy of that name (`build_strategy`)."""
    if strategy not in NAMES:
        raise ConfigError(
            f"`strategy` must be a tf.distribute.Strategy or one of {', '.join(NAMES)}; "
            f"received {strategy!r}. Set run_experiment.strategy in your .gin file."
        )
    # Multi-worker strategies must configure collectives before anything initialises TensorFlow.
    if strategy == "multi_worker_mirrored":
        platforms.use_cluster()  # without TF_CONFIG: from Vertex AI, Kubernetes, SageMaker, SLURM
        return tf.distribute.MultiWorkerMirroredStrategy()
    if strategy == "parameter_server":
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        if not resolver.cluster_spec().as_dict():
            raise ConfigError(
                "strategy 'parameter_server' needs a cluster (chief, workers, ps) in TF_CONFIG, "
                "which is not set; start the job with `orbitask launch --ps 1 ...` or set "
                "TF_CONFIG on every machine (README: Several machines)."
            )
        return tf.distribute.experimental.ParameterServerStrategy(resolver)
    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    if strategy == "auto":
        return tf.distribute.MirroredStrategy(gpus) if len(gpus) > 1 else _one_device(gpus, cpus)
    if strategy == "one_device":
        return _one_device(gpus, cpus)
    devices = gpus or cpus  # "mirrored"
    if len(devices) == 1:
        return tf.distribute.MirroredStrategy(devices)
    return tf.distribute.MirroredStrategy(
        devices, cross_device_ops=None if gpus else tf.distribute.ReductionToOneDevice()
    )


def _one_device(gpus: list[str], cpus: list[str]) -> tf.distribute.Strategy:
    return tf.distribute.OneDeviceStrategy(gpus[0] if gpus else cpus[0])


def logical_cpus(n: int) -> list[str]:
    """Splits the CPU into `n` logical devices (before TF initialises) and returns their names.

    Eager; call it before anything else uses TensorFlow (later calls keep what exists). For tests
    and users without GPUs: `mirrored` then gives `n` replicas.
    """
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
        )
    except RuntimeError:
        pass  # Already initialised: keep what exists.
    return [d.name for d in tf.config.list_logical_devices("CPU")]
