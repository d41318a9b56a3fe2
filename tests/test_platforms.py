"""Where a job runs (`trainers.distribution.platforms`): each platform's resolver reads the
environment its jobs set, recorded here from the platform's documentation (source in each
comment), and gives the cluster as TF_CONFIG, the default model directory, where TensorBoard's
summaries go and where the final SavedModel goes. The slow tests run a Vertex AI job's two
replicas and a SageMaker job's two hosts on this machine end to end."""

import contextlib
import io
import json
import os
import socket
import subprocess

import pytest
import tensorflow as tf

from orbitask.trainers.distribution import platforms
from tests import faults, launching

# https://cloud.google.com/vertex-ai/docs/training/distributed-training ("CLUSTER_SPEC"): a
# custom container's CLUSTER_SPEC, worker pools 0-3 (primary, workers, parameter servers,
# evaluators), here on the primary replica of a job with 1 + 2 + 0 + 1 replicas.
VERTEX_CLUSTER_SPEC = {
    "cluster": {
        "workerpool0": ["cmle-training-workerpool0-ab-0:2222"],
        "workerpool1": [
            "cmle-training-workerpool1-ab-0:2222",
            "cmle-training-workerpool1-ab-1:2222",
        ],
        "workerpool3": ["cmle-training-workerpool3-ab-0:2222"],
    },
    "environment": "cloud",
    "task": {"type": "workerpool0", "index": 0, "trial": "TRIAL_ID"},
    "job": {},
}
# https://cloud.google.com/ai-platform/training/docs/distributed-training-details ("The format
# of TF_CONFIG", its example, `job` hidden): the cluster has no `evaluator` key; the evaluator's
# task type is `evaluator`.
VERTEX_TF_CONFIG = {
    "cluster": {
        "chief": ["cmle-training-chief-[ID_STRING_1]-0:2222"],
        "ps": ["cmle-training-ps-[ID_STRING_1]-0:2222"],
        "worker": [
            "cmle-training-worker-[ID_STRING_1]-0:2222",
            "cmle-training-worker-[ID_STRING_1]-1:2222",
        ],
    },
    "environment": "cloud",
    "task": {"cloud": "[ID_STRING_2]", "index": 0, "trial": "1", "type": "worker"},
}
VERTEX_FOLDERS = {  # https://cloud.google.com/vertex-ai/docs/training/code-requirements
    "AIP_MODEL_DIR": "gs://bucket/job/model/",
    "AIP_CHECKPOINT_DIR": "gs://bucket/job/checkpoints/",
    "AIP_TENSORBOARD_LOG_DIR": "gs://bucket/job/logs/",
}
# https://kubernetes.io/docs/tasks/job/indexed-parallel-processing-static: the control plane
# sets JOB_COMPLETION_INDEX; https://kubernetes.io/docs/tasks/job/job-with-pod-to-pod-communication/:
# an Indexed Job's pods are named `${jobName}-${completionIndex}` (there: `example-job`, with
# the headless Service `headless-svc` as their subdomain).
KUBERNETES = {"JOB_COMPLETION_INDEX": "1", "HOSTNAME": "example-job-1"}
# https://github.com/aws/sagemaker-training-toolkit/blob/master/ENVIRONMENT_VARIABLES.md
SAGEMAKER = {
    "SM_HOSTS": '["algo-1","algo-2"]',
    "SM_CURRENT_HOST": "algo-2",
    "SM_MODEL_DIR": "/opt/ml/model",
}


