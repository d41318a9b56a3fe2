"""Ports of three public custom-training-loop examples reproduce them, on 1 device and on 2.

The examples (`tests/ports/`, each module's docstring names its original and every change):
Keras' guide "Writing a training loop from scratch in TensorFlow" (orbitask's default step),
TensorFlow's DCGAN tutorial and its "Custom training loop with MultiWorkerMirroredStrategy"
tutorial (each its own `train_step`). Each trains 8 steps of 32 on 100 examples: steps 4 and 8
have the partial batch of 4 that ends an epoch, steps 5-8 follow one.

- `test_port_reproduces_the_original`: the port on 1 device logs the original's loss at every
  step and ends at its weights.
- `test_two_replicas_train_like_one_device`: the port on 2 mirrored CPU replicas logs the
  same losses as on 1 device at every step, and ends at the same weights. The DCGAN is compared
  with synchronized BatchNormalization and no Dropout (`DCGAN(distributable=True)`): per-replica
  batch statistics and dropout masks cannot equal one device's under any framework.
"""

import functools
import tempfile

import numpy as np
import pytest

from tests.ports import STEPS, Run, dcgan, distributed_tutorial, keras_guide, train

# name -> (the original's loop, the port, the port's arguments for the 1 vs 2 replicas test)
EXAMPLES = {
    "keras_guide": (keras_guide.original, keras_guide.KerasGuide, {}),
    "dcgan": (dcgan.original, dcgan.DCGAN, {"distributable": True}),
    "distributed_tutorial": (distributed_tutorial.original, distributed_tutorial.Tutorial, {}),
}


@functools.cache
def original(name: str) -> Run:
    return EXAMPLES[name][0]()


@functools.cache
def port(name: str, replicas: int, **kwargs) -> Run:
    """The port trained once per process and arguments (a 1-device run serves both tests)."""
    task = EXAMPLES[name][1](**kwargs)
    with tempfile.TemporaryDirectory() as model_dir:
        train(task, model_dir, replicas)
    return task.result()


def assert_same_run(run: Run, expected: Run, what: str) -> None:
    """Every logged loss at every step to rtol 1e-5, and every final weight."""
    assert sorted(run.losses) == sorted(expected.losses), what
    for name, values in expected.losses.items():
        assert len(values) == STEPS, f"{what}: {name} logged {len(values)} steps, not {STEPS}"
        np.testing.assert_allclose(
            run.losses[name], values, rtol=1e-5, err_msg=f"{what}: `{name}` at steps 1-{STEPS}"
        )
    assert len(run.weights) == len(expected.weights), what
    for i, (got, want) in enumerate(zip(run.weights, expected.weights, strict=True)):
        np.testing.assert_allclose(
            got, want, rtol=1e-5, atol=1e-6, err_msg=f"{what}: weight {i} after {STEPS} steps"
        )


def _slow_unless(name, quick):
    """The parameter `name`, marked slow unless it is in `quick`."""
    return name if name in quick else pytest.param(name, marks=pytest.mark.slow)


@pytest.mark.parametrize(
    "name", [_slow_unless(n, ("keras_guide", "distributed_tutorial")) for n in EXAMPLES]
)
def test_port_reproduces_the_original(name):
    assert_same_run(port(name, 1), original(name), f"{name}: port on 1 device vs original")


@pytest.mark.parametrize("name", [_slow_unless(n, ("distributed_tutorial",)) for n in EXAMPLES])
def test_two_replicas_train_like_one_device(name):
    kwargs = EXAMPLES[name][2]
    assert_same_run(
        port(name, 2, **kwargs), port(name, 1, **kwargs), f"{name}: port on 2 replicas vs 1 device"
    )
