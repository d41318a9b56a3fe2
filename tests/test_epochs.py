"""`train_epochs`: N epochs of a training input of known size are the steps of N passes over it.

50 examples in batches of 8 without `drop_remainder` are 7 batches (the last of 2 examples): 3
epochs are 21 steps on one device and on 2 replicas (13 per-replica batches of 4, the last of 2,
in 7 steps), and train as the same dataset `.repeat()`ed does for 21 steps.
"""

import io

import numpy as np
import pytest
import tensorflow as tf

from orbitask import IndexedInput
from orbitask.trainers import run_experiment
from orbitask.trainers.actions.progress import ProgressAction
from orbitask.trainers.engine.epochs import epoch_length
from orbitask.trainers.errors import ConfigError
from tests.helpers import TinyTask


class Finite(TinyTask):
    """50 examples, reshuffled each epoch, batched without `drop_remainder`; `repeat` adds the
    user's own `.repeat()` (the equivalent run by steps); `tail` is applied last."""

    def __init__(self, repeat=False, tail=None, drop_remainder=False, fail_at=None, **kwargs):
        super().__init__(n=50, **kwargs)
        self.repeat, self.tail, self.drop_remainder = repeat, tail, drop_remainder
        self.fail_at = fail_at

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ds = tf.data.Dataset.from_tensor_slices((self.x, self.y)).shuffle(50, seed=3)
        ds = ds.batch(per_replica_batch_size, drop_remainder=self.drop_remainder)
        if self.repeat:
            ds = ds.repeat()
        return self.tail(ds) if self.tail else ds

    def at_step(self):
        if self.fail_at is None:
            return {}

        def fail(task, ctx):
            raise RuntimeError(f"killed at step {ctx.step}")

        return {self.fail_at: fail}


class Indexed(TinyTask):
    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        return IndexedInput.from_tensors((self.x, self.y), per_replica_batch_size, seed=5)


def _train(task, model_dir, **kwargs):
    settings = dict(
        mode="train", global_batch_size=8, learning_rate=0.05, strategy="one_device",
        progress=False, checkpoint_seconds=None,
    )  # fmt: skip
    settings.update(kwargs)
    run_experiment(task, str(model_dir), **settings)
    latest = tf.train.latest_checkpoint(str(model_dir))
    reader = tf.train.load_checkpoint(latest)
    # The model's weights and the optimizer's slots.
    names = [n for n in reader.get_variable_to_shape_map() if n.startswith("optimizer/_")]
    return int(latest.rsplit("-", 1)[1]), {n: reader.get_tensor(n) for n in names}


def _same_weights(a, b, rtol=1e-6):
    assert a.keys() == b.keys() and a
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=rtol, atol=1e-6, err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_epochs_train_as_the_repeated_dataset_for_their_steps(tmp_path, capsys, strategy):
    step, epochs = _train(
        Finite(), tmp_path / "epochs", train_steps=None, train_epochs=3, strategy=strategy
    )
    assert step == 21
    assert "orbitask: 3 epoch(s) = 21 train steps (7 steps per epoch)" in capsys.readouterr().out
    reference = Finite(repeat=True)
    steps, repeated = _train(reference, tmp_path / "steps", train_steps=21, strategy="one_device")
    _same_weights(repeated, epochs, rtol=1e-5)


def test_train_steps_none_trains_one_epoch(tmp_path):
    step, _ = _train(Finite(), tmp_path, train_steps=None)
    assert step == 7


def test_a_run_stopped_mid_way_resumes_exactly(tmp_path):
    # Checkpoints at steps 7 (an epoch's end) and 14; a callback's error at step 17, in epoch 3,
    # saves the steps trained (an error outside the step): the run resumes mid-epoch from 17.
    settings = dict(train_steps=None, train_epochs=3, checkpoint_interval=7, steps_per_loop=3)
    _, full = _train(Finite(), tmp_path / "full", **settings)
    with pytest.raises(RuntimeError, match="killed at step 17"):
        _train(Finite(fail_at=17), tmp_path / "split", **settings)
    assert tf.train.latest_checkpoint(str(tmp_path / "split")).endswith("ckpt-17")
    step, resumed = _train(Finite(), tmp_path / "split", **settings)
    assert step == 21
    _same_weights(full, resumed)


@pytest.mark.slow
def test_an_indexed_input_counts_its_examples(tmp_path):
    # 2 epochs of 50 examples in steps of 8: ceil(100 / 8) = 13 steps.
    step, epochs = _train(Indexed(n=50), tmp_path / "epochs", train_steps=None, train_epochs=2)
    assert step == 13
    _, steps = _train(Indexed(n=50), tmp_path / "steps", train_steps=13)
    _same_weights(steps, epochs)


def test_an_epoch_in_steps_by_batch_dimension():
    task = Finite()
    partial = tf.data.Dataset.range(52).batch(4).map(lambda x: (x, x))
    partial = partial.apply(tf.data.experimental.assert_cardinality(13)).filter(lambda x, y: True)
    partial = partial.apply(tf.data.experimental.assert_cardinality(13))
    full = tf.data.Dataset.range(52).batch(4, drop_remainder=True).map(lambda x: (x, x))
    # Unknown batch dimension: a partial element ends a step, so an epoch is ceil(13 / 2) steps.
    assert epoch_length(task, partial, 2).steps_for(3) == 21
    # Static: the elements stream on across epochs, floor(3 * 13 / 2).
    assert epoch_length(task, full, 2).steps_for(3) == 19
    assert epoch_length(task, full, 1).steps_for(3) == 39


def test_the_progress_line_shows_the_epoch():
    stream = io.StringIO()
    progress = ProgressAction(tf.Variable(0, dtype=tf.int64), 21, stream=stream, epochs=3)
    assert "step 7/21 | epoch 1/3 |" in progress.line(7, {})
    assert "step 8/21 | epoch 2/3 |" in progress.line(8, {})
    assert "step 21/21 | epoch 3/3 |" in progress.line(21, {})
    plain = ProgressAction(tf.Variable(0, dtype=tf.int64), 21, stream=stream)
    assert "epoch" not in plain.line(8, {})


@pytest.mark.parametrize(
    "task, settings, message",
    [
        (
            Finite(),
            dict(train_steps=21, train_epochs=3),
            r"^Set train_steps or train_epochs, not both; received train_steps=21 and "
            r"train_epochs=3\. Set TRAIN_STEPS = None",
        ),
        (
            Finite(tail=lambda ds: ds.filter(lambda x, y: True)),
            dict(train_steps=None, train_epochs=3),
            r"^TensorFlow cannot tell how many batches Finite\.build_inputs\(training=True\) has "
            r".*dataset\.apply\(tf\.data\.experimental\.assert_cardinality\(n\)\).*TRAIN_STEPS",
        ),
        (
            Finite(repeat=True),
            dict(train_steps=None, train_epochs=3),
            r"^Finite\.build_inputs\(training=True\) repeats forever.*drop its \.repeat\(\)",
        ),
    ],
    ids=["both", "unknown_size", "infinite"],
)
def test_one_line_errors(tmp_path, task, settings, message):
    with pytest.raises(ConfigError, match=message):
        _train(task, tmp_path, **settings)
