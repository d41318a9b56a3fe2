"""Keras' VAE example (`tests/ports/vae.py`) through orbitask beside its own `fit`.

The port's own `train_step` draws from the example's `SeedGenerator` and ends at `fit`'s weights;
its trackers, as the run's metrics over windows of one epoch, log `fit`'s per-epoch history.
Returned as step logs under the trackers' names, as the example's `train_step` returns them,
they are refused in one line: the metrics' values would replace the step's.
"""

import numpy as np
import pytest

import orbitask
from tests.ports import BATCH_SIZE, STEPS, vae


def _train(task, model_dir):
    return orbitask.run_experiment(
        task, str(model_dir), mode="train", train_steps=STEPS, global_batch_size=BATCH_SIZE,
        metrics_window=vae.STEPS_PER_EPOCH, progress=False,
    )  # fmt: skip


@pytest.mark.slow
def test_the_port_trains_fits_weights_and_logs_fits_epochs(tmp_path):
    history, weights = vae.original()
    task = vae.VAEPort()
    _train(task, tmp_path)
    for a, b in zip(weights, task.weights(), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    assert len(task.epochs) == len(history["loss"]) == 2
    for epoch, logs in enumerate(task.epochs):
        for name in vae.TRACKERS:
            expected = history["loss" if name == "total_loss" else name][epoch]
            assert logs[name] == pytest.approx(expected, rel=1e-5), (epoch, name)


class AsWritten(vae.VAEPort):
    """The example's return value: the trackers' results, under their names."""

    def train_step(self, batch, model, optimizer, metrics=None, *, loss_fn, lr, global_batch_size):
        super().train_step(
            batch, model, optimizer, metrics, loss_fn=loss_fn, lr=lr,
            global_batch_size=global_batch_size,
        )  # fmt: skip
        return {"loss": metrics[0].result(), "reconstruction_loss": metrics[1].result()}


def test_the_examples_own_logs_beside_its_trackers_are_refused_in_one_line(tmp_path):
    refused = r"^AsWritten's train step logs 'reconstruction_loss', the name of one of its"
    with pytest.raises(orbitask.ConfigError, match=refused):
        _train(AsWritten(), tmp_path)
