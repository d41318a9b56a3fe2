"""Model Garden tasks run as they are: official's MockTask, a Model-Garden-style classifier on 1
and 2 replicas, an ExperimentConfig's optimizer, the global-batch check, refusals, gin, and a
ported orbitask Task calling `self.process_metrics(metrics, labels, outputs)`, mixed_bfloat16."""

import dataclasses

import gin
import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from official.core import base_task, exp_factory, task_factory
from official.core import config_definitions as cfg
from official.utils.testing import mock_task

from orbitask.tasks import ModelGardenTask, MultiTask, Task
from orbitask.tasks.model_garden import GUIDE, ModelGardenTaskWithLogs
from orbitask.trainers import ConfigError, NanGuard, run_experiment
from orbitask.trainers.commands import train
from tests import launching
from tests.helpers import StepRecorder, TinyTask, checkpoint_weights

SGD_01 = {
    "optimizer": {"type": "sgd", "sgd": {"momentum": 0.0}},
    "learning_rate": {"type": "constant", "constant": {"learning_rate": 0.1}},
}


def mock_experiment(optimizer=None) -> cfg.ExperimentConfig:
    config = exp_factory.get_exp_config("mock")
    if optimizer:
        config.override({"trainer": {"optimizer_config": optimizer}})
    return config


def new_mock_task(model_dir) -> mock_task.MockTask:
    """official's MockTask, built as Model Garden's train_lib builds a task."""
    return task_factory.get_task(mock_experiment().task, logging_dir=str(model_dir))


# --------------------------------------------------------------- a Model-Garden-style classifier

X = np.random.RandomState(0).normal(size=(96, 6)).astype(np.float32)
Y = ((X[:, 0] + 2 * X[:, 1] > 0).astype(np.int32) + (X[:, 2] > 1)).astype(np.int32)


def _data(batch: int, training: bool) -> cfg.DataConfig:
    return cfg.DataConfig(global_batch_size=batch, is_training=training)


@dataclasses.dataclass
class ClassifierConfig(cfg.TaskConfig):
    train_data: cfg.DataConfig = dataclasses.field(default_factory=lambda: _data(8, True))
    validation_data: cfg.DataConfig = dataclasses.field(default_factory=lambda: _data(8, False))


class Classifier(base_task.Task):
    """A Model Garden task: TaskConfig/DataConfig, base_task's own train_step and
    validation_step, a mean loss. Rows 0-47 train (in order), rows 48-95 validate."""

    def __init__(self, params=None, logging_dir=None, name=None):
        super().__init__(params or ClassifierConfig(), logging_dir=logging_dir, name=name)
        self.replicas_seen = []  # (is_training, num_replicas_in_sync) per build_inputs call
        self.initialized = 0

    def build_model(self):
        init = tf_keras.initializers.GlorotUniform
        return tf_keras.Sequential(
            [
                tf_keras.Input((6,)),
                tf_keras.layers.Dense(8, "tanh", kernel_initializer=init(seed=1)),
                tf_keras.layers.Dense(3, kernel_initializer=init(seed=2)),
            ]
        )

    def build_inputs(self, params, input_context=None):
        rows = slice(0, 48) if params.is_training else slice(48, 96)
        ds = tf.data.Dataset.from_tensor_slices((X[rows], Y[rows]))
        if input_context and input_context.num_input_pipelines > 1:
            ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        batch = params.global_batch_size
        if input_context:
            batch = input_context.get_per_replica_batch_size(batch)
            self.replicas_seen.append((params.is_training, input_context.num_replicas_in_sync))
        ds = ds.repeat() if params.is_training else ds
        return ds.batch(batch, drop_remainder=params.is_training)

    def build_losses(self, labels, model_outputs, aux_losses=None):
        loss = tf_keras.losses.sparse_categorical_crossentropy(
            labels, model_outputs, from_logits=True
        )
        loss = tf.reduce_mean(loss)
        return loss + tf.add_n(aux_losses) if aux_losses else loss

    def build_metrics(self, training=True):
        return [tf_keras.metrics.SparseCategoricalAccuracy("accuracy")]

    def initialize(self, model):
        self.initialized += 1


