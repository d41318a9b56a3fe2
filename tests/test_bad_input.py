"""Bad input is refused before any work, with one line saying what was expected and received."""

import pathlib
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from orbitask.common import setting_rules
from orbitask.trainers import (
    ConfigError,
    ExponentialMovingAverage,
    NanGuard,
    ValidationControl,
    learning_rate_schedule,
    run_experiment,
)
from orbitask.trainers.run import settings as run_settings
from tests.helpers import TinyTask

REPO = pathlib.Path(__file__).resolve().parent.parent


def _run(task, model_dir, **kwargs):
    settings = dict(mode="train", train_steps=3, global_batch_size=8, progress=False)
    settings.update(kwargs)
    return run_experiment(task, str(model_dir), **settings)


class Quadruples(TinyTask):
    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ds = tf.data.Dataset.from_tensor_slices((self.x, self.y, self.y, self.y)).repeat()
        return ds.batch(per_replica_batch_size, drop_remainder=True)


class FloatLabels(TinyTask):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.y = self.y.astype(np.float32)


class ColumnLabels(TinyTask):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.y = self.y[:, None]


class WrongFeatures(TinyTask):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.x = self.x[:, :5]


class GlobalBatch(TinyTask):
    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        return super().build_inputs(16, input_context, training)


class LogitShapedLoss(TinyTask):
    def build_losses(self):
        def loss_fn(loss_input):
            logits, labels = loss_input
            return tf.square(logits)  # [batch, classes]: neither per-example nor summed

        return loss_fn


class FunctionModel(TinyTask):
    def build_model(self):
        model = super().build_model()
        return lambda x, training=False: model(x, training=training)


class DictOutputs(TinyTask):
    def build_model(self):
        inputs = keras.Input((6,))
        return keras.Model(inputs, {"logits": keras.layers.Dense(3)(inputs)})


class MissingFile(TinyTask):
    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ds = tf.data.TFRecordDataset([str(REPO / "no-such-folder" / "train.tfrecord")])
        ds = ds.map(lambda _: (tf.zeros([6]), tf.constant(0)))
        return ds.batch(per_replica_batch_size, drop_remainder=True).repeat()


class FrozenModel(TinyTask):
    def build_model(self):
        model = super().build_model()
        model.trainable = False
        return model


CASES = [
    (
        FrozenModel,
        r"^the model has no trainable variables: FrozenModel.build_model\(\) returned one whose "
        r"weights are all frozen \(trainable = False\)",
    ),
    (
        FunctionModel,
        r"^FunctionModel.build_model\(\) returned <function .*> of type function, which is not a "
        r"model: return a Keras model",
    ),
    (
        DictOutputs,
        r"^DictOutputs's model returns \{logits: float32\[8, 3\]\}, and the default loss_pre hands "
        r"the outputs to the loss as they are, .*override loss_pre to return what the loss takes",
    ),
    (
        MissingFile,
        r"^an input file does not exist: .*/no-such-folder/train.tfrecord \(read after global "
        r"step 0\); fix the path in build_inputs",
    ),
    (
        Quadruples,
        r"must yield \(inputs, labels\) pairs or \(inputs, labels, weights\) triples .* "
        r"received elements \(float32\[8, 6\], int32\[8\], int32\[8\], int32\[8\]\)",
    ),
    (FloatLabels, r"does not fit the model and loss: .*(int32|float)"),
    (ColumnLabels, r"does not fit the model and loss: .*(rank|shape|dimension)"),
    (GlobalBatch, r"yields batches of 16 but per_replica_batch_size is 8"),
    (
        WrongFeatures,
        r"does not fit the model and loss: .*expected axis -1 of input shape to have value 6",
    ),
    (
        LogitShapedLoss,
        r"must return per-example losses \(shape \[batch\], here \[8\]\) or their sum \(a "
        r"scalar\); it returned shape \[8, 3\]",
    ),
]


@pytest.mark.parametrize("task_class,message", CASES, ids=[c[0].__name__ for c in CASES])
def test_bad_data_is_reported_before_any_step(tmp_path, task_class, message):
    with pytest.raises(ConfigError, match=message) as info:
        _run(task_class(), tmp_path)
    assert "\n" not in str(info.value).split("In call to configurable")[0].strip()
    assert "\x1b" not in str(info.value)  # no terminal colour codes from Keras
    assert "numpy=" not in str(info.value)  # no tensor values
    assert tf.train.latest_checkpoint(str(tmp_path)) is None  # nothing was trained or saved


