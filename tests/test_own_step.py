"""A task whose train_step is its own owns its batch, its model and its loss: no build_losses, no
(inputs, labels) batches, and no Input layer needed (a dry step builds the weights)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from orbitask import ConfigError, Task, run_experiment


class OwnStep(Task):
    """Dict batches, a model without an Input layer, a loss inside the step."""

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        rng = np.random.RandomState(0)
        x = rng.normal(size=(64, 5)).astype(np.float32)
        ds = tf.data.Dataset.from_tensor_slices({"x": x, "y": x.sum(axis=1, keepdims=True)})
        return ds.repeat().batch(per_replica_batch_size, drop_remainder=True)

    def build_model(self):
        self.model = keras.Sequential([keras.layers.Dense(8, "tanh"), keras.layers.Dense(1)])
        return self.model

    def build_optimizer(self, learning_rate):
        return keras.optimizers.SGD(0.05)

    def build_metrics(self, training=True):
        return [keras.metrics.Sum("steps_seen")]

    def train_step(self, batch, model, optimizer, metrics=None, *, loss_fn, lr, global_batch_size):
        with tf.GradientTape() as tape:
            error = model(batch["x"], training=True) - batch["y"]
            loss = tf.nn.compute_average_loss(
                tf.square(error[:, 0]), global_batch_size=global_batch_size
            )
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        metrics[0].update_state(1.0)
        return {"loss": loss}

    replica_logs = "sum"

    def every_steps(self):
        return {}


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_a_step_of_its_own_trains_without_the_default_steps_demands(tmp_path, strategy):
    task = OwnStep()
    logs = run_experiment(
        task, str(tmp_path), mode="train", train_steps=30, global_batch_size=8,
        strategy=strategy, progress=False, loop_seconds=None, steps_per_loop=30,
    )  # fmt: skip
    assert task.model.built and len(task.model.trainable_variables) == 4
    assert np.isfinite(logs["train"]["loss"]) and logs["train"]["loss"] < 1.0
    replicas = 2 if strategy == "mirrored" else 1
    assert logs["train"]["steps_seen"] == 30.0 * replicas  # the loop's steps, not the dry step


class Sampling(keras.layers.Layer):
    """The Keras VAE example's layer: noise from a `SeedGenerator`, drawn in every call."""

    def __init__(self):
        super().__init__()
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, inputs):
        return inputs + keras.random.normal(tf.shape(inputs), seed=self.seed_generator)


class DrawsAndStatistics(OwnStep):
    """OwnStep's step on a model without an Input layer that draws (noise, dropout) and keeps
    BatchNorm statistics: the dry step that builds it must leave no trace."""

    def build_model(self):
        self.model = keras.Sequential(
            [
                keras.layers.Dense(8, "tanh"),
                keras.layers.BatchNormalization(),
                Sampling(),
                keras.layers.Dropout(0.5, seed=3),
                keras.layers.Dense(1),
            ]
        )
        self.generators = [self.model.layers[2].seed_generator, self.model.layers[3].seed_generator]
        self.initial_states = [g.state.numpy() for g in self.generators]
        return self.model

    def on_train_begin(self, ctx):
        norm = self.model.layers[1]
        self.statistics = [norm.moving_mean.numpy(), norm.moving_variance.numpy()]
        self.states = [g.state.numpy() for g in self.generators]


class DrawsWithTheDefaultStep(DrawsAndStatistics):
    """The same model through the default step and its validation step, on (x, y) batches:
    the checks before step 1 call the model (its noise draws in every call)."""

    train_step = Task.train_step
    validation_step = Task.validation_step

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ds = super().build_inputs(per_replica_batch_size, input_context, training)
        ds = ds.map(lambda b: (b["x"], b["y"]))
        return ds if training else ds.take(2)

    def build_losses(self):
        return lambda loss_input: tf.reduce_sum(tf.square(loss_input[0] - loss_input[1]), 1)


