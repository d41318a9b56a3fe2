"""Checkpoints shared with Model Garden, both ways, with its own `SentencePredictionTask` (a
1-layer BERT of hidden size 16, 32 tiny examples, 4 steps).

orbitask's checkpoint of a `ModelGardenTask` also holds Model Garden's names (`global_step`,
`model`, `optimizer`, the model's `checkpoint_items`): `train_lib.run_experiment(mode="eval")`
and `task.initialize` read it. A model directory of `train_lib.run_experiment` is evaluated,
resumed and warm-started from by orbitask with its weights, step and optimizer. A subclass of
`ModelGardenTask`, even one that builds its task inside `__init__`, keeps the task's own
metrics, log reduction, `process_metrics` and `initialize`.
"""

import shutil

import numpy as np
import pytest
import tensorflow as tf
from official.core import base_task, train_lib
from official.nlp.tasks import sentence_prediction

from orbitask.tasks import ModelGardenTask
from orbitask.trainers import ConfigError, WarmStart, run_experiment
from orbitask.trainers.engine.determinism import make_deterministic
from tests.helpers import checkpoint_weights, weights
from tests.test_model_garden_real import _sentences, bert_experiment

STEPS = 4
RUN = dict(global_batch_size=4, seed=0, progress=False)
# Every test here shares `runs` (a BERT trained by Model Garden and by orbitask, about a minute).
pytestmark = pytest.mark.slow

FROM_MODEL_GARDEN = "was written by Model Garden's trainer: restored its model, optimizer and"


def experiment(data_path, **trainer):
    config = bert_experiment(data_path)
    config.override({"trainer": {"summary_interval": 1, "validation_steps": -1, **trainer}})
    return config


def mg_task(data_path, **task):
    config = experiment(data_path)
    config.override({"task": task})
    return sentence_prediction.SentencePredictionTask(config.task)


def orbitask_task(data_path, **kwargs):
    return ModelGardenTask(mg_task(data_path), experiment=experiment(data_path), **kwargs)


def model_garden(data_path, model_dir, mode, steps=STEPS):
    """Model Garden's `train_lib` runner, unchanged (loops of one step, a checkpoint at `steps`,
    seeds set as orbitask's `seed=0` sets them). Returns its model, its eval logs after the mode
    (`run_post_eval`) and its global step."""
    config = experiment(data_path, train_steps=steps, steps_per_loop=1, checkpoint_interval=steps)
    make_deterministic(0)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        task = sentence_prediction.SentencePredictionTask(config.task)
    runner = train_lib.OrbitExperimentRunner(
        strategy, task, mode, config, str(model_dir), run_post_eval=True, save_summary=False
    )
    model, logs = runner.run()
    return model, logs, int(runner.trainer.global_step.numpy())


