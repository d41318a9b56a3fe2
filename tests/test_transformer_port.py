"""TensorFlow's Transformer tutorial's masked loss, schedule and optimizer
(`tests/ports/transformer_tutorial.py`) through orbitask beside the tutorial's own `fit`.

Its token-normalised loss, its warm-up then inverse-square-root schedule and its Adam on an
`Embedding` (whose gradient reaches the optimizer as `IndexedSlices`, as in `fit`) train `fit`'s
weights on one device; on 2 replicas, whose halves hold other numbers of real tokens, the
count from `grad_pre` divides by all replicas' tokens, and the weights are one device's.
"""

import numpy as np
import pytest

import orbitask
from tests.ports import BATCH_SIZE, STEPS
from tests.ports import transformer_tutorial as tutorial


def _port(model_dir, replicas: int = 1) -> list[np.ndarray]:
    task = tutorial.TutorialPort()
    distribution = {"strategy": "mirrored", "cpu_devices": replicas} if replicas > 1 else {}
    orbitask.run_experiment(
        task, str(model_dir), mode="train", train_steps=STEPS, global_batch_size=BATCH_SIZE,
        progress=False, **distribution,
    )  # fmt: skip
    return task.weights()


def _assert_close(expected, got):
    assert len(expected) == len(got)
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_the_port_trains_the_tutorials_weights_on_one_device_and_on_two(tmp_path):
    expected = tutorial.original()
    _assert_close(expected, _port(tmp_path / "one"))
    _assert_close(expected, _port(tmp_path / "two", replicas=2))