class Seen(ModelGardenTask):
    """The adapter with a callback recording each step (`StepRecorder`) and the optimizer."""

    def __init__(self, task, **kwargs):
        super().__init__(task, **kwargs)
        self.seen = StepRecorder()
        self.optimizer = None

    def every_steps(self):
        def keep_optimizer(task, ctx):
            self.optimizer = ctx.optimizer

        return {1: [self.seen, keep_optimizer]}


def _mean_validation_loss(weights) -> float:
    model = Classifier().build_model()
    model.set_weights(weights)
    logits = model(X[48:], training=False)
    losses = tf_keras.losses.sparse_categorical_crossentropy(Y[48:], logits, from_logits=True)
    return float(tf.reduce_mean(losses))


# -------------------------------------------------------------------------------- tests


def test_mock_task_trains_resumes_exactly_and_evaluates(tmp_path):
    """official's MockTask as it is: train_and_eval, an interrupted run resumed ends with the
    weights of an uninterrupted one, and evaluation gives its own reduced logs plus the loss
    reduced as Model Garden's trainer reduces it (a mean over replicas and steps)."""
    assert type(ModelGardenTask(new_mock_task(tmp_path))) is ModelGardenTaskWithLogs
    # A subclass (adding callbacks) keeps the task's own log reduction behind its own methods.
    seen = Seen(new_mock_task(tmp_path))
    assert isinstance(seen, Seen) and isinstance(seen, ModelGardenTaskWithLogs)
    assert type(seen).__name__ == "Seen" and type(Seen(new_mock_task(tmp_path))) is type(seen)
    assert type(Seen(Classifier())) is Seen  # a task without its own reduction
    # Device loops of 3 steps in both runs: tf_keras Nadam keeps a Python counter that is baked
    # into each traced loop, so its update depends on the steps at which device loops start.
    settings = dict(
        mode="train_and_eval",
        global_batch_size=2,
        eval_steps=3,
        eval_interval=None,
        seed=0,
        steps_per_loop=3,
        loop_seconds=None,
        progress=False,
    )
    whole = tmp_path / "whole"
    logs = run_experiment(new_mock_task(whole), str(whole), train_steps=6, **settings)
    halves = tmp_path / "halves"
    run_experiment(new_mock_task(halves), str(halves), train_steps=3, **settings)
    resumed = run_experiment(new_mock_task(halves), str(halves), train_steps=6, **settings)

    expected = checkpoint_weights(new_mock_task(whole), whole)
    got = checkpoint_weights(new_mock_task(halves), halves)
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(a, b)
    bias = float(expected[1][0])
    assert bias < 1.0  # trained: the loss is the bias (the model's inputs are zeros)
    for run in (logs, resumed):
        assert run["eval"]["counter"] == 3.0  # MockTask's own reduce: a sum over 3 steps
        assert run["eval"]["loss"] == pytest.approx(bias, rel=1e-6)  # the mean, not the sum
        assert "acc" in run["eval"]
        assert run["train"]["loss"] == pytest.approx(float(logs["train"]["loss"]))


def test_a_subclass_keeps_the_tasks_own_aggregate_logs(tmp_path):
    """`Seen` adds a callback; MockTask's own reduction (a sum of `counter` over the steps)
    still gives the evaluation its `counter`."""
    settings = dict(global_batch_size=2, eval_steps=3, eval_interval=None, progress=False)
    logs = run_experiment(
        Seen(new_mock_task(tmp_path)), str(tmp_path), mode="train_and_eval", train_steps=1,
        **settings,
    )  # fmt: skip
    assert logs["eval"]["counter"] == 3.0


