"""Test set-up: two logical CPU devices (so `mirrored` has 2 replicas) and oneDNN off.

oneDNN fuses MatMul+BiasAdd+Relu in graph mode on CPU and turns NaN into 0, so NaN tests need it
off; both must be set before TensorFlow initialises. After each test file, the file's entries of
TensorFlow's gradient registry are dropped, Keras' global state is cleared and the garbage
collected: a pytest-xdist worker runs a hundred files in one process, and every step traced on
several replicas leaves its whole graph in that registry (`ReplicaContext.all_reduce` registers
a `tf.custom_gradient` each time it traces), which made later files several times slower.
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


@pytest.fixture(autouse=True, scope="module")
def _release_after_each_file():
    gradients = _custom_gradients()
    before = set(gradients)
    yield
    # `ReplicaContext.all_reduce` registers a `tf.custom_gradient` in TensorFlow's global
    # gradient registry each time a step traces, and the entry holds the step's whole graph.
    for name in [n for n in gradients if n.startswith("CustomGradient-") and n not in before]:
        del gradients[name]
    for name in ("keras", "tf_keras"):  # only the flavours the file imported
        if name in sys.modules:
            sys.modules[name].backend.clear_session()
    gc.collect()


def _custom_gradients() -> dict:
    from tensorflow.python.framework import ops

    return ops._gradient_registry._registry  # noqa: SLF001


@pytest.fixture(autouse=True)
def _clear_gin():
    gin.clear_config()
    yield
    gin.clear_config()