def test_vertex_cluster_spec_names_the_roles_and_the_folders():
    env = {"CLUSTER_SPEC": json.dumps(VERTEX_CLUSTER_SPEC), **VERTEX_FOLDERS}
    placement = platforms.detect(env)
    assert placement.platform == "Vertex AI" and not placement.evaluator
    assert placement.tf_config == {
        "cluster": {
            "chief": ["cmle-training-workerpool0-ab-0:2222"],
            "worker": [
                "cmle-training-workerpool1-ab-0:2222",
                "cmle-training-workerpool1-ab-1:2222",
            ],
        },
        "task": {"type": "chief", "index": 0},
    }
    assert placement.model_dir == "gs://bucket/job/checkpoints/"
    assert placement.export_dir == "gs://bucket/job/model/"
    assert placement.bindings() == ["orbitask.run_experiment.export_at_end = True"]
    evaluator = dict(VERTEX_CLUSTER_SPEC, task={"type": "workerpool3", "index": 0})
    placement = platforms.detect({"CLUSTER_SPEC": json.dumps(evaluator), **VERTEX_FOLDERS})
    assert placement.evaluator and placement.tf_config is None
    assert placement.summary_dir == "gs://bucket/job/logs/"


def test_vertex_tf_config_is_read_as_vertex_sets_it():
    env = {"TF_CONFIG": json.dumps(VERTEX_TF_CONFIG), "CLUSTER_SPEC": "{}", **VERTEX_FOLDERS}
    placement = platforms.detect(env)
    assert placement.tf_config["task"]["type"] == "worker"
    assert placement.tf_config["cluster"] == VERTEX_TF_CONFIG["cluster"]
    evaluator = dict(VERTEX_TF_CONFIG, task={"type": "evaluator", "index": 0})
    env["TF_CONFIG"] = json.dumps(evaluator)
    assert platforms.detect(env).evaluator


def test_a_kubernetes_indexed_job_builds_the_cluster_from_its_hostnames():
    env = {**KUBERNETES, "ORBITASK_WORKERS": "3", "ORBITASK_SERVICE": "headless-svc"}
    placement = platforms.detect(env)
    assert placement.platform == "Kubernetes"
    assert placement.tf_config == {
        "cluster": {
            "worker": [
                "example-job-0.headless-svc:2222",
                "example-job-1.headless-svc:2223",
                "example-job-2.headless-svc:2224",
            ]
        },
        "task": {"type": "worker", "index": 1},
    }
    assert platforms.detect(KUBERNETES) is None  # without ORBITASK_WORKERS: a sweep's pod
    with pytest.raises(ValueError, match="hostname 'other-7' does not end in -1"):
        platforms.detect({**env, "HOSTNAME": "other-7"})


def test_sagemaker_hosts_are_the_workers_and_its_folders_the_model_dirs():
    placement = platforms.detect({**SAGEMAKER, "ORBITASK_PORT": "7000"})
    assert placement.platform == "SageMaker"
    assert placement.tf_config == {
        "cluster": {"worker": ["algo-1:7000", "algo-2:7001"]},
        "task": {"type": "worker", "index": 1},
    }
    assert placement.model_dir == "/opt/ml/checkpoints"
    assert placement.export_dir == "/opt/ml/model/{step}"
    one = platforms.detect({**SAGEMAKER, "SM_HOSTS": '["algo-2"]'})
    assert one.tf_config is None and one.model_dir == "/opt/ml/checkpoints"


def test_nothing_set_is_one_machine_and_the_final_savedmodel_is_copied(tmp_path):
    assert platforms.detect({}) is None
    source = tmp_path / "run" / "export" / "40"
    (source / "variables").mkdir(parents=True)
    (source / "saved_model.pb").write_bytes(b"pb")
    (source / "variables" / "variables.index").write_bytes(b"ix")
    placement = platforms.Placement("SageMaker", export_dir=str(tmp_path / "model" / "{step}"))
    copied = platforms.deliver(placement, {"export": str(source)})
    assert copied == str(tmp_path / "model" / "40")
    assert (tmp_path / "model" / "40" / "variables" / "variables.index").read_bytes() == b"ix"
    assert platforms.deliver(placement, {}) is None  # no export: a worker other than the chief