def _close(orbitask_logs, mg_logs):
    """orbitask's eval logs against Model Garden's (`validation_loss` is orbitask's `loss`)."""
    assert orbitask_logs["loss"] == pytest.approx(float(mg_logs["validation_loss"]), rel=1e-6)
    for name in ("cls_accuracy", "auc"):
        assert orbitask_logs[name] == pytest.approx(float(mg_logs[name]), rel=1e-6)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The data, orbitask's run (train and evaluate, STEPS steps) and Model Garden's (train
    STEPS steps, then evaluate). Returns (data path, orbitask's model_dir and eval logs, Model
    Garden's model_dir and eval logs)."""
    root = tmp_path_factory.mktemp("shared")
    data_path = _sentences(root / "train.tfrecord")
    ours = root / "orbitask"
    logs = run_experiment(
        orbitask_task(data_path), str(ours), mode="train_and_eval", train_steps=STEPS,
        eval_interval=STEPS, **RUN,
    )  # fmt: skip
    theirs = root / "model_garden"
    _, mg_logs, _ = model_garden(data_path, theirs, "train")
    return data_path, ours, logs["eval"], theirs, mg_logs


@pytest.mark.slow
def test_model_gardens_eval_mode_evaluates_an_orbitask_model_dir(runs, tmp_path):
    """`train_lib.run_experiment(mode="eval")` on orbitask's model_dir restores the trained
    weights (its `model` and `global_step`) and gives orbitask's eval numbers."""
    data_path, ours, logs, _, _ = runs
    shutil.copytree(ours, tmp_path / "ours")
    model, mg_logs, step = model_garden(data_path, tmp_path / "ours", "eval")
    assert step == STEPS
    _close(logs, mg_logs)
    expected = checkpoint_weights(orbitask_task(data_path), ours)
    for a, b in zip(expected, weights(model), strict=True):
        np.testing.assert_array_equal(a, b)


def _items(model) -> dict:
    """The weights of each of the model's `checkpoint_items` (the encoder, the pooler)."""
    return {name: weights(item) for name, item in model.checkpoint_items.items()}


def test_model_gardens_initialize_reads_an_orbitask_checkpoint(runs):
    """`init_checkpoint` at orbitask's model_dir: the task's own `initialize` loads its
    encoder, and base_task's every item of `checkpoint_items`, by Model Garden's names."""
    data_path, ours, _, _, _ = runs
    trained = mg_task(data_path).build_model()
    tf.train.Checkpoint(train_model=trained).read(tf.train.latest_checkpoint(ours)).expect_partial()
    expected = _items(trained)
    task = mg_task(data_path, init_checkpoint=str(ours))
    for initialize, names in (
        (task.initialize, ["encoder"]),
        (lambda m: base_task.Task.initialize(task, m), sorted(expected)),
    ):
        model = task.build_model()
        initialize(model)
        got = _items(model)
        for name in names:
            for a, b in zip(expected[name], got[name], strict=True):
                np.testing.assert_array_equal(a, b)
    assert len(expected) == 2  # the encoder and the classifier's pooler


def test_orbitask_evaluates_a_model_garden_model_dir(runs, tmp_path, capsys):
    """orbitask's `mode="eval"` on `train_lib`'s model_dir restores its model and step and
    gives Model Garden's eval numbers; one warning says what the checkpoint did not hold."""
    data_path, _, _, theirs, mg_logs = runs
    shutil.copytree(theirs, tmp_path / "theirs")
    logs = run_experiment(
        orbitask_task(data_path), str(tmp_path / "theirs"), mode="eval", train_steps=STEPS, **RUN
    )
    _close(logs["eval"], mg_logs)
    out = capsys.readouterr().out
    assert f"{FROM_MODEL_GARDEN} global step" in out
    assert f"resumed from {tmp_path / 'theirs' / 'ckpt-4'} (step 4)" in out


@pytest.mark.slow
def test_a_model_garden_checkpoint_of_another_model_is_refused_in_one_line(runs, tmp_path):
    """A checkpoint as Model Garden's trainer writes it, of a 2-layer encoder, in the model_dir
    of this 1-layer one: one line naming it and what it holds that this run lacks."""
    data_path, _, _, _, _ = runs
    bigger = mg_task(data_path, model={"encoder": {"bert": {"num_layers": 2}}})
    model = bigger.build_model()
    config = experiment(data_path)
    optimizer = bigger.create_optimizer(config.trainer.optimizer_config, config.runtime)
    variables = model.trainable_variables  # a zero step creates the optimizer's variables
    optimizer.apply_gradients([(tf.zeros_like(v), v) for v in variables])
    step = tf.Variable(STEPS, dtype=tf.int64)
    items = dict(model.checkpoint_items)
    checkpoint = tf.train.Checkpoint(global_step=step, model=model, optimizer=optimizer, **items)
    tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=1).save(STEPS)
    refused = r"ckpt-4 does not restore this run completely: it holds 16 this run does not "
    with pytest.raises(ConfigError, match=refused + r"have \(encoder/layer_with_weights-5/"):
        run_experiment(
            orbitask_task(data_path), str(tmp_path), mode="eval", train_steps=STEPS, **RUN
        )


