"""Where a job runs, read from its platform's environment: one resolver each for Vertex AI,
Kubernetes (an Indexed Job or JobSet), SageMaker and SLURM, chosen by `detect` (the first whose
variables are set), which says which in one line.

Each returns a `Placement`: the cluster as TF_CONFIG (written into the environment when none is
set, so that everything reading the cluster reads it alike), the model directory used when no
`--model_dir` is given, where the final SavedModel is copied, and where summaries go.

- Vertex AI (`CLUSTER_SPEC`, or `TF_CONFIG` as Vertex sets it): worker pools 0-3 are the chief,
  the workers, the parameter servers and the evaluator. The evaluator, outside the training
  cluster, runs `continuous_eval` on one machine. `AIP_CHECKPOINT_DIR` is the model directory;
  TensorBoard's `train/` and `eval/` go under `AIP_TENSORBOARD_LOG_DIR`; the final SavedModel
  is copied into `AIP_MODEL_DIR`.
- Kubernetes: `JOB_COMPLETION_INDEX` (set by an Indexed Job) and `ORBITASK_WORKERS` (the
  job's completions; without it an Indexed Job's pods are separate runs, a sweep): worker i is
  `<job>-<i>.<ORBITASK_SERVICE>` (the pods' hostnames `<job>-<index>`, the headless Service
  that is their subdomain), port `ORBITASK_PORT` (default 2222) + i.
- SageMaker: `SM_HOSTS` and `SM_CURRENT_HOST`; several hosts are the workers, in `SM_HOSTS`'s
  order, port `ORBITASK_PORT` (default 2222) + the host's index. `/opt/ml/checkpoints` (synced
  to S3) is the model directory; the final SavedModel is copied to `SM_MODEL_DIR/<step>`.
- SLURM: `distribution.slurm`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from collections.abc import Callable, Mapping

PORT_ENV = "ORBITASK_PORT"
VERTEX_ROLES = {"workerpool0": "chief", "workerpool1": "worker", "workerpool2": "ps",
                "workerpool3": "evaluator"}  # fmt: skip
SAGEMAKER_CHECKPOINTS = "/opt/ml/checkpoints"


@dataclasses.dataclass(frozen=True)
class Placement:
    """A job's place, from its platform's environment.

    Attributes:
      platform: "Vertex AI", "Kubernetes", "SageMaker" or "SLURM".
      tf_config: the cluster and this task, or None (one machine).
      model_dir: the model directory when no --model_dir is given, or None.
      export_dir: the final SavedModel is copied here (`deliver`), or None.
      summary_dir: TensorBoard's `train/` and `eval/` go under it (`run_experiment`'s
        `summary_dir`; an evaluator's `eval/` too), or None.
      evaluator: this task evaluates the others' checkpoints (`continuous_eval`, one machine).
    """

    platform: str
    tf_config: dict | None = None
    model_dir: str | None = None
    export_dir: str | None = None
    summary_dir: str | None = None
    evaluator: bool = False

    def bindings(self) -> list[str]:
        """Gin bindings the platform asks for, before the user's: a SavedModel at the end of
        training where it has an `export_dir`."""
        return ["orbitask.run_experiment.export_at_end = True"] if self.export_dir else []

    def describe(self) -> str:
        """One line saying where the job runs and where its folders are."""
        task = (self.tf_config or {}).get("task", {})
        role = f"{task['type']} {task['index']}" if task else "one machine"
        role = "evaluator" if self.evaluator else role
        model = f", model directory {self.model_dir}" if self.model_dir else ""
        logs = f", TensorBoard summaries {self.summary_dir}" if self.summary_dir else ""
        return f"orbitask: on {self.platform}: {role}{model}{logs}"


def _port(env: Mapping[str, str], index: int) -> int:
    return int(env.get(PORT_ENV) or "2222") + index


def vertex(env: Mapping[str, str]) -> Placement | None:
    """Vertex AI's custom job: `CLUSTER_SPEC` (or its `TF_CONFIG`) and the `AIP_*` folders."""
    if not (env.get("CLUSTER_SPEC") or env.get("AIP_MODEL_DIR") or env.get("AIP_CHECKPOINT_DIR")):
        return None
    config = json.loads(env.get("TF_CONFIG") or "{}") or _tf_config_of(env.get("CLUSTER_SPEC"))
    task = config.get("task", {})
    evaluator = task.get("type") == "evaluator"
    cluster = {k: v for k, v in config.get("cluster", {}).items() if k != "evaluator"}
    several = sum(len(v) for v in cluster.values()) > 1
    return Placement(
        "Vertex AI",
        tf_config={"cluster": cluster, "task": task} if several and not evaluator else None,
        model_dir=env.get("AIP_CHECKPOINT_DIR"),
        export_dir=env.get("AIP_MODEL_DIR"),
        summary_dir=env.get("AIP_TENSORBOARD_LOG_DIR"),
        evaluator=evaluator,
    )


