"""The private library behaviour orbitask relies on (trainers/compat.py) and Orbit's contract.

These tests fail loudly when a new Orbit, gin, tf.data or tf.train.Checkpoint version changes what
compat.py reaches into, and when orbitask's `Controller` stops behaving as `orbit.Controller` does.
"""

import inspect
import random
import unittest

import gin
import numpy as np
import orbit
import orbit.controller
import orbit.controller_test
import pytest
import tensorflow as tf
from absl import logging
from tensorflow.python.eager import context as eager_context

from orbitask.trainers import compat, data_compat, run_experiment
from orbitask.trainers.run.controller import Controller
from orbitask.trainers.state import random_state
from tests.helpers import TinyTask


class _Adapter(Controller):
    """orbitask's Controller with none of its own options: it must be Orbit's."""


@pytest.mark.slow
def test_orbits_own_controller_test_passes_against_the_controller(monkeypatch):
    monkeypatch.setattr(orbit.controller_test.controller, "Controller", _Adapter)
    suite = unittest.defaultTestLoader.loadTestsFromModule(orbit.controller_test)
    assert suite.countTestCases() >= 30
    result = unittest.TextTestRunner(verbosity=0).run(suite)
    problems = [str(test) for test, _ in result.failures + result.errors]
    assert result.wasSuccessful(), problems


class _Trainer(orbit.StandardTrainer):
    def __init__(self):
        self.global_step = orbit.utils.create_global_step()
        self.v = tf.Variable(0.0)
        super().__init__(tf.data.Dataset.range(4).repeat())

    def train_step(self, iterator):
        next(iterator)
        self.v.assign_add(1.0)
        self.global_step.assign_add(1)

    def train_loop_end(self):
        return {"v": self.v.read_value()}


def test_a_checkpoint_saved_by_plain_tf_checkpoint_is_restored(tmp_path):
    trainer = _Trainer()
    trainer.v.assign(3.0)
    trainer.global_step.assign(7)
    tf.train.Checkpoint(v=trainer.v, step=trainer.global_step).save(str(tmp_path / "ckpt"))
    trainer.v.assign(0.0)
    trainer.global_step.assign(0)
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(v=trainer.v, step=trainer.global_step), str(tmp_path), 3
    )
    Controller(
        trainer=trainer, global_step=trainer.global_step, steps_per_loop=2,
        checkpoint_manager=manager, save_at_completion=True,
    )  # fmt: skip
    assert (trainer.v.numpy(), trainer.global_step.numpy()) == (3.0, 7)


def test_the_managers_init_fn_runs_when_there_is_no_checkpoint(tmp_path):
    trainer = _Trainer()
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(v=trainer.v),
        str(tmp_path),
        3,
        init_fn=lambda: trainer.v.assign(42.0),
    )
    Controller(
        trainer=trainer, global_step=trainer.global_step, steps_per_loop=2,
        checkpoint_manager=manager, checkpoint_interval=2,
    )  # fmt: skip
    assert trainer.v.numpy() == 42.0


class _RecordingManager(tf.train.CheckpointManager):
    """A real manager that also records the options of each save."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.options = []

    def save(self, *args, options=None, **kwargs):
        self.options.append(options)
        return super().save(*args, options=options, **kwargs)


@pytest.mark.parametrize("enabled", [False, True])
def test_async_checkpointing_is_passed_to_every_save(tmp_path, enabled):
    trainer = _Trainer()
    manager = _RecordingManager(tf.train.Checkpoint(v=trainer.v), str(tmp_path), 3)
    controller = Controller(
        trainer=trainer, global_step=trainer.global_step, steps_per_loop=2,
        checkpoint_manager=manager, checkpoint_interval=2, enable_async_checkpointing=enabled,
    )  # fmt: skip
    controller.train(4)
    assert len(manager.options) == 2
    assert [o.experimental_enable_async_checkpoint for o in manager.options] == [enabled] * 2
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-4")


def test_a_train_actions_dict_is_not_changed_after_it_received_it(tmp_path):
    trainer = _Trainer()
    received = []
    controller = Controller(
        trainer=trainer, global_step=trainer.global_step, steps_per_loop=2,
        train_actions=[lambda out: received.append((out, dict(out)))],
        summary_dir=str(tmp_path),
    )  # fmt: skip
    controller.train(4)
    assert len(received) == 2
    for kept, copy in received:
        assert kept == copy and "steps_per_second" not in kept


def test_orbits_private_controller_methods_keep_the_shape_the_controller_relies_on():
    """`Controller` overrides `_train_n_steps` and `_maybe_save_checkpoint` and calls `_require`
    and `_sync_on_async_checkpointing` (trainers/compat.py's docstring)."""
    expected = {
        "_train_n_steps": ["self", "num_steps"],
        "_maybe_save_checkpoint": ["self", "check_interval"],
        "_require": ["self", "attribute", "for_method"],
        "_sync_on_async_checkpointing": ["self"],
    }
    for name, parameters in expected.items():
        method = getattr(orbit.Controller, name)
        assert list(inspect.signature(method).parameters) == parameters, name
    # Orbit's public save_checkpoint reaches the override.
    assert "self._maybe_save_checkpoint(" in inspect.getsource(orbit.Controller.save_checkpoint)


def test_orbit_messages_go_to_absl_only_while_open():
    original = orbit.controller._log
    with compat.orbit_messages_to_absl():
        assert orbit.controller._log is logging.info
    assert orbit.controller._log is original


def test_gin_search_first_puts_paths_ahead(tmp_path):
    (tmp_path / "fragment.gin").write_text("")
    compat.gin_search_first([str(tmp_path)])
    assert gin.config._LOCATION_PREFIXES[0] == str(tmp_path)
    gin.parse_config_file("fragment.gin")


def test_manager_settings_reads_the_constructor_arguments(tmp_path):
    step = tf.Variable(0, dtype=tf.int64)
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(step=step), str(tmp_path), max_to_keep=7,
        keep_checkpoint_every_n_hours=2.0, checkpoint_name="model", step_counter=step,
        checkpoint_interval=5,
    )  # fmt: skip
    settings = compat.manager_settings(manager)
    assert settings.pop("step_counter") is step
    assert settings == dict(
        max_to_keep=7, keep_checkpoint_every_n_hours=2.0, checkpoint_name="model"
    )
    assert compat.checkpoint_prefix(manager) == str(tmp_path / "model")


