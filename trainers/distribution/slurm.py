"""SLURM: the multi-worker cluster from SLURM's environment, with no hand-written TF_CONFIG.

Under `srun` (one task per worker), `strategy = 'multi_worker_mirrored'` without TF_CONFIG builds
the cluster with TensorFlow's `SlurmClusterResolver` from `SLURM_PROCID`,
`SLURM_STEP_NUM_TASKS`, `SLURM_STEP_NODELIST` and `SLURM_STEP_TASKS_PER_NODE`: one `worker` per
task, task 0 the chief, ports from `ORBITASK_SLURM_PORT` (default 8888) up on each node. It is
written into TF_CONFIG (`platforms.use_cluster`), so everything that reads the cluster reads it
the same way. On nodes
with `nvidia-smi` each task gets its share of the node's GPUs (`CUDA_VISIBLE_DEVICES`).

With `run_experiment.requeue = True`, a run stopped by a stop signal or its `max_time` asks SLURM
to requeue the job after its save (`requeue`: `scontrol requeue $SLURM_JOB_ID`, from task 0).
"""

from __future__ import annotations

import os
import shutil
import subprocess

from absl import logging

PORT_ENV = "ORBITASK_SLURM_PORT"
NEEDED = (
    "SLURM_PROCID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE",
)


def tf_config() -> dict | None:
    """Returns the TF_CONFIG of this SLURM task, or None outside a SLURM job step. Eager."""
    if not all(os.environ.get(name) for name in NEEDED):
        return None
    import tensorflow as tf

    gpus = shutil.which("nvidia-smi") is not None
    kwargs = {} if gpus else dict(gpus_per_node=1024, gpus_per_task=1, auto_set_gpu=False)
    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
        port_base=int(os.environ.get(PORT_ENV, "8888")), **kwargs
    )
    spec = resolver.cluster_spec().as_dict()
    return {"cluster": spec, "task": {"type": resolver.task_type, "index": resolver.task_id}}


def requeue() -> str:
    """Asks SLURM to requeue this job (`scontrol requeue $SLURM_JOB_ID`), from task 0 alone
    (`SLURM_PROCID` 0 or unset). Eager; returns the sentence that ends the stop's line ("" on
    the other tasks)."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return "Not requeued: SLURM_JOB_ID is unset (requeue acts under SLURM)."
    if os.environ.get("SLURM_PROCID", "0") != "0":
        return ""
    command = f"scontrol requeue {job}"
    try:
        done = subprocess.run(command.split(), capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"SLURM job {job} not requeued: `{command}` failed ({e})."
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [""])[-1]
        return f"SLURM job {job} not requeued: `{command}` exited {done.returncode}: {why}"
    logging.info("requeued SLURM job %s", job)
    return f"SLURM job {job} requeued (`{command}`)."
