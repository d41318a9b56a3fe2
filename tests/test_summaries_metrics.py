"""Summaries land in TensorBoard with the right tags; eval metrics agree across replica counts."""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf

from orbitask.tasks import DigitsClassification
from orbitask.trainers import run_experiment
from tests.helpers import TinyTask


def _tags(directory):
    """{tag: kind} of every event file directly in `directory`."""
    tags = {}
    for path in glob.glob(os.path.join(directory, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                kind = value.metadata.plugin_data.plugin_name or "simple"
                tags.setdefault(value.tag, set()).add(kind)
    return tags


class Pictures(TinyTask):
    """Returns an image and a nested dict from the evaluation (Model Garden style)."""

    def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
        logs = super().reduce_aggregated_logs(aggregated_logs, global_step)
        logs["samples"] = np.linspace(0, 1, 2 * 4 * 4).reshape(2, 4, 4, 1).astype(np.float32)
        logs["per_class"] = {"class_0": 0.5, "class_1": 0.25}
        return logs


def test_train_and_eval_summaries_have_the_expected_tags(tmp_path):
    run_experiment(
        Pictures(),
        str(tmp_path),
        mode="train_and_eval",
        train_steps=6,
        global_batch_size=8,
        eval_interval=6,
        histogram_interval=3,
        progress=False,
    )
    train = _tags(tmp_path / "train")
    for tag in ("loss", "grad_norm", "learning_rate", "steps_per_second", "accuracy"):
        assert tag in train, (tag, sorted(train))
    assert any(t.startswith("weights/") and "histograms" in k for t, k in train.items())
    evals = _tags(tmp_path / "eval")
    assert "images" in evals["samples"]
    assert "loss" in evals and "accuracy" in evals
    assert "class_0" in _tags(tmp_path / "eval" / "per_class")


class CountingDigits(DigitsClassification):
    """Keeps the replica count of each input it is asked for: `replicas[training]`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.replicas = {}

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        self.replicas[training] = input_context.num_replicas_in_sync
        return super().build_inputs(per_replica_batch_size, input_context, training)


@pytest.mark.parametrize("flavour_metric", ["keras"])
def test_two_replica_eval_equals_one_device(tmp_path, flavour_metric):
    """Validation set of 359 examples: partial last batches, uneven across replicas."""
    logs = {}
    for strategy in ("one_device", "mirrored"):
        task = DigitsClassification(hidden_units=(16,))
        run_experiment(
            task,
            str(tmp_path / strategy),
            mode="train",
            train_steps=5,
            global_batch_size=64,
            seed=3,
            strategy=strategy,
            progress=False,
        )
    for strategy, replicas in (("one_device", 1), ("mirrored", 2)):
        # Evaluate the same weights (the one-device run's) under both strategies.
        task = CountingDigits(hidden_units=(16,))
        logs[strategy] = run_experiment(
            task,
            str(tmp_path / "one_device"),
            mode="eval",
            train_steps=5,
            global_batch_size=64,
            strategy=strategy,
            progress=False,
        )["eval"]
        assert task.replicas[False] == replicas
    one, two = logs["one_device"], logs["mirrored"]
    assert one["accuracy"] == pytest.approx(two["accuracy"], abs=1e-7)
    np.testing.assert_allclose(one["loss"], two["loss"], rtol=1e-5)
    assert 0.0 < one["accuracy"] < 1.0