class _Count(compat.FrozenAtAsyncSave):
    """A count whose `frozen_copy` is marked, so the test sees which one was written."""

    def __init__(self, count=0):
        self.count = count

    def serialize(self):
        return str(self.count)

    def deserialize(self, string_value):
        self.count = string_value.decode() if isinstance(string_value, bytes) else string_value

    def frozen_copy(self):
        return _Count(f"frozen {self.count}")


def test_an_async_write_saves_later_children_keras_variables_and_frozen_copies(tmp_path):
    import keras

    value, count = keras.Variable(0.0), _Count()
    checkpoint = tf.train.Checkpoint(value=value)
    checkpoint.count = count  # attached after construction: TensorFlow's writer omits it
    compat.enable_async_writes(checkpoint)
    options = tf.train.CheckpointOptions(enable_async=True)
    for n in (1, 2):  # the first save copies by another path; Keras 3 fails from the second
        value.assign(float(n))
        count.count = n
        checkpoint.write(str(tmp_path / f"ckpt-{n}"), options=options)
        value.assign(-1.0)  # after the save returned: not what it writes
        count.count = -1
        checkpoint.sync()
        assert compat.take_async_error(checkpoint) is None
    for n in (1, 2):
        restored_value, restored_count = keras.Variable(0.0), _Count()
        restored = tf.train.Checkpoint(value=restored_value, count=restored_count)
        restored.read(str(tmp_path / f"ckpt-{n}")).assert_existing_objects_matched()
        assert float(restored_value.numpy()) == float(n)
        assert restored_count.count == f"frozen {n}"


def test_dataset_helpers_see_an_autotuned_prefetch_under_options():
    base = tf.data.Dataset.range(10).batch(2)
    options = tf.data.Options()
    options.deterministic = True
    dataset = base.prefetch(tf.data.AUTOTUNE).with_options(options)
    top, kept = data_compat.strip_options(dataset)
    assert kept.deterministic is True
    assert data_compat.autotuned_prefetch_input(top) is not None
    assert data_compat.autotuned_prefetch_input(base.prefetch(3)) is None
    assert data_compat.dataset_inputs(top)[0] is data_compat.autotuned_prefetch_input(top)


def test_including_the_defaults_from_another_directory_logs_no_false_error(
    tmp_path, monkeypatch, caplog
):
    from orbitask.trainers.commands.train import parse_gin

    monkeypatch.chdir(tmp_path)
    with caplog.at_level("INFO"):
        parse_gin(["experiments/digits.gin"], [])
    assert not [r for r in caplog.records if "Path not found" in r.getMessage()]


def test_graph_ops_reach_into_conds_loops_and_called_functions():
    @tf.function
    def inner(x):
        return x + tf.random.normal([3])

    @tf.function
    def step(x):
        y = tf.cond(x[0] > 0, lambda: inner(x), lambda: x)
        for _ in tf.range(2):
            y += tf.random.uniform([3])
        return y

    graph = step.get_concrete_function(tf.TensorSpec([3])).graph
    kinds = {op.type for op in compat.graph_ops(graph)}
    assert {"RandomStandardNormal", "RandomUniform"} <= kinds, kinds


def jitter(x):
    return tf.cast(x, tf.float32) + tf.random.uniform([])


def test_dataset_graph_def_holds_the_map_functions_stateful_ops():
    graph_def = data_compat.dataset_graph_def(tf.data.Dataset.range(3).map(jitter))
    ops = {n.op for f in graph_def.library.function for n in f.node_def}
    assert "RandomUniform" in ops, ops


