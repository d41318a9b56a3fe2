"""Test set-up: two logical CPU devices (so `mirrored` has 2 replicas) and oneDNN off.

oneDNN fuses MatMul+BiasAdd+Relu in graph mode on CPU and turns NaN into 0, so NaN tests need it
off; both must be set before TensorFlow initialises. After each test file, Keras' global state
is cleared and the garbage collected: a pytest-xdist worker runs hundreds of files, and the
models and traced functions they leave behind made later files' tracing several times slower.
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
def _clear_keras_after_each_file():
    yield
    for name in ("keras", "tf_keras"):  # only the flavours the file imported
        if name in sys.modules:
            sys.modules[name].backend.clear_session()
    gc.collect()


@pytest.fixture(autouse=True)
def _clear_gin():
    gin.clear_config()
    yield
    gin.clear_config()
