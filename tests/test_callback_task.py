"""A program written for the seed runs unchanged through `CallbackTask`.

The seed's functions and their `Task` methods: docs/porting_from_seed.md.
"""

import glob
import math
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from orbitask.tasks import CallbackTask
from orbitask.trainers import run_experiment
from tests import seed_program

SEED_FUNCTIONS = (
    "create_dataset",
    "create_model",
    "create_loss",
    "create_opt",
    "create_ckpt",
    "input_pre",
    "loss_pre",
    "grad_pre",
    "update_pre",
)


def _task(construction):
    if construction == "from_namespace":
        return CallbackTask.from_namespace(seed_program)
    fns = {name: getattr(seed_program, name) for name in SEED_FUNCTIONS}
    return CallbackTask(**fns, every_steps=seed_program.every_steps, at_step=seed_program.at_step)


def _run(task, model_dir, strategy="one_device"):
    seed_program.reset()
    return run_experiment(
        task,
        str(model_dir),
        mode="train",
        train_steps=20,
        global_batch_size=8,
        learning_rate=0.05,
        steps_per_loop=4,
        strategy=strategy,
        progress=False,
    )


def _scalars(logdir, tag):
    """`[(step, value)]` of one scalar tag in every event file under `logdir`."""
    points = []
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == tag:
                    number = (
                        tf.make_ndarray(value.tensor)
                        if value.HasField("tensor")
                        else value.simple_value
                    )
                    points.append((event.step, float(number)))
    return sorted(points)