def test_dataset_functions_reach_every_traced_function_of_a_pipeline():
    """Through zips, interleaves (a `map` built inside), filters, options and prefetches, and
    into the functions those call; a pipeline made from a variant has unknown inputs: None."""
    inner = tf.data.Dataset.range(2).interleave(lambda i: tf.data.Dataset.range(i).map(jitter))
    odd = tf.data.Dataset.range(4).filter(lambda x: tf.cond(x > 1, lambda: True, lambda: False))
    dataset = tf.data.Dataset.zip(inner, odd).prefetch(2).with_options(tf.data.Options())
    names = {
        random_state._function_name(name)
        for top, graph in data_compat.dataset_functions(dataset)
        for name, _ in compat.function_graphs(graph, top)
    }
    assert {"jitter", "lambda", "cond_true", "cond_false"} <= names, names
    variant = tf.data.experimental.to_variant(tf.data.Dataset.range(3).map(jitter))
    from_variant = tf.data.experimental.from_variant(variant, tf.TensorSpec([], tf.float32))
    assert data_compat.dataset_functions(from_variant.map(lambda x: x + 1)) is None


def test_the_stateful_draw_check_copies_no_in_memory_data(monkeypatch):
    """The pipeline is not serialized (a `from_tensor_slices` source would be copied whole,
    and past 2 GB not at all); one made from a variant still is, and its ops are named."""
    data = tf.data.Dataset.from_tensor_slices(np.zeros((8, 4), np.float32)).map(jitter)
    serialized = []
    real = data_compat.dataset_graph_def
    monkeypatch.setattr(data_compat, "dataset_graph_def", lambda d: serialized.append(d) or real(d))
    assert random_state.unsaved_input_draws(data) == ["RandomUniform in jitter"]
    assert serialized == []
    variant = tf.data.experimental.to_variant(data)
    restored = tf.data.experimental.from_variant(variant, data.element_spec)
    assert random_state.unsaved_input_draws(restored) == ["RandomUniform in jitter"]
    assert len(serialized) == 1


def test_a_tf_keras_layers_generator_is_reached():
    import tf_keras

    from orbitask.common import keras_compat

    inputs = tf_keras.Input((3,))
    model = tf_keras.Model(inputs, tf_keras.layers.Dropout(0.5, name="drop")(inputs))
    layer = model.get_layer("drop")
    assert layer._random_generator._rng_type == keras_compat.LEGACY_DRAWS
    assert keras_compat.layer_generator(layer._random_generator) is None
    assert keras_compat.save_layer_draws(model, seed=3) == ["drop"]
    assert isinstance(keras_compat.layer_generator(layer._random_generator), tf.random.Generator)
    assert keras_compat.layer_generator(object()) is None
    assert keras_compat.save_layer_draws(model, seed=3) == []  # once


def test_host_random_state_kept_undoes_python_numpy_and_tf_op_seed_draws():
    """Inside: draws from `random`, NumPy's global generator and TensorFlow's op-seed sequence
    (an unseeded `shuffle` under a global seed takes one). After: the same draws again."""

    def draws():
        order = list(tf.data.Dataset.range(50).shuffle(50).take(10).as_numpy_iterator())
        return random.random(), float(np.random.rand()), tf.compat.v1.get_seed(None), order

    tf.random.set_seed(5)
    random.seed(5)
    np.random.seed(5)
    with compat.host_random_state_kept():
        inside = draws()
    after = draws()
    assert after == inside
    assert draws() != inside  # outside the context the draws move on


def test_host_random_state_kept_in_a_process_without_a_global_seed():
    """A fresh process has no `_rng` until `tf.random.set_seed`; one set inside is undone."""
    ctx = eager_context.context()
    saved = ctx._seed, getattr(ctx, "_rng", None)  # noqa: SLF001
    ctx._seed = None  # noqa: SLF001
    if hasattr(ctx, "_rng"):
        del ctx._rng  # noqa: SLF001
    try:
        with compat.host_random_state_kept():
            tf.random.set_seed(3)
        assert ctx._seed is None and not hasattr(ctx, "_rng")  # noqa: SLF001
    finally:
        ctx._seed, ctx._rng = saved  # noqa: SLF001


def test_a_run_on_two_replicas_leaves_no_custom_gradient_in_tensorflows_registry(tmp_path):
    """Each trace of a step on several replicas registers `ReplicaContext.all_reduce`'s custom
    gradient, which holds the step's graph; a run takes its own away when it ends, so a sweep
    of runs in one process does not keep every run's graphs."""
    from tensorflow.python.framework import ops

    registry = ops._gradient_registry._registry  # noqa: SLF001
    before = set(registry)
    settings = dict(train_steps=2, global_batch_size=8, progress=False, mode="train")
    run_experiment(TinyTask(), str(tmp_path), strategy="mirrored", **settings)
    assert [n for n in registry if n not in before] == []