VERTEX_ONE_REPLICA = dict(  # a job of one primary replica: the spec above, pool 0 alone
    VERTEX_CLUSTER_SPEC, cluster={"workerpool0": VERTEX_CLUSTER_SPEC["cluster"]["workerpool0"]}
)
VERTEX_FLAGS = [f"--gin_file={faults.REPO / 'experiments' / 'digits.gin'}", "--mode=train"] + [
    f"--gin_params={p}"
    for p in ("TRAIN_STEPS=20", "orbitask.run_experiment.steps_per_loop=10",
              "orbitask.run_experiment.progress=False",
              "orbitask.DigitsClassification.hidden_units=(8,)")
]  # fmt: skip


@pytest.fixture(scope="module")
def vertex_job(tmp_path_factory):
    """In-process binary as Vertex AI starts a job of one replica: its CLUSTER_SPEC and the three
    AIP_* folders (local), no --model_dir, `--mode=train`; the run trains to step 20. Returns
    the folders and what the binary printed."""
    from orbitask.trainers.commands import train

    base = tmp_path_factory.mktemp("vertex")
    folders = {name: str(base / name.lower()) for name in VERTEX_FOLDERS}
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.delenv("TF_CONFIG", raising=False)
        monkeypatch.setenv("CLUSTER_SPEC", json.dumps(VERTEX_ONE_REPLICA))
        for name, folder in folders.items():
            monkeypatch.setenv(name, folder)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            # no SavedModel: its copy is the slow test's
            assert train.main([*VERTEX_FLAGS, "orbitask.run_experiment.export_at_end=False"]) == 0
    return folders, printed.getvalue()


def test_a_vertex_job_writes_its_tensorboard_summaries_into_the_tensorboard_folder(vertex_job):
    """TensorBoard's train/ goes under AIP_TENSORBOARD_LOG_DIR, nothing of it under the model
    directory (AIP_CHECKPOINT_DIR), which keeps the checkpoints and metrics.jsonl; the line
    naming the platform names both folders."""
    folders, printed = vertex_job
    checkpoints, logs = folders["AIP_CHECKPOINT_DIR"], folders["AIP_TENSORBOARD_LOG_DIR"]
    assert (
        f"orbitask: on Vertex AI: one machine, model directory {checkpoints}, "
        f"TensorBoard summaries {logs}"
    ) in printed
    assert f"TensorBoard: --logdir {logs}" in printed  # the run's last line
    assert launching.latest_step(checkpoints) == 20
    assert os.path.exists(os.path.join(checkpoints, "metrics.jsonl"))
    assert tf.io.gfile.glob(os.path.join(logs, "train", "events.out.tfevents.*"))
    assert not os.path.exists(os.path.join(checkpoints, "train"))


def test_a_vertex_evaluator_evaluates_into_the_tensorboard_folder(
    vertex_job, tmp_path, monkeypatch, capsys
):
    """The evaluator replica of a job (TF_CONFIG's task type `evaluator`, no --model_dir,
    --mode=train as the other pools) runs `continuous_eval` on one machine over the job's
    checkpoints, its eval/ summaries under AIP_TENSORBOARD_LOG_DIR."""
    from orbitask.trainers.commands import train

    checkpoints, logs = vertex_job[0]["AIP_CHECKPOINT_DIR"], tmp_path / "logs"
    evaluator = dict(VERTEX_TF_CONFIG, task={"type": "evaluator", "index": 0})
    monkeypatch.setenv("TF_CONFIG", json.dumps(evaluator))
    monkeypatch.setenv("AIP_CHECKPOINT_DIR", checkpoints)
    monkeypatch.setenv("AIP_TENSORBOARD_LOG_DIR", str(logs))
    assert train.main(VERTEX_FLAGS) == 0
    assert "orbitask: on Vertex AI: evaluator, model directory" in capsys.readouterr().out
    assert "TF_CONFIG" not in os.environ  # outside the training cluster: one machine
    assert launching.eval_scalars(logs, "loss").keys() == {20}
    assert not os.path.exists(os.path.join(checkpoints, "eval"))