@pytest.mark.parametrize(
    "settings,message",
    [
        (dict(global_batch_size=9, strategy="mirrored"), r"\(9\) must be divisible by .* \(2\)"),
        (dict(mode="fit"), r"`mode` must be one of train, eval"),
        (dict(strategy="tpu_pod"), r"`strategy` must be .* received 'tpu_pod'"),
        (dict(train_steps=0), r"Expected a positive integer\. Received: train_steps=0 of type int"),
        (dict(steps_per_loop=-1), r"Received: steps_per_loop=-1 of type int"),
    ],
)
def test_bad_settings(tmp_path, settings, message):
    with pytest.raises(ConfigError, match=message):
        _run(TinyTask(), tmp_path / "run", **settings)
    assert not (tmp_path / "run").exists()


# Wrong values for each rule of `setting_rules.RULES` and of run_experiment's declared settings
# (`settings.RULES`): a wrong type first, then out of range.
BAD_VALUES = {
    "a positive integer": ["8", 0, 2.5, True],
    "a positive integer or None": ["8", -1, 1.0],
    "a positive finite number": ["1e-3", 0.0, float("inf")],
    "a positive finite number or None": ["60", 0, -1.5, float("nan")],
    "a non-negative integer": ["7", -1, 0.5, None],
    "a non-negative integer or None": ["7", -1, 0.5],
    "a non-negative finite number": ["0.1", -0.5, float("inf"), None],
    "a number in (0, 1)": ["0.9", 0.0, 1.0, float("nan")],
    "True or False": ["yes", 1, None],
    setting_rules.LEARNING_RATE.expected: ["fast", -1.0, 0, float("nan"), True],
    setting_rules.DURATION.expected: ["90", "1:30", "00:00:00", "1:75:00", 0, True],
    setting_rules.SIGNAL_NAMES.expected: ["SIGTERM", ["SIGUSR9"], ["SIGKILL"], [15]],
    run_settings.STEP_LIST.expected: [3, "3, 7", [3, 0], [2.5], None],
}
ALL_RULES = {**setting_rules.RULES, **run_settings.RULES}
TABLE = [
    (binding, value) for binding, rule in ALL_RULES.items() for value in BAD_VALUES[rule.expected]
]


@pytest.mark.parametrize("binding, value", TABLE, ids=[f"{b}={v!r}" for b, v in TABLE])
def test_each_setting_of_the_wrong_type_or_range_is_one_line(tmp_path, binding, value):
    owner, name = binding.split(".")
    with pytest.raises(ConfigError) as info:
        if owner == "Task":
            TinyTask(**{name: value})
        elif owner == "NanGuard":
            NanGuard(**{name: value})
        elif owner == "ValidationControl":
            ValidationControl(**{name: value})
        elif owner == "learning_rate_schedule":
            learning_rate_schedule(**{name: value})
        elif owner == "ExponentialMovingAverage":
            ExponentialMovingAverage(**{name: value})
        else:
            _run(TinyTask(), tmp_path / "run", **{name: value})
    assert str(info.value).splitlines()[0] == (
        f"Expected {ALL_RULES[binding].expected}. Received: {name}={value!r} of type "
        f"{type(value).__name__}. Fix orbitask.{binding} in your experiment's .gin file or with "
        "--gin_params."
    )
    assert not (tmp_path / "run").exists()


def test_the_rules_cover_every_number_and_switch_that_defaults_gin_lists():
    text = (REPO / "configs" / "defaults.gin").read_text()
    bound = re.findall(r"^# orbitask\.(\w+\.\w+) = (?:[-\d.e]+|True|False)\b", text, re.M)
    assert bound, text
    missing = sorted({*bound, "run_experiment.learning_rate"} - set(ALL_RULES))
    assert not missing, missing


def test_model_dir_that_is_not_writable(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError, match=r"--model_dir .*a_file/run.* is not writable"):
        _run(TinyTask(), blocker / "run")


def test_existing_checkpoints_survive_a_bad_restart(tmp_path):
    _run(TinyTask(), tmp_path, train_steps=4, checkpoint_interval=2)
    before = sorted(p.name for p in tmp_path.glob("ckpt-*"))
    with pytest.raises(ConfigError):
        _run(GlobalBatch(), tmp_path, train_steps=8)
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == before


class RepeatingValidation(TinyTask):
    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ds = tf.data.Dataset.from_tensor_slices((self.x, self.y)).repeat()
        return ds.batch(per_replica_batch_size, drop_remainder=True)


class NoInputLayer(TinyTask):
    def build_model(self):
        return keras.Sequential([keras.layers.Dense(3)])  # no weights until first called


class NoInputLayerOwnStep(NoInputLayer):
    def train_step(self, batch, model, optimizer, metrics=None, **kwargs):
        return super().train_step(batch, model, optimizer, metrics, **kwargs)


def test_evaluation_that_would_never_end(tmp_path):
    with pytest.raises(ConfigError, match=r"repeats forever and eval_steps is None"):
        _run(RepeatingValidation(), tmp_path, mode="train_and_eval")
    assert tf.train.latest_checkpoint(str(tmp_path)) is None
    _run(RepeatingValidation(), tmp_path / "ok", mode="train_and_eval", eval_steps=2)


