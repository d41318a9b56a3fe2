"""Input positions: bounded on disk for tf.data inputs, a few bytes and elastic for IndexedInput;
none for a Python generator's input (or with `keep_input_positions = 0`), which a resume restarts.

`SeenCounts` writes how often each example was trained on into its weights (the loss is the sum
of one embedding row per example, SGD with the global batch as learning rate), so a run's final
weights are minus the visit counts: any example skipped or repeated across a restart shows.
"""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from orbitask import DigitsClassification, IndexedInput, Task
from orbitask.trainers import run_experiment
from orbitask.trainers.engine import inputs
from orbitask.trainers.state import input_position
from tests.helpers import LinearTask, TinyTask

N = 48  # examples per epoch
BATCH = 8


class SeenCounts(Task):
    def __init__(self, **kwargs):
        super().__init__(clip_norm=None, **kwargs)

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ids = np.arange(N, dtype=np.int32)
        if training:
            return IndexedInput.from_tensors((ids, ids), per_replica_batch_size, seed=3)
        return tf.data.Dataset.from_tensor_slices((ids, ids)).batch(per_replica_batch_size)

    def build_model(self):
        zeros = keras.initializers.Zeros()
        return keras.Sequential(
            [
                keras.Input((), dtype="int32"),
                keras.layers.Embedding(N, 1, embeddings_initializer=zeros),
            ]
        )

    def build_losses(self):
        return lambda loss_input: tf.reduce_sum(loss_input[0])

    def build_optimizer(self, learning_rate):
        return keras.optimizers.SGD(learning_rate=float(BATCH))


def _train(model_dir, steps, strategy, **kwargs):
    task = SeenCounts()
    run_experiment(
        task,
        str(model_dir),
        mode="train",
        train_steps=steps,
        global_batch_size=BATCH,
        steps_per_loop=3,
        checkpoint_interval=3,
        strategy=strategy,
        progress=False,
        **kwargs,
    )
    return task


def _counts(model_dir) -> np.ndarray:
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
    name = next(n for n, shape in reader.get_variable_to_shape_map().items() if shape == [N, 1])
    return -reader.get_tensor(name)[:, 0]


def _record(model_dir) -> dict:
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
    return json.loads(reader.get_tensor("input_position/.ATTRIBUTES/py_state"))