def _two_free_ports() -> int:
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            base = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", base + 1))
                return base
            except OSError:
                continue
    raise AssertionError("no two consecutive free ports")


def _two_workers(envs: list[dict], command: list[str]) -> list[str]:
    """Runs `command` once per environment in `envs`, side by side; returns their outputs, each
    process having exited 0."""
    procs = [
        subprocess.Popen(command, cwd=faults.REPO, env=env, text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT)
        for env in envs
    ]  # fmt: skip
    outputs = []
    try:
        outputs = [proc.communicate(timeout=240)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    for proc, text in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, text[-3000:]
    return outputs


STRATEGY = "orbitask.run_experiment.strategy='multi_worker_mirrored'"


@pytest.mark.slow
def test_a_vertex_job_trains_on_its_two_replicas_and_delivers_its_savedmodel(tmp_path):
    """The job's CLUSTER_SPEC (no TF_CONFIG, no --model_dir) on 127.0.0.1: the primary replica
    and one worker train together into AIP_CHECKPOINT_DIR; the SavedModel lands in
    AIP_MODEL_DIR."""
    port = _two_free_ports()
    spec = {
        "cluster": {"workerpool0": [f"127.0.0.1:{port}"], "workerpool1": [f"127.0.0.1:{port + 1}"]},
        "environment": "cloud",
    }
    checkpoints, model = tmp_path / "checkpoints", tmp_path / "model"
    command = [a for a in faults.command("unused", steps=40, extra=[STRATEGY])
               if not a.startswith("--model_dir")]  # fmt: skip
    envs = []
    for pool in ("workerpool0", "workerpool1"):
        env = launching.env(tmp_path / pool)
        env.pop("TF_CONFIG", None)
        task = {"type": pool, "index": 0, "trial": ""}
        env.update(
            CLUSTER_SPEC=json.dumps({**spec, "task": task}),
            AIP_CHECKPOINT_DIR=str(checkpoints),
            AIP_MODEL_DIR=str(model),
        )
        envs.append(env)
    outputs = _two_workers(envs, command)
    assert "orbitask: on Vertex AI: chief 0, model directory" in outputs[0]
    assert faults.replicas_in(outputs[0]) == [2]  # the chief: 2 replicas, one per replica pool
    assert launching.latest_step(checkpoints) == 40
    assert f"SavedModel copied to {model}" in outputs[0]
    assert tf.saved_model.contains_saved_model(str(model))
    assert not os.path.exists(os.path.join(model, "variables", "tmp"))


@pytest.mark.slow
def test_a_sagemaker_job_trains_on_its_two_hosts_and_delivers_its_savedmodel(tmp_path):
    """SM_HOSTS of two hosts that are both this machine (`localhost` and `127.0.0.1`), a process
    each with its SM_CURRENT_HOST: they train as two workers, and the chief's SavedModel lands in
    SM_MODEL_DIR/<step>. `--model_dir` stands in for /opt/ml/checkpoints."""
    port = _two_free_ports()
    hosts = ["localhost", "127.0.0.1"]
    checkpoints, model = tmp_path / "checkpoints", tmp_path / "model"
    command = faults.command(checkpoints, steps=40, extra=[STRATEGY])
    envs = []
    for host in hosts:
        env = launching.env(tmp_path / host)
        env.pop("TF_CONFIG", None)
        env.update(SM_HOSTS=json.dumps(hosts), SM_CURRENT_HOST=host, SM_MODEL_DIR=str(model),
                   ORBITASK_PORT=str(port))  # fmt: skip
        envs.append(env)
    outputs = _two_workers(envs, command)
    assert f"orbitask: on SageMaker: worker 0, model directory {checkpoints}" in outputs[0]
    assert "orbitask: on SageMaker: worker 1" in outputs[1]
    assert faults.replicas_in(outputs[0]) == [2]
    assert launching.latest_step(checkpoints) == 40
    assert tf.saved_model.contains_saved_model(str(model / "40"))