def test_eval_mode_without_a_checkpoint(tmp_path):
    with pytest.raises(ConfigError, match=r"--mode=eval evaluates the latest checkpoint, and "):
        _run(TinyTask(), tmp_path / "typo", mode="eval")


def test_a_model_without_an_input_layer_trains(tmp_path):
    logs = _run(NoInputLayer(), tmp_path)  # the input check calls it once, which builds it
    assert np.isfinite(logs["train"]["loss"])


def test_a_model_without_an_input_layer_trains_under_a_step_of_its_own(tmp_path):
    logs = _run(NoInputLayerOwnStep(), tmp_path)  # a dry step builds it
    assert np.isfinite(logs["train"]["loss"])


class AverageLoss(TinyTask):
    """A loss written with `tf.nn.compute_average_loss`, which needs replica context."""

    def build_losses(self):
        def loss_fn(loss_input):
            logits, labels = loss_input
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
            return tf.nn.compute_average_loss(per_example) * tf.cast(
                tf.shape(labels)[0], tf.float32
            )

        return loss_fn


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_the_pre_flight_check_runs_the_loss_in_replica_context(tmp_path, strategy):
    logs = _run(AverageLoss(), tmp_path, strategy=strategy)
    assert np.isfinite(logs["train"]["loss"])


def test_a_model_built_outside_build_model_is_one_line(tmp_path):
    prebuilt = TinyTask().build_model()  # at import time, outside the strategy's scope

    class Prebuilt(TinyTask):
        def build_model(self):
            return prebuilt

    with pytest.raises(
        ConfigError, match=r"made outside the strategy's scope \(.*kernel.*\): build"
    ):
        _run(Prebuilt(), tmp_path, strategy="mirrored")


class BadValidation(TinyTask):
    """Training batches are sound; validation batches have labels out of range ("labels"),
    5 features instead of 6 ("shape"), or come as two sets, the second bad ("sets")."""

    def __init__(self, kind, **kwargs):
        super().__init__(**kwargs)
        self.kind = kind

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        if training:
            return super().build_inputs(per_replica_batch_size, input_context, training)
        good = (self.x, self.y)
        bad = (self.x[:, :5], self.y) if self.kind == "shape" else (self.x, self.y + 7)
        if self.kind == "sets":
            return {
                name: tf.data.Dataset.from_tensor_slices(d).batch(per_replica_batch_size)
                for name, d in (("clean", good), ("noisy", bad))
            }
        return tf.data.Dataset.from_tensor_slices(bad).batch(per_replica_batch_size)


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
@pytest.mark.parametrize(
    "kind, message",
    [
        ("labels", r"InvalidArgumentError: Received a label value of \d+ which is outside"),
        ("shape", r"float32\[\d, 5\].*expected axis -1 of input shape to have value 6"),
        ("sets", r"validation set 'noisy'.*Received a label value of \d+ which is outside"),
    ],
)
def test_a_bad_validation_batch_is_refused_before_the_first_step(tmp_path, kind, message, strategy):
    """The first batch of each validation set goes through validation_step before step 1: a
    bad one is one line naming build_inputs(training=False) and what it gave, and nothing is
    trained or saved."""
    with pytest.raises(ConfigError) as error:
        _run(
            BadValidation(kind), tmp_path, mode="train_and_eval", train_steps=20,
            eval_interval=10, strategy=strategy,
        )  # fmt: skip
    line = str(error.value).splitlines()[0]
    assert line.startswith("the first batch of BadValidation.build_inputs(training=False)"), line
    assert re.search(message, line), line
    assert not list(tmp_path.glob("ckpt-*"))


def test_a_batch_larger_than_the_data_is_said_in_one_line(tmp_path, capsys):
    """32 examples a step over 12 repeated examples: each step sees each one 2.7 times; the
    same run over 96 examples says nothing."""
    _run(TinyTask(n=12), tmp_path / "small", train_steps=1, global_batch_size=32)
    said = [x for x in capsys.readouterr().out.splitlines() if "is larger than" in x]
    assert said == [
        "orbitask: warning: a step's batch of 32 examples is larger than the 12 examples of "
        "TinyTask.build_inputs(training=True), so each step repeats each example 2.7 times; "
        "lower orbitask.run_experiment.global_batch_size, or check the data."
    ]
    from orbitask.trainers.engine import epochs

    enough = TinyTask()  # 96 examples
    assert epochs.examples_per_pass(enough.build_inputs(32)) == 96
    epochs.say_if_batch_exceeds_data(enough, enough.build_inputs(32), 32)
    assert capsys.readouterr().out == ""
    batched_first = enough.build_inputs(32, training=False).repeat()  # elements are batches
    assert epochs.examples_per_pass(batched_first) is None