def test_experiment_config_optimizer_moves_weights_by_exactly_lr_times_gradient(tmp_path):
    """MockTask's loss is its Dense bias, whose gradient is exactly 1: SGD from the
    ExperimentConfig (rate 0.1) moves it by exactly -0.1 a step, and the run's rate is 0.1."""
    task = Seen(new_mock_task(tmp_path), experiment=mock_experiment(SGD_01))
    logs = run_experiment(
        task, str(tmp_path), mode="train", train_steps=3, global_batch_size=2, progress=False
    )
    assert isinstance(task.optimizer, tf_keras.optimizers.legacy.SGD)
    biases = [float(w[1][0]) for w in task.seen.column("weights")]
    assert biases == pytest.approx([0.9, 0.8, 0.7], rel=1e-6)
    assert task.seen.column("optimizer_lr") == pytest.approx([0.1] * 3)
    assert logs["train"]["learning_rate"] == pytest.approx(0.1)


def test_run_experiment_takes_the_experiment_config_beside_the_task(tmp_path, capsys):
    """As Model Garden's `train_lib.run_experiment(params=...)`: the config's SGD (rate 0.1), no
    wrapping, and no line about the seed's optimizer."""
    logs = run_experiment(
        new_mock_task(tmp_path), str(tmp_path), mode="train", train_steps=3, global_batch_size=2,
        progress=False, params=mock_experiment(SGD_01),
    )  # fmt: skip
    assert logs["train"]["learning_rate"] == pytest.approx(0.1)
    bias = float(checkpoint_weights(new_mock_task(tmp_path), tmp_path)[1][0])
    assert bias == pytest.approx(0.7, rel=1e-6)
    assert "defaults that change" not in capsys.readouterr().out
    with pytest.raises(ConfigError, match="Model Garden task as it is"):
        run_experiment(TinyTask(), str(tmp_path / "x"), train_steps=1, params=sgd_experiment())


SGD_DECAY = {
    "optimizer": {"type": "sgd", "sgd": {"momentum": 0.0}},
    "learning_rate": {
        "type": "polynomial",
        "polynomial": {"initial_learning_rate": 0.1, "decay_steps": 10, "end_learning_rate": 0.0},
    },
}


class RateSeen(ModelGardenTaskWithLogs):
    """Records each step's logged learning rate and MockTask's Dense bias."""

    def every_steps(self):
        def keep(task, ctx):
            self.rates.append(ctx.logs["learning_rate"])
            self.biases.append(float(ctx.model.weights[1].numpy()[0]))

        self.rates, self.biases = [], []
        return {1: keep}


def test_an_experiment_configs_schedule_sets_the_rate_and_the_logs_follow_it(tmp_path):
    """A decaying schedule from the ExperimentConfig drives the optimizer; the logged rate is
    the one each step used (0.1, 0.09, ...), and the bias (gradient 1) moves by exactly it."""
    task = RateSeen(new_mock_task(tmp_path), experiment=mock_experiment(SGD_DECAY))
    run_experiment(task, str(tmp_path), mode="train", train_steps=4, global_batch_size=2)
    expected = [0.1, 0.09, 0.08, 0.07]
    assert task.rates == pytest.approx(expected, rel=1e-5)
    assert task.biases == pytest.approx(list(1 - np.cumsum(expected)), rel=1e-5)