def _check_seed_run(task, tmp_path, replicas):
    results = _run(task, tmp_path, strategy="one_device" if replicas == 1 else "mirrored")
    every = seed_program.CALLS["every"]
    assert [call["step"] for call in every] == [5, 10, 15, 20]
    assert seed_program.CALLS["at"] == [7]

    first = every[0]
    assert isinstance(first["dev"], tf.distribute.Strategy)
    assert first["dev"].num_replicas_in_sync == replicas
    assert isinstance(first["train_model"], keras.Sequential)
    assert isinstance(first["train_loss"], seed_program.SumCrossEntropy)
    assert isinstance(first["optimizer"], keras.optimizers.Nadam)
    assert float(first["optimizer"].epsilon) == pytest.approx(1e-3)
    assert isinstance(first["lr"], tf.Variable)
    assert float(first["lr"].numpy()) == pytest.approx(0.05)
    assert isinstance(first["ckpt"], tf.train.Checkpoint)
    assert isinstance(first["manager"], tf.train.CheckpointManager)
    # The step's tensors, per replica as the seed's `dev.run` gave them.
    update_gradients, output, batch, display_gradients, gradients = first["step_tensors"]
    local = first["dev"].experimental_local_results
    assert [int(o.shape[0]) for o in local(output)] == [8 // replicas] * replicas
    assert [int(x.shape[0]) for x in local(batch[0])] == [8 // replicas] * replicas
    variables = first["train_model"].trainable_variables
    for grads in (gradients, update_gradients, display_gradients):
        assert [tuple(local(g)[0].shape) for g in grads] == [tuple(v.shape) for v in variables]
    for copies in map(local, gradients):  # all-reduced: each replica holds the same sum
        np.testing.assert_allclose(copies[-1], copies[0])

    losses = [call["loss"] for call in every]
    assert all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < losses[0]
    assert results["train"]["loss"] == pytest.approx(losses[-1])

    # The seed's `tf.summary.scalar("my_loss", loss)` (no step, no writer) lands in TensorBoard.
    points = _scalars(str(tmp_path / "train"), "my_loss")
    assert [step for step, _ in points] == [5, 10, 15, 20]
    assert [value for _, value in points] == pytest.approx(losses)

    latest = tf.train.latest_checkpoint(str(tmp_path))
    assert latest is not None and latest.endswith("ckpt-20")
    # The checkpoint has the seed's create_ckpt layout: the model restores under `train_model`.
    trained = [np.asarray(v) for v in first["train_model"].weights]
    restored = seed_program.create_model()
    initial = [np.asarray(v) for v in restored.weights]
    status = tf.train.Checkpoint(train_model=restored).read(latest)
    status.expect_partial().assert_existing_objects_matched()
    for got, want, before in zip(restored.weights, trained, initial, strict=True):
        np.testing.assert_array_equal(np.asarray(got), want)
        assert not np.array_equal(before, want)  # training moved every weight


@pytest.mark.parametrize("construction", ["from_namespace", "keywords"])
def test_seed_program_runs_unchanged(tmp_path, capfd, construction):
    _check_seed_run(_task(construction), tmp_path, replicas=1)
    # The seed callback's tf.print reached the console.
    assert "seed step 5 loss" in capfd.readouterr().err


def test_seed_program_on_two_replicas(tmp_path):
    _check_seed_run(CallbackTask.from_namespace(seed_program), tmp_path, replicas=2)


def test_missing_seed_functions_are_named():
    with pytest.raises(TypeError, match=r"function\(s\) create_dataset, create_loss;"):
        CallbackTask(create_model=seed_program.create_model)
    with pytest.raises(
        TypeError, match=r"function\(s\) create_dataset, create_model, create_loss;"
    ):
        CallbackTask.from_namespace({"create_opt": seed_program.create_opt})


def test_non_callable_seed_function_is_named():
    with pytest.raises(TypeError, match="`create_opt` must be callable; received 3"):
        CallbackTask(
            create_dataset=seed_program.create_dataset,
            create_model=seed_program.create_model,
            create_loss=seed_program.create_loss,
            create_opt=3,
        )


def test_bad_callback_table_key_is_named():
    with pytest.raises(ValueError, match="`every_steps` keys must be positive integers.*0"):
        CallbackTask.from_namespace(seed_program, every_steps={0: seed_program.log_loss})


class PerExampleCrossEntropy(tf.Module):
    """The seed's loss written with reduction "none": per-example losses, shape [batch]."""

    def __call__(self, inputs):
        output, gt = inputs
        return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")(
            gt, output
        )


def test_a_seed_program_with_per_example_losses_runs_unchanged(tmp_path):
    fns = {name: getattr(seed_program, name) for name in SEED_FUNCTIONS}
    summed = _run(CallbackTask(**fns), tmp_path / "summed")
    fns["create_loss"] = PerExampleCrossEntropy
    per_example = _run(CallbackTask(**fns), tmp_path / "per_example")
    assert per_example["train"]["loss"] == pytest.approx(summed["train"]["loss"], rel=1e-5)


class FreezingSeedProgram:
    """The seed README's freeze: an `at_step` callback sets `train_model.layers[0].trainable =
    False`; `record` keeps both layers' kernels after each step it is due at. Seed callbacks
    take the step's tensors (each step they are due at runs apart to keep them); the `native_`
    ones are orbitask callbacks that take none."""

    def __init__(self):
        self.kernels = {}

    def freeze(self, dev, step, update_gradients, loss, output, batch, train_model, *rest):
        train_model.layers[0].trainable = False

    def record(self, dev, step, update_gradients, loss, output, batch, train_model, *rest):
        self.kernels[int(step)] = [np.asarray(layer.kernel) for layer in train_model.layers]

    def native_freeze(self, task, ctx):
        ctx.model.layers[0].trainable = False

    def native_record(self, task, ctx):
        self.kernels[ctx.step] = [np.asarray(layer.kernel) for layer in ctx.model.layers]


class PlainCallbackTask(CallbackTask):
    def __init__(self, program, **fns):
        super().__init__(**fns)
        self.program = program

    def every_steps(self):
        return {3: self.program.native_record}

    def at_step(self):
        return {6: self.program.native_freeze}


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("tensors", [True, False], ids=["tensor_callbacks", "plain_callbacks"])
def test_a_layer_frozen_by_a_seed_callback_stops_training(tmp_path, replicas, tensors):
    program = FreezingSeedProgram()
    fns = {name: getattr(seed_program, name) for name in SEED_FUNCTIONS}
    if tensors:
        task = CallbackTask(**fns, every_steps={3: program.record}, at_step={6: program.freeze})
    else:
        task = PlainCallbackTask(program, **fns)
    run_experiment(
        task,
        str(tmp_path),
        mode="train",
        train_steps=12,
        global_batch_size=8,
        learning_rate=0.05,
        steps_per_loop=4,
        strategy="one_device" if replicas == 1 else "mirrored",
        progress=False,
    )
    kernels = program.kernels
    assert sorted(kernels) == [3, 6, 9, 12]
    assert not np.array_equal(kernels[3][0], kernels[6][0])  # trained up to step 6
    for step in (9, 12):
        np.testing.assert_array_equal(kernels[step][0], kernels[6][0])  # frozen after it
        assert not np.array_equal(kernels[step][1], kernels[step - 3][1])  # the rest trains
