"""Random draws of the step and the model train the same weights whatever the device loops' lengths,
and resume exactly where their state is saved; what no checkpoint can hold is named in one line."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from orbitask import run_experiment
from orbitask.trainers.state import random_state
from tests.helpers import TinyTask, keras_module


class Dropped(TinyTask):
    """TinyTask with a dropout layer (either Keras flavour) and, optionally, `tf.random.normal`
    noise on the logits in `loss_pre` (TF's DCGAN tutorial draws its noise so, in the step)."""

    def __init__(self, noise=False, **kwargs):
        super().__init__(shuffle=True, l2=0.0, **kwargs)
        self.noise = noise

    def build_model(self):
        k = keras_module(self.flavour)
        self.model = k.Sequential(
            [
                k.Input((6,)),
                k.layers.Dense(16, "tanh", kernel_initializer=k.initializers.GlorotUniform(1)),
                k.layers.Dropout(0.5),
                k.layers.Dense(3, kernel_initializer=k.initializers.GlorotUniform(2)),
            ]
        )
        return self.model

    def loss_pre(self, outputs, batch, model, lr):
        if self.noise:
            outputs += tf.random.normal(tf.shape(outputs), seed=3)
        return outputs, batch[1]

    def every_steps(self):
        return {5: [lambda task, ctx: None]}  # a host callback: device loops end at 5, 10, ...


def _run(model_dir, task, steps, steps_per_loop=100, loop_seconds=None, strategy="one_device"):
    run_experiment(
        task, str(model_dir), mode="train", train_steps=steps, global_batch_size=16,
        steps_per_loop=steps_per_loop, loop_seconds=loop_seconds, checkpoint_interval=6,
        progress=False, seed=7, strategy=strategy,
    )  # fmt: skip
    return [w.numpy() for w in task.model.weights] if hasattr(task, "model") else None


def _assert_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.slow
@pytest.mark.parametrize("flavour,noise", [("tf_keras", False), ("keras", False), ("keras", True)])
def test_loop_lengths_do_not_change_the_draws(tmp_path, flavour, noise):
    one = _run(tmp_path / "one", Dropped(noise, flavour=flavour), 17, steps_per_loop=1)
    for i, (length, seconds) in enumerate([(3, None), (100, 1.0)]):
        other = _run(tmp_path / str(i), Dropped(noise, flavour=flavour), 17, length, seconds)
        _assert_equal(one, other)


@pytest.mark.slow
@pytest.mark.parametrize("flavour", ["tf_keras", "keras"])
@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_dropout_resumes_exactly(tmp_path, flavour, strategy):
    """On 2 replicas too, where each draws its own masks (a Keras 3 generator's copy on
    replica 1 holds its own seed), from the state the checkpoint saved."""
    full = _run(tmp_path / "full", Dropped(flavour=flavour), 12, strategy=strategy)
    _run(tmp_path / "split", Dropped(flavour=flavour), 6, strategy=strategy)
    task = Dropped(flavour=flavour)
    resumed = _run(tmp_path / "split", task, 12, strategy=strategy)
    _assert_equal(full, resumed)
    names = [n for n, _ in tf.train.list_variables(str(tmp_path / "split"))]
    assert any(n.startswith("random_state/") for n in names), names
    if strategy == "mirrored" and flavour == "keras":
        copies = [v.numpy() for v in task.model.layers[1].seed_generator.state.value.values]
        assert copies[1][0] == copies[0][0] + random_state.REPLICA_SEED_STRIDE, copies


def test_each_replica_draws_its_own_masks_and_a_restored_state_draws_them_again():
    """Keras 3 dropout on 2 replicas: other masks on each replica, replica 0's those of one
    device; the state a checkpoint restores (replica 0's, written to every copy) spreads again
    to the same masks."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        layer = keras.layers.Dropout(0.5, seed=3)
    draws = random_state.ReplicaDraws({"model": layer}, strategy)

    @tf.function
    def masks():
        return strategy.run(lambda: layer(tf.ones((4, 64)), training=True))

    saved = layer.seed_generator.state.numpy()
    draws()
    first = [m.numpy() for m in strategy.experimental_local_results(masks())]
    assert not np.array_equal(first[0], first[1])
    one_device = keras.layers.Dropout(0.5, seed=3)(tf.ones((4, 64)), training=True)
    np.testing.assert_array_equal(first[0], one_device)  # replica 0 draws as one device
    layer.seed_generator.state.assign(saved)  # as a restore writes it
    draws()
    again = [m.numpy() for m in strategy.experimental_local_results(masks())]
    _assert_equal(first, again)


def test_each_replicas_counter_goes_on_across_device_loops():
    """Keras 3 dropout on 2 replicas: the seeds spread again before each device loop keep each
    replica's counter, so two loops of one step draw what one loop of two steps draws, new
    masks at each step."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

    def drawn(loops):
        with strategy.scope():
            layer = keras.layers.Dropout(0.5, seed=3)
        draws = random_state.ReplicaDraws({"model": layer}, strategy)

        @tf.function
        def masks():
            return strategy.run(lambda: layer(tf.ones((4, 64)), training=True))

        steps = []
        for length in loops:
            draws()  # before each device loop
            for _ in range(length):
                steps.append([m.numpy() for m in strategy.experimental_local_results(masks())])
        return steps

    one_loop, two_loops = drawn([2]), drawn([1, 1])
    assert not np.array_equal(one_loop[0][0], one_loop[1][0])
    for one, two in zip(one_loop, two_loops, strict=True):
        _assert_equal(one, two)


class DropoutFirst(TinyTask):
    """A tf_keras model whose Dropout is built before its unseeded Dense layers (Model Garden's
    heads are so). It keeps the weights it starts training from."""

    def build_model(self):
        inputs = tf_keras.Input((6,))
        x = tf_keras.layers.Dropout(0.1)(inputs)
        x = tf_keras.layers.Dense(16, "tanh")(x)
        self.model = tf_keras.Model(inputs, tf_keras.layers.Dense(3)(x))
        return self.model

    def on_train_begin(self, ctx):
        self.start = [w.numpy() for w in self.model.weights]


@pytest.mark.slow
def test_a_tf_keras_model_starts_from_the_weights_tf_keras_gives_it(tmp_path, capsys):
    """With its dropout draws saved (the start line names the layer), the model's initial
    weights are those tf_keras builds for the same seed without orbitask."""
    from orbitask.trainers.engine.determinism import make_deterministic

    make_deterministic(7)
    expected = [w.numpy() for w in DropoutFirst(flavour="tf_keras").build_model().weights]
    task = DropoutFirst(flavour="tf_keras", l2=0.0)
    run_experiment(
        task, str(tmp_path), mode="train", train_steps=1, global_batch_size=16, seed=7,
        progress=False,
    )  # fmt: skip
    _assert_equal(expected, task.start)
    assert "1 tf_keras layer(s) draw their masks from generators" in capsys.readouterr().out
    layer = task.model.layers[1]
    assert layer._random_generator._rng_type == layer._random_generator.RNG_STATEFUL


def test_a_stateful_op_in_the_step_is_named_once(tmp_path, capsys):
    _run(tmp_path, Dropped(noise=True, flavour="keras"), 6, steps_per_loop=2)
    lines = [line for line in capsys.readouterr().out.splitlines() if "stateful ops" in line]
    assert len(lines) == 1, lines
    assert "the train step" in lines[0] and "RandomStandardNormal" in lines[0], lines[0]
    assert "test_step_randomness.py:" in lines[0], lines[0]  # where: the user's file and line
    assert "keras.random.SeedGenerator" in lines[0], lines[0]  # the fix


@pytest.mark.slow
def test_saved_draws_are_not_named(tmp_path, capsys):
    _run(tmp_path, Dropped(flavour="tf_keras"), 4)
    assert "stateful ops" not in capsys.readouterr().out


class Augmented(TinyTask):
    """Augments its input with a stateful random op in `map` (as Model Garden's vision parsers
    do with `tf.image.random_flip_left_right` and `sample_distorted_bounding_box`)."""

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        dataset = tf.data.Dataset.from_tensor_slices((self.x, self.y))
        if training:

            def jitter(x, y):
                return x + tf.random.uniform([6], -0.1, 0.1), y

            dataset = dataset.map(jitter).repeat()
        return dataset.batch(per_replica_batch_size, drop_remainder=training)


@pytest.mark.slow
def test_a_stateful_op_in_the_input_runs_and_is_named(tmp_path, capsys):
    _run(tmp_path, Augmented(l2=0.0), 8, steps_per_loop=2)
    lines = [line for line in capsys.readouterr().out.splitlines() if "stateful ops" in line]
    assert len(lines) == 1, lines
    assert "Augmented.build_inputs(training=True)" in lines[0], lines[0]
    assert "RandomUniform in jitter" in lines[0], lines[0]
    assert "tf.data.Dataset.random()" in lines[0], lines[0]
    _run(tmp_path, Augmented(l2=0.0), 12, steps_per_loop=2)  # its position is restored
    assert "restarts from its beginning" not in capsys.readouterr().out
    assert tf.io.gfile.glob(str(tmp_path / "input" / "ckpt-12" / "*"))


def test_a_tf_keras_layer_with_its_own_seed_draws_from_it_whatever_the_runs_seed():
    """Its masks are those of tf_keras' own stateful generator of that seed, under any run seed
    (or none); a layer without a seed draws from the run's."""
    from orbitask.common import keras_compat

    def masks(seed, run_seed):
        inputs = tf_keras.Input((64,))
        model = tf_keras.Model(inputs, tf_keras.layers.Dropout(0.5, seed=seed)(inputs))
        assert keras_compat.save_layer_draws(model, seed=run_seed)
        return model(tf.ones((4, 64)), training=True).numpy()

    stateful = tf_keras.layers.Dropout(0.5, seed=5, rng_type="stateful")
    expected = stateful(tf.ones((4, 64)), training=True).numpy()
    for run_seed in (1, 2, None):
        np.testing.assert_array_equal(masks(5, run_seed), expected)
    assert not np.array_equal(masks(None, 1), masks(None, 2))


def test_keras_generators_behind_tf_keras_layers_are_found():
    from orbitask.common import keras_compat

    inputs = tf_keras.Input((3,))
    layer = tf_keras.layers.Dropout(0.5)
    keras_compat.save_layer_draws(tf_keras.Model(inputs, layer(inputs)), seed=None)
    saved, _ = random_state.find({"model": layer})
    assert list(saved) == ["model.random_generator"], saved
    legacy = tf_keras.layers.Dropout(0.5)
    legacy.build((None, 3))
    assert random_state.find({"model": legacy})[0] == {}