@pytest.mark.slow
def test_orbitask_resumes_a_model_garden_model_dir_as_model_garden_does(runs, tmp_path, capsys):
    """Resumed to step 6 from `train_lib`'s checkpoint at step 4, orbitask trains the weights
    that Model Garden's own resume trains: model, optimizer (momentum) and step are restored,
    and the input starts from its beginning in both (Model Garden saves no input position).
    Its dropout draws as tf_keras' own, as Model Garden's (`save_layer_draws=False`)."""
    data_path, _, _, theirs, _ = runs
    for name in ("mg", "ours"):
        shutil.copytree(theirs, tmp_path / name)
    model, _, _ = model_garden(data_path, tmp_path / "mg", "train", steps=6)
    run_experiment(
        orbitask_task(data_path, save_layer_draws=False), str(tmp_path / "ours"), mode="train",
        train_steps=6, steps_per_loop=1, use_tf_while_loop=False, **RUN,
    )  # fmt: skip
    out = capsys.readouterr().out
    assert "(step 4)" in out
    kept = "learning_rate_factor, lr, train_metrics keep their current values, so the training"
    assert f"{FROM_MODEL_GARDEN} global step; input_position, {kept} input starts" in out
    resumed = checkpoint_weights(orbitask_task(data_path), tmp_path / "ours")
    for a, b in zip(weights(model), resumed, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_warm_start_reads_a_model_garden_model_dir(runs, capsys):
    """`WarmStart(init_checkpoint=<train_lib's model_dir>)` reads the model under Model
    Garden's root `model`."""
    data_path, _, _, theirs, _ = runs
    model = mg_task(data_path).build_model()
    report = WarmStart(str(theirs)).apply(model)
    assert not report["missing"] and not report["mismatched"]
    trained = mg_task(data_path).build_model()
    tf.train.Checkpoint(model=trained).read(tf.train.latest_checkpoint(theirs)).expect_partial()
    for a, b in zip(weights(trained), weights(model), strict=True):
        np.testing.assert_array_equal(a, b)
    assert "(root 'model')" in capsys.readouterr().out


class BuiltInside(ModelGardenTask):
    """A subclass that builds its Model Garden task itself (Matthews correlation: the task's
    own `aggregate_logs` / `reduce_aggregated_logs`)."""

    def __init__(self, data_path, init_checkpoint=""):
        task = mg_task(data_path, metric_type="matthews_corrcoef", init_checkpoint=init_checkpoint)
        super().__init__(task, experiment=experiment(data_path))


def test_a_subclass_keeps_the_tasks_own_methods(runs, tmp_path):
    """Evaluated, the subclass gives the task's metrics (`build_metrics`, `process_metrics` in
    its `validation_step`) and its reduced Matthews correlation; its `process_metrics` is the
    task's (labels in a dict under `label_ids`), and so is its `initialize`."""
    data_path, ours, logs, _, _ = runs
    shutil.copytree(ours, tmp_path / "ours")
    task = BuiltInside(data_path, init_checkpoint=str(ours))
    evaluated = run_experiment(task, str(tmp_path / "ours"), mode="eval", train_steps=STEPS, **RUN)
    got = evaluated["eval"]
    assert set(got) == {"loss", "cls_accuracy", "auc", "matthews_corrcoef"}
    assert np.isfinite(got["matthews_corrcoef"])
    for name in ("loss", "cls_accuracy", "auc"):
        assert got[name] == pytest.approx(logs[name], rel=1e-6)

    metrics = task.build_metrics(training=False)
    labels = {"label_ids": tf.constant([0, 1, 1])}
    task.process_metrics(metrics, labels, tf.constant([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]]))
    accuracy = next(m for m in metrics if m.name == "cls_accuracy")
    assert float(accuracy.result()) == pytest.approx(2 / 3)

    model = task.build_model()
    task.initialize(model)  # the task's: its encoder from init_checkpoint
    trained = mg_task(data_path).build_model()
    tf.train.Checkpoint(train_model=trained).read(tf.train.latest_checkpoint(ours)).expect_partial()
    encoder = _items(trained)["encoder"]
    for a, b in zip(encoder, _items(model)["encoder"], strict=True):
        np.testing.assert_array_equal(a, b)
