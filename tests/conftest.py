"""Test set-up: two logical CPU devices (so `mirrored` has 2 replicas) and oneDNN off.

oneDNN fuses MatMul+BiasAdd+Relu in graph mode on CPU and turns NaN into 0, so NaN tests need it
off; both must be set before TensorFlow initialises.

After each test file, the file's entries of TensorFlow's gradient registry are dropped and
Keras' global state is cleared: a pytest-xdist worker runs fifty files in one process, and every
step traced on several replicas leaves its whole graph in that registry
(`ReplicaContext.all_reduce` registers a `tf.custom_gradient` each time it traces), which made
later files several times slower. The objects left are then frozen (`gc.freeze`) rather than
collected: freeing a file's traced graphs took 1 to 80 seconds of the file's teardown, frozen
objects cost later collections nothing, and collecting a whole worker's frozen objects at once
took 255 to 346 seconds. They are collected only when the machine runs short of memory
(`COLLECT_BELOW_AVAILABLE`): over a whole run the largest worker grows to 5.2-5.5 GB.
"""

import gc
import os
import sys

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gin  # noqa: E402
import pytest  # noqa: E402

from orbitask.trainers import logical_cpus  # noqa: E402

logical_cpus(2)


# The costliest files, started first: `--dist loadfile` hands files out in collection order,
# and one of these started last kept one worker busy minutes after the other had finished.
FIRST = (
    "test_ray.py", "test_verify.py", "test_sweep.py", "test_benchmarks.py", "test_export.py",
    "test_model_garden_checkpoints.py", "test_model_garden_real.py", "test_reliability.py",
    "test_multi_worker.py", "test_signals.py", "test_predict.py", "test_warm_start.py",
    "test_gan.py", "test_metrics_file.py",
)  # fmt: skip


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: files stay whole


@pytest.fixture(autouse=True, scope="module")
def _release_after_each_file():
    gradients = _custom_gradients()
    before = set(gradients)
    yield
    # `ReplicaContext.all_reduce` registers a `tf.custom_gradient` in TensorFlow's global
    # gradient registry each time a step traces, and the entry holds the step's whole graph.
    for name in [n for n in gradients if n.startswith("CustomGradient-") and n not in before]:
        del gradients[name]
    if "tf_keras" in sys.modules:  # only the flavours the file imported
        sys.modules["tf_keras"].backend.clear_session()
    if "keras" in sys.modules:
        sys.modules["keras"].backend.clear_session(free_memory=False)
    if _available() < COLLECT_BELOW_AVAILABLE:
        gc.unfreeze()
        gc.collect()
    gc.freeze()


# The share of the machine's memory still available below which a file's end collects every
# frozen object: room for the other workers' growth and a test's training processes.
COLLECT_BELOW_AVAILABLE = 0.3


def _available() -> float:
    """The share of the machine's memory available (`MemAvailable` of `/proc/meminfo`)."""
    with open("/proc/meminfo") as f:
        kib = {line.split(":")[0]: int(line.split()[1]) for line in f}
    return kib["MemAvailable"] / kib["MemTotal"]


def _custom_gradients() -> dict:
    from tensorflow.python.framework import ops

    return ops._gradient_registry._registry  # noqa: SLF001


@pytest.fixture(autouse=True)
def _clear_gin():
    gin.clear_config()
    yield
    gin.clear_config()