@pytest.mark.parametrize(
    "kind,strategy",
    [(DrawsAndStatistics, "one_device"), (DrawsAndStatistics, "mirrored"),
     (DrawsWithTheDefaultStep, "one_device")],
)  # fmt: skip
def test_the_calls_before_step_1_are_taken_back(tmp_path, kind, strategy):
    """Step 1 starts from unused generators and BatchNorm's initial statistics, after the dry
    step that builds the weights, or the checks of the first training and validation batches."""
    task = kind()
    mode = "train" if kind is DrawsAndStatistics else "train_and_eval"  # its step only trains
    run_experiment(
        task, str(tmp_path), mode=mode, train_steps=2, global_batch_size=8,
        strategy=strategy, progress=False, eval_interval=2,
    )  # fmt: skip
    for initial, state in zip(task.initial_states, task.states, strict=True):
        np.testing.assert_array_equal(initial, state)
    np.testing.assert_array_equal(task.statistics[0], np.zeros(8))
    np.testing.assert_array_equal(task.statistics[1], np.ones(8))


class LogsAMetricsName(OwnStep):
    """Its step logs `steps_seen`, the name of its metric."""

    def train_step(self, batch, model, optimizer, metrics=None, *, loss_fn, lr, global_batch_size):
        logs = super().train_step(
            batch, model, optimizer, metrics, loss_fn=loss_fn, lr=lr,
            global_batch_size=global_batch_size,
        )  # fmt: skip
        return {**logs, "steps_seen": logs["loss"]}


def test_a_step_log_named_as_a_metric_is_refused_in_one_line(tmp_path):
    refused = r"^LogsAMetricsName's train step logs 'steps_seen', the name of one of its build"
    with pytest.raises(ConfigError, match=refused):
        run_experiment(
            LogsAMetricsName(), str(tmp_path), mode="train", train_steps=2, global_batch_size=8,
            progress=False,
        )  # fmt: skip
    assert not list(tmp_path.glob("ckpt-*"))


class ModelGardenSignatures(OwnStep):
    """Model Garden's step signatures, as its users write them: no orbitask keywords."""

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ds = super().build_inputs(per_replica_batch_size, input_context, training)
        return ds if training else ds.take(4)

    def train_step(self, inputs, model, optimizer, metrics=None):
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        with tf.GradientTape() as tape:
            error = model(inputs["x"], training=True) - inputs["y"]
            loss = tf.reduce_mean(tf.square(error))
            scaled_loss = loss / replicas  # Model Garden's division by the replicas
        variables = model.trainable_variables
        grads = tape.gradient(scaled_loss, variables)
        optimizer.apply_gradients(zip(grads, variables, strict=True))
        if metrics:
            metrics[0].update_state(1.0)
        return {self.loss: loss}

    def validation_step(self, inputs, model, metrics=None):
        error = model(inputs["x"], training=False) - inputs["y"]
        return {self.loss: tf.reduce_mean(tf.square(error))}

    replica_logs = "mean"


class TakesSomeKeywords(ModelGardenSignatures):
    """A step that declares one of orbitask's keywords gets it; `**kwargs` gets all."""

    seen = {}

    def train_step(self, inputs, model, optimizer, metrics=None, *, global_batch_size):
        self.seen["train"] = global_batch_size
        return super().train_step(inputs, model, optimizer, metrics)

    def validation_step(self, inputs, model, metrics=None, **kwargs):
        self.seen["validation"] = sorted(kwargs)
        return super().validation_step(inputs, model, metrics)


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_model_garden_step_signatures_train_and_evaluate(tmp_path, strategy):
    runs = {}
    for kind in (ModelGardenSignatures, TakesSomeKeywords):
        task = kind()
        logs = run_experiment(
            task, str(tmp_path / kind.__name__), mode="train_and_eval", train_steps=10,
            global_batch_size=8, strategy=strategy, progress=False, steps_per_loop=5,
            eval_interval=10, seed=0,
        )  # fmt: skip
        assert np.isfinite(logs["eval"]["loss"]) and np.isfinite(logs["train"]["loss"])
        runs[kind] = [np.asarray(w) for w in task.model.weights]
    for got, want in zip(runs[TakesSomeKeywords], runs[ModelGardenSignatures], strict=True):
        np.testing.assert_array_equal(got, want)
    assert TakesSomeKeywords.seen == {"train": 8, "validation": ["loss_fn", "lr"]}
