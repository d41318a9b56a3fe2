"""Test set-up: two logical CPU devices (so `mirrored` has 2 replicas) and oneDNN off.

oneDNN fuses MatMul+BiasAdd+Relu in graph mode on CPU and turns NaN into 0, so NaN tests need it
off; both must be set before TensorFlow initialises.
"""

import os
import sys

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gin  # noqa: E402
import pytest  # noqa: E402

from orbitask.trainers import logical_cpus  # noqa: E402

logical_cpus(2)


@pytest.fixture(autouse=True)
def _clear_gin():
    gin.clear_config()
    yield
    gin.clear_config()