def _tf_config_of(cluster_spec: str | None) -> dict:
    """TF_CONFIG's cluster and task from Vertex's `CLUSTER_SPEC` (worker pools renamed)."""
    spec = json.loads(cluster_spec or "{}")
    cluster = {VERTEX_ROLES[k]: v for k, v in spec.get("cluster", {}).items() if k in VERTEX_ROLES}
    task = spec.get("task", {})
    if task.get("type") in VERTEX_ROLES:
        task = {"type": VERTEX_ROLES[task["type"]], "index": int(task.get("index", 0))}
    return {"cluster": cluster, "task": task}


def kubernetes(env: Mapping[str, str]) -> Placement | None:
    """An Indexed Job's (or JobSet's) pod: `JOB_COMPLETION_INDEX`, `ORBITASK_WORKERS`."""
    index, workers = env.get("JOB_COMPLETION_INDEX"), env.get("ORBITASK_WORKERS")
    if index is None or not workers:
        return None
    host = env.get("HOSTNAME") or socket.gethostname()
    prefix, _, own = host.rpartition("-")
    if own != index:
        raise ValueError(
            f"the pod's hostname {host!r} does not end in -{index} (JOB_COMPLETION_INDEX); "
            "run it as an Indexed Job (completionMode: Indexed) or unset ORBITASK_WORKERS."
        )
    service = f".{env['ORBITASK_SERVICE']}" if env.get("ORBITASK_SERVICE") else ""
    hosts = [f"{prefix}-{i}{service}:{_port(env, i)}" for i in range(int(workers))]
    config = {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": int(index)}}
    return Placement("Kubernetes", tf_config=config if len(hosts) > 1 else None)


def sagemaker(env: Mapping[str, str]) -> Placement | None:
    """A SageMaker training job: `SM_HOSTS`, `SM_CURRENT_HOST`, `SM_MODEL_DIR`."""
    if not (env.get("SM_HOSTS") and env.get("SM_CURRENT_HOST")):
        return None
    hosts, current = json.loads(env["SM_HOSTS"]), env["SM_CURRENT_HOST"]
    workers = [f"{h}:{_port(env, i)}" for i, h in enumerate(hosts)]
    task = {"type": "worker", "index": hosts.index(current)}
    return Placement(
        "SageMaker",
        tf_config={"cluster": {"worker": workers}, "task": task} if len(hosts) > 1 else None,
        model_dir=SAGEMAKER_CHECKPOINTS,
        export_dir=os.path.join(env["SM_MODEL_DIR"], "{step}") if env.get("SM_MODEL_DIR") else None,
    )


def slurm(env: Mapping[str, str]) -> Placement | None:
    """A SLURM job step (`distribution.slurm`)."""
    from orbitask.trainers.distribution import slurm as slurm_env

    if not all(env.get(name) for name in slurm_env.NEEDED):
        return None
    return Placement("SLURM", tf_config=slurm_env.tf_config())


RESOLVERS: tuple[Callable[[Mapping[str, str]], Placement | None], ...] = (
    vertex,
    kubernetes,
    sagemaker,
    slurm,
)


def detect(env: Mapping[str, str] | None = None) -> Placement | None:
    """The first resolver's `Placement` for `env` (default: this process's), or None. Eager."""
    env = os.environ if env is None else env
    for resolve in RESOLVERS:
        placement = resolve(env)
        if placement is not None:
            return placement
    return None


def use_cluster() -> Placement | None:
    """Sets TF_CONFIG from the detected platform's cluster when it is unset. Eager, before a
    multi-worker strategy is built; returns the placement whose cluster it wrote, or None."""
    if os.environ.get("TF_CONFIG"):
        return None
    placement = detect()
    if placement is None or placement.tf_config is None:
        return None
    os.environ["TF_CONFIG"] = json.dumps(placement.tf_config)
    print(f"orbitask: TF_CONFIG from {placement.platform}: {os.environ['TF_CONFIG']}", flush=True)
    return placement


def deliver(placement: Placement | None, results: dict) -> str | None:
    """Copies the run's final SavedModel (`results["export"]`, the chief's) into the platform's
    `export_dir` (`{step}`: the export's step). Eager; returns the copy's folder, or None."""
    source = (results or {}).get("export")
    if placement is None or not placement.export_dir or not source:
        return None
    import tensorflow as tf

    from orbitask.common import files

    target = placement.export_dir.format(step=os.path.basename(source.rstrip("/")))
    for folder, _, names in tf.io.gfile.walk(source):
        into = os.path.join(target, os.path.relpath(folder, source))
        files.makedirs(into)
        for name in names:
            tf.io.gfile.copy(os.path.join(folder, name), os.path.join(into, name), overwrite=True)
    print(f"orbitask: SavedModel copied to {target} ({placement.platform})", flush=True)
    return target
