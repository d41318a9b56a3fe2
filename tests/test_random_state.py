"""Random state the task's objects own is saved, so a resumed run equals an uninterrupted one; a
host generator that cannot be saved is named at start."""

import random

import keras
import numpy as np
import pytest
import tensorflow as tf

from orbitask import run_experiment
from orbitask.trainers.state import random_state
from tests.helpers import TinyTask


class Noisy(TinyTask):
    """Adds noise from a SeedGenerator (the Keras GAN guide's) to the inputs of every step."""

    def __init__(self, where, **kwargs):
        super().__init__(**kwargs)
        self.where = where
        if where == "task":
            self.seed_generator = keras.random.SeedGenerator(1337)

    def build_model(self):
        model = super().build_model()
        if self.where == "model":
            model.noise = keras.random.SeedGenerator(1337)
        self.model = model
        return model

    def _generator(self):
        return self.seed_generator if self.where == "task" else self.model.noise

    def input_pre(self, batch, lr):
        inputs, _ = batch
        return inputs + keras.random.normal(tf.shape(inputs), seed=self._generator())

    def every_steps(self):
        return {}


def _run(model_dir, where, steps):
    task = Noisy(where, l2=0.0)
    run_experiment(
        task, str(model_dir), mode="train", train_steps=steps, global_batch_size=8,
        steps_per_loop=2, checkpoint_interval=3, progress=False, loop_seconds=None,
    )  # fmt: skip
    return [w.numpy() for w in task.model.weights]


@pytest.mark.parametrize("where", [pytest.param("task", marks=pytest.mark.slow), "model"])
def test_a_seed_generators_state_is_resumed(tmp_path, where):
    full = _run(tmp_path / "full", where, 6)
    _run(tmp_path / "split", where, 3)
    resumed = _run(tmp_path / "split", where, 6)
    for a, b in zip(full, resumed, strict=True):
        np.testing.assert_array_equal(a, b)
    names = [n for n, _ in tf.train.list_variables(str(tmp_path / "split"))]
    assert any(n.startswith("random_state/") for n in names), names


def test_host_generators_are_named():
    class Holder:
        def __init__(self):
            self.rng = np.random.default_rng(0)
            self.py = random.Random(0)
            self.seed = keras.random.SeedGenerator(1)

    saved, host = random_state.find({"task": Holder()})
    assert sorted(host) == ["task.py", "task.rng"]
    assert list(saved) == ["task.seed"]