class Scored(RateSeen):
    """Each evaluation logs the next of `scores` as `score` (lower is better)."""

    scores = [3.0, 4.0, 5.0, 6.0]

    def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
        logs = super().reduce_aggregated_logs(aggregated_logs, global_step)
        logs["score"] = self.scores[int(global_step) // 2 - 1]
        return logs


def test_halving_on_a_worse_validation_scales_an_experiment_configs_schedule(tmp_path):
    """Evaluations at steps 2, 4 and 6 score 3, 4, 5: each worse one halves the schedule's
    rates (0.1, 0.09, 0.08, 0.07, then halves of 0.06, 0.05), the bias moves by exactly them,
    and a resumed run keeps the factor halved twice (quarters of 0.04, 0.03)."""
    from orbitask.trainers import ValidationControl

    settings = dict(
        mode="train_and_eval", global_batch_size=2, eval_interval=2, eval_steps=1,
        progress=False, validation_control=ValidationControl(metric="score"),
    )  # fmt: skip
    task = Scored(new_mock_task(tmp_path), experiment=mock_experiment(SGD_DECAY))
    run_experiment(task, str(tmp_path), train_steps=6, **settings)
    expected = [0.1, 0.09, 0.08, 0.07, 0.03, 0.025]
    assert task.rates == pytest.approx(expected, rel=1e-5)
    assert task.biases == pytest.approx(list(1 - np.cumsum(expected)), rel=1e-5)
    resumed = Scored(new_mock_task(tmp_path), experiment=mock_experiment(SGD_DECAY))
    run_experiment(resumed, str(tmp_path), train_steps=8, **settings)
    assert resumed.rates == pytest.approx([0.01, 0.0075], rel=1e-5)


def test_a_rate_for_an_optimizer_with_its_own_schedule_is_one_line(tmp_path):
    task = ModelGardenTask(new_mock_task(tmp_path), experiment=mock_experiment(SGD_DECAY))
    with pytest.raises(ConfigError, match="run_experiment.learning_rate is set, and the optimizer"):
        run_experiment(
            task, str(tmp_path), mode="train", train_steps=2, global_batch_size=2,
            learning_rate=0.01,
        )  # fmt: skip
    assert not list(tmp_path.glob("ckpt-*"))


def test_default_optimizer_and_initialize_on_a_fresh_run_only(tmp_path, capsys):
    first = Classifier()
    task = Seen(first)
    run_experiment(task, str(tmp_path), mode="train", train_steps=2, global_batch_size=8)
    said = [x for x in capsys.readouterr().out.splitlines() if "defaults that change" in x]
    assert len(said) == 1 and "Nadam(epsilon=0.001) with global-norm clipping at 10.0" in said[0]
    assert "without its ExperimentConfig" in said[0]
    assert isinstance(task.optimizer, tf_keras.optimizers.Nadam)  # the seed's default
    assert task.optimizer.epsilon == pytest.approx(1e-3)
    assert task.optimizer.global_clipnorm == pytest.approx(10.0)
    assert first.initialized == 1
    again = Classifier()
    run_experiment(again, str(tmp_path), mode="train", train_steps=4, global_batch_size=8)
    assert again.initialized == 0  # resumed: the checkpoint's weights are kept


@pytest.mark.slow
def test_classifier_trains_the_same_weights_on_one_device_and_two_replicas(tmp_path):
    """base_task's own train_step on two replicas (each divides its mean loss by 2, the optimizer
    sums) trains one device's weights; evaluation is one device loop whose loss is the mean."""
    assert type(ModelGardenTask(Classifier())) is ModelGardenTask  # keeps the default reduction
    runs = {}
    for strategy in ("one_device", "mirrored"):
        task = Classifier()
        model_dir = tmp_path / strategy
        logs = run_experiment(
            task,
            str(model_dir),
            mode="train_and_eval",
            train_steps=12,
            global_batch_size=8,
            eval_interval=None,
            strategy=strategy,
            progress=False,
        )
        replicas = 2 if strategy == "mirrored" else 1
        assert set(task.replicas_seen) == {(True, replicas), (False, replicas)}
        runs[strategy] = (checkpoint_weights(task, model_dir), logs)
    (one, one_logs), (two, two_logs) = runs["one_device"], runs["mirrored"]
    for a, b in zip(one, two, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert one_logs["train"]["loss"] == pytest.approx(two_logs["train"]["loss"], rel=1e-5)
    for weights, logs in ((one, one_logs), (two, two_logs)):
        assert logs["eval"]["loss"] == pytest.approx(_mean_validation_loss(weights), rel=1e-5)
        assert 0.0 <= logs["eval"]["accuracy"] <= 1.0


def test_a_different_global_batch_is_one_line_before_any_work(tmp_path):
    model_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as raised:
        run_experiment(Classifier(), str(model_dir), mode="train", train_steps=2)
    message = str(raised.value).splitlines()[0]  # gin adds a line naming the configurable
    assert "task_config.train_data.global_batch_size is 8" in message
    assert "set orbitask.run_experiment.global_batch_size = 8" in message
    assert not model_dir.exists()


def test_batches_that_ignore_the_input_context_are_one_line(tmp_path):
    """MockTask batches 2 whatever the replicas: on 2 replicas each would get 2, not 1."""
    with pytest.raises(ConfigError, match=r"MockTask.build_inputs yields batches of 2 but the "):
        run_experiment(
            new_mock_task(tmp_path),
            str(tmp_path),
            mode="train",
            train_steps=2,
            global_batch_size=2,
            strategy="mirrored",
        )


def test_a_model_garden_task_trains_under_mixed_bfloat16(tmp_path):
    """Its model computes in bfloat16 with float32 variables, its own train_step trains about
    the float32 run's weights, and the evaluation loss is the weights' mean validation loss."""

    class KeepModel(Seen):
        def every_steps(self):
            def keep_model(task, ctx):
                self.model = ctx.model

            return {**super().every_steps(), 12: keep_model}

    runs = {}
    for policy in ("float32", "mixed_bfloat16"):
        task = KeepModel(Classifier())
        model_dir = tmp_path / policy
        logs = run_experiment(
            task, str(model_dir), mode="train_and_eval", train_steps=12, global_batch_size=8,
            eval_interval=None, mixed_precision=None if policy == "float32" else policy,
            progress=False,
        )  # fmt: skip
        assert [layer.compute_dtype for layer in task.model.layers] == [policy.split("_")[-1]] * 2
        assert {v.dtype for v in task.model.weights} == {tf.float32}
        runs[policy] = (checkpoint_weights(task, model_dir), logs)
    (full, _), (half, half_logs) = runs["float32"], runs["mixed_bfloat16"]
    for a, b in zip(full, half, strict=True):
        np.testing.assert_allclose(a, b, rtol=0.05, atol=0.01)
    assert half_logs["eval"]["loss"] == pytest.approx(_mean_validation_loss(half), rel=0.02)
    assert half_logs["train"]["loss"] != runs["float32"][1]["train"]["loss"]


@pytest.mark.parametrize(
    "setting",
    [
        {"nan_guard": NanGuard()},
        {"gradient_accumulation_steps": 2},
        {"mixed_precision": "mixed_float16"},
    ],
    ids=lambda s: next(iter(s)),
)
def test_features_a_model_garden_step_cannot_serve_name_the_guide(tmp_path, setting):
    name = next(iter(setting))
    with pytest.raises(ConfigError, match=rf"run_experiment.{name} .*\({GUIDE}\)\.\n"):
        run_experiment(Classifier(), str(tmp_path), train_steps=2, global_batch_size=8, **setting)
    with pytest.raises(ConfigError, match=rf"is a Model Garden task; .*\({GUIDE}\)"):
        MultiTask(tasks={"digits": Classifier()})


@gin.configurable("mg_test.classifier_config")
def classifier_config(global_batch_size: int = 8) -> ClassifierConfig:
    return ClassifierConfig(train_data=_data(global_batch_size, True))


@gin.configurable("mg_test.sgd_experiment")
def sgd_experiment() -> cfg.ExperimentConfig:
    return mock_experiment(SGD_01)


gin.external_configurable(Classifier, "Classifier", module="mg_test")


def test_gin_binds_a_model_garden_task_and_its_experiment(tmp_path):
    (tmp_path / "mg.gin").write_text(
        "\n".join(
            [
                "include 'configs/defaults.gin'",
                "TASK = @mg_test.Classifier()",
                "mg_test.Classifier.params = @mg_test.classifier_config()",
                "mg_test.classifier_config.global_batch_size = 16",
                "orbitask.ModelGardenTask.experiment = @mg_test.sgd_experiment()",
                "orbitask.run_experiment.global_batch_size = 16",
                "TRAIN_STEPS = 3",
            ]
        )
    )
    train.parse_gin([str(tmp_path / "mg.gin")], [])
    logs = run_experiment(model_dir=str(tmp_path / "run"), mode="train", progress=False)
    assert logs["train"]["learning_rate"] == pytest.approx(0.1)  # the experiment's SGD
    assert np.isfinite(logs["train"]["loss"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "cluster, strategy",
    [(["--ps", "1"], "ParameterServerStrategy"), ([], "CollectiveAllReduceStrategy")],
    ids=["parameter_server", "multi_worker_mirrored"],
)
def test_a_model_garden_task_trains_and_evaluates_on_several_workers(tmp_path, cluster, strategy):
    """Through the launcher (2 workers, and a ps with a chief): each worker builds the task's
    input from its DataConfig and its own input_context, the task's own train_step runs there,
    and the evaluation loss is the mean validation loss of the checkpoint's weights. Under
    multi_worker_mirrored the sharded input trains one device's weights."""
    gin_file = tmp_path / "mg.gin"
    gin_file.write_text(
        "\n".join(
            [
                "include 'configs/defaults.gin'",
                "import tests.test_model_garden",
                "TASK = @mg_test.Classifier()",
                "orbitask.run_experiment.global_batch_size = 8",
                "TRAIN_STEPS = 40",
            ]
        )
    )
    model = tmp_path / "model"
    flags = [f"--gin_file={gin_file}", f"--model_dir={model}", "--mode=train_and_eval"]
    flags.append("--gin_params=orbitask.run_experiment.progress = False")
    status, text = launching.run(["--workers", "2", *cluster], flags, tmp_path)
    assert status == 0, text[-3000:]
    chief = "chief" if cluster else "worker 0"
    assert f"[{chief}] orbitask: {strategy}" in text
    assert f"[{chief}] step 40: loss" in text
    weights = checkpoint_weights(Classifier(), model)
    assert launching.eval_scalars(model, "loss") == {
        40: pytest.approx(_mean_validation_loss(weights), rel=1e-5)
    }
    if strategy == "CollectiveAllReduceStrategy":  # worker w's shard holds rows w, w + 2, ...
        one = tmp_path / "one_device"
        run_experiment(Classifier(), str(one), train_steps=40, global_batch_size=8, progress=False)
        for a, b in zip(weights, checkpoint_weights(Classifier(), one), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)  # one device's batches


class Ported(TinyTask):
    """An orbitask Task with Model Garden's step: it calls `self.process_metrics(metrics, labels,
    outputs)`, the base class's, as a ported Model Garden train_step does."""

    def train_step(self, batch, model, optimizer, metrics=None, *, loss_fn, lr, global_batch_size):
        features, labels = batch
        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        with tf.GradientTape() as tape:
            outputs = model(features, training=True)
            loss = loss_fn((outputs, labels)) / global_batch_size
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        self.process_metrics(metrics, labels, outputs)
        return {self.loss: loss * replicas}


def test_a_ported_step_calling_process_metrics_with_labels_trains(tmp_path):
    logs = run_experiment(
        Ported(),
        str(tmp_path),
        mode="train_and_eval",
        train_steps=20,
        global_batch_size=8,
        learning_rate=0.05,
        eval_interval=None,
        progress=False,
    )
    assert 0.5 < logs["train"]["accuracy"] <= 1.0
    assert 0.5 < logs["eval"]["accuracy"] <= 1.0
    assert Task.loss == "loss" and "loss" in logs["train"]
