"""Summaries land in TensorBoard with the right tags; eval metrics agree across replica counts."""

import glob
import os

import keras
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
    assert _histogram_steps(tmp_path / "train") == {3, 6}  # every `histogram_interval` steps
    evals = _tags(tmp_path / "eval")
    assert "images" in evals["samples"]
    assert "loss" in evals and "accuracy" in evals
    assert "class_0" in _tags(tmp_path / "eval" / "per_class")


def _histogram_steps(directory) -> set:
    """The steps of the weight histograms in the event files directly in `directory`."""
    steps = set()
    for path in glob.glob(os.path.join(directory, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            if any(value.tag.startswith("weights/") for value in event.summary.value):
                steps.add(event.step)
    return steps


def _scalars(directory) -> dict:
    """{tag: {step: value}} of the scalars in the event files directly in `directory`."""
    out = {}
    for path in glob.glob(os.path.join(directory, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                out.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
    return out


class Xent(TinyTask):
    """TinyTask without L2 and with a continuous metric (mean cross-entropy) besides accuracy,
    recording every callback's logs (`calls`)."""

    def __init__(self, callback_every=None):
        super().__init__(l2=0.0)
        self.callback_every = callback_every
        self.calls = []

    def build_metrics(self, training=True):
        xent = keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="xent")
        return [*super().build_metrics(training), xent]

    def every_steps(self):
        if self.callback_every is None:
            return {}
        return {self.callback_every: lambda task, ctx: self.calls.append((ctx.step, ctx.logs))}

    def expected(self, model, x, y) -> dict:
        """The eval logs of `model` on `(x, y)` computed directly."""
        logits = model(x)
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits).numpy()
        accuracy = float(np.mean(np.argmax(logits, axis=1) == y))
        return {"loss": losses.mean(), "xent": losses.mean(), "accuracy": accuracy}


@pytest.mark.parametrize("steps_per_loop,window", [(3, 3), (2, 3), (3, None)])
def test_train_metrics_cover_their_window_whatever_the_loops(tmp_path, steps_per_loop, window):
    """Learning rate 1e-9 (the weights all but fixed), steps of 8 examples in order, the logs
    seen at steps 3, 6 and 9: the metrics are those of the window's own 24 examples, in loops of
    3 steps or of 2 (cut at the window's ends), or with no window in loops of 3 (each loop its
    own); not of every example since the start."""
    task = Xent(callback_every=3)
    run_experiment(
        task,
        str(tmp_path),
        mode="train",
        train_steps=9,
        global_batch_size=8,
        learning_rate=1e-9,
        steps_per_loop=steps_per_loop,
        loop_seconds=None,
        metrics_window=window,
        progress=False,
    )
    assert [step for step, _ in task.calls] == [3, 6, 9]
    model = Xent().build_model()
    xents = []
    for k, (_, logs) in enumerate(task.calls):
        rows = slice(24 * k, 24 * (k + 1))
        want = task.expected(model, task.x[rows], task.y[rows])
        assert logs["accuracy"] == pytest.approx(want["accuracy"], abs=1e-6), k
        assert logs["xent"] == pytest.approx(want["xent"], rel=1e-5), k
        xents.append(want["xent"])
    assert len(set(np.round(xents, 4))) == 3  # windows differ: an accumulated metric would show


def test_device_loops_end_where_a_window_ends(tmp_path):
    """Loops of up to 100 steps, a callback only at step 9: the window of 3 still cuts the
    loops at 3 and 6, so the metrics at step 9 are those of steps 7-9."""
    task = Xent(callback_every=9)
    run_experiment(
        task, str(tmp_path), mode="train", train_steps=9, global_batch_size=8,
        learning_rate=1e-9, steps_per_loop=100, loop_seconds=None, metrics_window=3,
        progress=False,
    )  # fmt: skip
    want = task.expected(Xent().build_model(), task.x[48:72], task.y[48:72])
    assert task.calls[-1][1]["xent"] == pytest.approx(want["xent"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("flavour,strategy", [("keras", "mirrored"), ("tf_keras", "one_device")])
def test_a_resumed_run_logs_the_metrics_of_an_uninterrupted_one(tmp_path, flavour, strategy):
    """Stopped at step 6 inside the default window and resumed to 9: the checkpoint holds the
    metrics' accumulation, so step 9 logs the metrics of all 9 steps, as without the stop (on
    2 replicas up to float rounding: a restored sum is split evenly over the replicas' copies)."""
    logs = {}
    for name, stops in (("whole", [9]), ("split", [6, 9])):
        for steps in stops:
            task = Xent()
            task.flavour = flavour
            logs[name] = run_experiment(
                task, str(tmp_path / name), mode="train", train_steps=steps,
                global_batch_size=8, strategy=strategy, progress=False, seed=0,
            )["train"]  # fmt: skip
    rel = 1e-6 if strategy == "mirrored" else 0
    for key in ("accuracy", "xent"):
        assert logs["split"][key] == pytest.approx(logs["whole"][key], rel=rel, abs=0), key


class MaskedAccuracy(TinyTask):
    """A token-weighted ratio: accuracy over the examples whose label is not 0, kept as a Keras
    `Mean` updated with its numerator and denominator (`sample_weight` the mask)."""

    def build_metrics(self, training=True):
        return [keras.metrics.Mean("masked_accuracy")]

    def process_metrics(self, metrics, labels, model_outputs, **kwargs):
        correct = tf.cast(tf.argmax(model_outputs, axis=-1) == tf.cast(labels, tf.int64), "float32")
        metrics[0].update_state(correct, sample_weight=tf.cast(labels != 0, tf.float32))


def test_a_ratio_metric_on_two_replicas_is_one_devices(tmp_path):
    """The replicas' halves hold other numbers of unmasked examples: the ratio of the summed
    numerators and denominators equals one device's, not the mean of the replicas' ratios."""
    logs = [
        run_experiment(
            MaskedAccuracy(l2=0.0), str(tmp_path / strategy), mode="train", train_steps=3,
            global_batch_size=16, strategy=strategy, progress=False, seed=0,
        )["train"]["masked_accuracy"]
        for strategy in ("one_device", "mirrored")
    ]  # fmt: skip
    assert logs[1] == pytest.approx(logs[0], rel=1e-6)


def test_by_default_train_metrics_accumulate_over_1000_steps(tmp_path):
    """The default window: loops of 3 steps, the metrics at step 9 are those of all 72
    examples."""
    task = Xent(callback_every=3)
    run_experiment(
        task, str(tmp_path), mode="train", train_steps=9, global_batch_size=8,
        learning_rate=1e-9, steps_per_loop=3, loop_seconds=None, progress=False,
    )  # fmt: skip
    want = task.expected(Xent().build_model(), task.x[:72], task.y[:72])
    assert task.calls[-1][1]["xent"] == pytest.approx(want["xent"], rel=1e-5)


def test_each_of_several_evaluations_starts_afresh(tmp_path):
    """Evaluations at steps 3, 6 and 9, 4 batches each: each one's logs are those of the weights
    of its step on the first 32 validation examples (metrics reset, input read from its start)."""
    task = Xent()
    logs = run_experiment(
        task,
        str(tmp_path),
        mode="train_and_eval",
        train_steps=9,
        global_batch_size=8,
        learning_rate=0.5,
        eval_interval=3,
        eval_steps=4,
        checkpoint_interval=3,
        progress=False,
    )
    written = _scalars(tmp_path / "eval")
    assert sorted(written["xent"]) == [3, 6, 9]
    xents = []
    for step in (3, 6, 9):
        model = Xent().build_model()
        tf.train.Checkpoint(train_model=model).restore(
            str(tmp_path / f"ckpt-{step}")
        ).expect_partial()
        want = task.expected(model, task.x[:32], task.y[:32])
        for name in ("loss", "xent", "accuracy"):
            assert written[name][step] == pytest.approx(want[name], rel=1e-5, abs=1e-6), (
                step,
                name,
            )
        xents.append(want["xent"])
    assert len(set(np.round(xents, 4))) == 3  # the weights moved between evaluations
    assert logs["eval"]["xent"] == pytest.approx(written["xent"][9], rel=1e-6)


class CountingDigits(DigitsClassification):
    """Keeps the replica count of each input it is asked for: `replicas[training]`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.replicas = {}

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        self.replicas[training] = input_context.num_replicas_in_sync
        return super().build_inputs(per_replica_batch_size, input_context, training)


@pytest.mark.slow
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