def test_every_example_is_seen_once_per_epoch_across_a_restart_on_other_replicas(tmp_path):
    """2 replicas for 9 steps, then 1 device to step 18: 3 epochs of 48, each example 3 times;
    the position saved is the count of examples taken, whatever the layout."""
    _train(tmp_path, 9, "mirrored")
    assert _record(tmp_path)["examples"] == 9 * BATCH
    assert np.bincount(_counts(tmp_path).astype(int)).tolist() == [0, N // 2, N // 2]
    _train(tmp_path, 18, "one_device")
    assert _record(tmp_path)["examples"] == 18 * BATCH
    np.testing.assert_array_equal(_counts(tmp_path), np.full(N, 3.0))


def test_n_replicas_see_the_batches_one_device_sees():
    source = IndexedInput.from_tensors(np.arange(N), 4, seed=5)
    one = IndexedInput.from_tensors(np.arange(N), 8, seed=5)
    whole = [b for b in one.training_dataset(0, 0, 1, 1).take(12).as_numpy_iterator()]
    mirrored = [b for b in source.training_dataset(0, 0, 1, 2).take(24).as_numpy_iterator()]
    workers = [
        [b for b in source.training_dataset(0, w, 2, 1).take(12).as_numpy_iterator()]
        for w in range(2)
    ]
    for step in range(12):
        np.testing.assert_array_equal(
            np.concatenate(mirrored[2 * step : 2 * step + 2]), whole[step]
        )
        np.testing.assert_array_equal(
            np.concatenate([workers[0][step], workers[1][step]]), whole[step]
        )
    # Each epoch is a permutation, a new one every epoch; a restart at example 40 goes on there.
    epochs = np.concatenate(whole).reshape(2, N)
    for epoch in epochs:
        assert sorted(epoch) == list(range(N))
    assert list(epochs[0]) != list(epochs[1])
    later = next(one.training_dataset(40, 0, 1, 1).as_numpy_iterator())
    np.testing.assert_array_equal(later, np.concatenate(whole)[40:48])


@pytest.mark.slow
def test_a_seeded_map_gets_the_same_seed_for_the_same_example_after_a_restart():
    def augment(example, seed):
        return example + tf.random.stateless_uniform([], seed, maxval=1000, dtype=tf.int64) * 100

    source = IndexedInput.from_tensors(np.arange(N, dtype=np.int64), 4, seed=5, map_fn=augment)
    straight = np.concatenate(list(source.training_dataset(0, 0, 1, 1).take(6).as_numpy_iterator()))
    resumed = np.concatenate(list(source.training_dataset(12, 0, 1, 1).take(3).as_numpy_iterator()))
    np.testing.assert_array_equal(resumed, straight[12:])
    assert len(set(straight // 100)) > 1  # the augmentation differs between examples


class Buffered(TinyTask):
    """A tf.data shuffle input: its iterator (buffer included) is the saved position."""

    def __init__(self, **kwargs):
        super().__init__(shuffle=True, **kwargs)


def _buffered(model_dir, steps, keep=2):
    run_experiment(
        Buffered(),
        str(model_dir),
        mode="train",
        train_steps=steps,
        global_batch_size=8,
        steps_per_loop=5,
        checkpoint_interval=5,
        keep_input_positions=keep,
        strategy="one_device",
        progress=False,
    )


def test_only_the_newest_input_positions_are_kept_and_an_older_checkpoint_restarts_the_input(
    tmp_path, capsys
):
    _buffered(tmp_path, 30)
    folder = tmp_path / "input"
    assert sorted(input_position.steps_with_positions(str(folder))) == [25, 30]
    assert sorted(os.listdir(folder / "ckpt-30")) == [
        "worker-0-of-1.data-00000-of-00001",
        "worker-0-of-1.index",
        "worker-0-of-1.shuffle_seeds.data-00000-of-00001",  # shuffle_seeds.ShuffleSeeds
        "worker-0-of-1.shuffle_seeds.index",
    ]
    assert (
        tf.train.get_checkpoint_state(str(tmp_path))
        .all_model_checkpoint_paths[0]
        .endswith("ckpt-5")
    )  # the model checkpoints are all kept

    # The checkpoint at step 30 holds the input position: a resume restores it quietly.
    _buffered(tmp_path, 35)
    assert "restarts from its beginning" not in capsys.readouterr().out

    # Back to step 20, whose position was not kept: the resume says the input restarts.
    state = tf.train.get_checkpoint_state(str(tmp_path))
    paths = [p for p in state.all_model_checkpoint_paths if int(p.rsplit("-", 1)[1]) <= 20]
    tf.compat.v1.train.update_checkpoint_state(str(tmp_path), paths[-1], paths)
    _buffered(tmp_path, 25)
    out = capsys.readouterr().out
    assert "the training input restarts from its beginning at step 20" in out
    assert "only the newest 2 input positions are kept" in out


def test_a_tf_data_input_that_ignores_input_context_is_named_under_several_workers(caplog):
    context = tf.distribute.InputContext(2, 0, 2)
    ignores = TinyTask(shuffle=True)
    assert inputs.warn_if_unsharded(ignores, 4, context)
    assert "TinyTask.build_inputs gives worker 0 and worker 1 the same first batch" in caplog.text
    shards = DigitsClassification(shuffle_buffer=64)
    assert not inputs.warn_if_unsharded(shards, 4, context)


def test_a_tf_data_position_saved_by_another_number_of_workers_restarts_the_input(tmp_path, capsys):
    dataset = tf.data.Dataset.range(100).shuffle(10, seed=1).batch(2)
    step = tf.Variable(4, dtype=tf.int64)
    rebuilt = []

    def rebuild():
        rebuilt.append(True)
        return iter(dataset)

    saved = input_position.IteratorInput(iter(dataset), step, 2, rebuild, str(tmp_path), 0, 2)
    next(saved.iterator)
    record = saved.serialize()  # writes worker-0-of-2 at step 4
    assert (tmp_path / "input" / "ckpt-4" / "worker-0-of-2.index").is_file()
    same = input_position.IteratorInput(iter(dataset), step, 2, rebuild, str(tmp_path), 0, 2)
    same.deserialize(record)
    assert (
        not rebuilt
        and next(same.iterator).numpy().tolist() == next(saved.iterator).numpy().tolist()
    )
    alone = input_position.IteratorInput(iter(dataset), step, 2, rebuild, str(tmp_path), 0, 1)
    alone.deserialize(record)
    assert rebuilt
    out = capsys.readouterr().out
    assert "the training input restarts from its beginning at step 4" in out
    assert "saved by 2 input pipelines (workers) and this job has 1" in out


class FromGenerator(LinearTask):
    """`LinearTask` on rows `(i, 1)` read from a Python generator, in order, forever: `w[1]`
    moves by the learning rate each step, `w[0]` by it times the mean row index of the batch."""

    def __init__(self):
        super().__init__(np.stack([np.arange(N), np.ones(N)], axis=1), clip_norm=None)

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        x, m = self.x, self.m

        def rows():
            while True:
                yield from zip(x, m, strict=True)

        spec = (tf.TensorSpec((2,), tf.float32), tf.TensorSpec((), tf.float32))
        dataset = tf.data.Dataset.from_generator(rows, output_signature=spec)
        return dataset.batch(per_replica_batch_size, drop_remainder=True)

    def build_model(self):
        self.model = super().build_model()
        return self.model


@pytest.mark.parametrize("keep", [3, 0])
def test_a_generator_input_trains_and_a_resume_restarts_it(tmp_path, capsys, keep):
    def train(steps):
        task = FromGenerator()
        settings = dict(global_batch_size=BATCH, steps_per_loop=2, checkpoint_interval=2)
        run_experiment(task, str(tmp_path), mode="train", train_steps=steps, progress=False,
                       keep_input_positions=keep, **settings)  # fmt: skip
        return task.model.weights[0].numpy()[:, 0]

    train(4)
    out = capsys.readouterr().out
    unsaved = "FromGenerator.build_inputs(training=True) reads a Python function (PyFunc"
    assert (unsaved in out) == (keep > 0)  # with 0 nothing is saved: no check, no line
    if keep:
        assert "a resume restarts the training input from its beginning" in out
    assert not input_position.steps_with_positions(str(tmp_path / "input"))
    w = train(6)
    out = capsys.readouterr().out
    restart = [
        line for line in out.splitlines() if "restarts from its beginning at step 4: " in line
    ]
    why = unsaved if keep else "run_experiment.keep_input_positions is 0, so no input position"
    assert len(restart) == 1 and why in restart[0], out
    # Steps 1-4 read rows 0-31, and the resumed steps 5-6 rows 0-15 again (mean row indices
    # 3.5, 11.5, 19.5, 27.5, then 3.5, 11.5); each step moves w[1] by the learning rate.
    assert w[0] / w[1] == pytest.approx((3.5 + 11.5 + 19.5 + 27.5 + 3.5 + 11.5) / 6)
