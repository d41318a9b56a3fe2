"""Several validation sets: `build_inputs(training=False)` returning `{name: dataset}`.

Each set is evaluated with its metrics and log state started afresh, so its logs (`<name>/<key>`)
equal an evaluation of that set alone, on 1 device and 2 replicas; its summaries go under
`eval/<name>/`; `ValidationControl.metric = "b/loss"` watches set b; bad sets are one line.
"""

import glob
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from orbitask import ConfigError, ValidationControl, run_experiment
from orbitask.trainers.engine import eval_inputs
from tests.helpers import TinyTask

PARTS = {"a": slice(0, 36), "b": slice(36, 96)}  # 36 and 60 examples: partial last batches


class TwoSets(TinyTask):
    """TinyTask validated on sets "a" and "b" (`only`: that set alone, as one dataset)."""

    def __init__(self, only=None, **kwargs):
        super().__init__(**kwargs)
        self.only = only

    def labels(self, part):
        return self.y[part]

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        if training:
            return super().build_inputs(per_replica_batch_size, input_context, training)
        sets = {
            name: tf.data.Dataset.from_tensor_slices((self.x[part], self.labels(part))).batch(
                per_replica_batch_size
            )
            for name, part in PARTS.items()
        }
        return sets if self.only is None else sets[self.only]


class Gathered(TwoSets):
    """Its own Python-side log reduction (`aggregate_logs`), counting the examples it saw."""

    def aggregate_logs(self, state, step_logs):
        state = state or {"loss": 0.0, "examples": 0.0}
        state["loss"] += sum(float(v) for v in step_logs["loss"])
        state["examples"] += sum(float(v) for v in step_logs["num_examples"])
        return state

    def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
        return {**aggregated_logs, "loss": aggregated_logs["loss"] / aggregated_logs["examples"]}


class WrongB(TwoSets):
    """Set b's labels are shifted, so training makes its loss worse while a's gets better."""

    def labels(self, part):
        return (self.y[part] + (1 if part is PARTS["b"] else 0)) % 3


def _run(task, model_dir, mode="train_and_eval", **kwargs):
    settings = dict(train_steps=3, global_batch_size=8, eval_interval=None, progress=False)
    return run_experiment(task, str(model_dir), mode=mode, **{**settings, **kwargs})


def _scalars(directory) -> dict:
    """{tag: {step: value}} of the scalar summaries directly in `directory`."""
    points: dict = {}
    for path in glob.glob(os.path.join(directory, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                points.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
    return points


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy, task_cls, eval_steps",
    [("one_device", TwoSets, None), ("mirrored", Gathered, 3)],
)
def test_each_set_logs_what_it_gives_alone(tmp_path, capsys, strategy, task_cls, eval_steps):
    """The default reduction on 1 device over whole sets, a task's own on 2 replicas over
    `eval_steps` of each set: per-set logs, summaries and report line; then each set alone."""
    logs = _run(task_cls(), tmp_path, strategy=strategy, eval_steps=eval_steps)["eval"]
    keys = {"loss", "accuracy"} | ({"examples"} if task_cls is Gathered else set())
    assert set(logs) == {f"{name}/{key}" for name in PARTS for key in keys}
    if eval_steps:  # eval_steps counts per set: 3 global batches of 8 from each
        assert logs["a/examples"] == logs["b/examples"] == 24
    line = [s for s in capsys.readouterr().out.splitlines() if "eval at step 3" in s]
    assert line and "a/loss" in line[0] and "b/accuracy" in line[0]
    for name in PARTS:
        written = _scalars(tmp_path / "eval" / name)
        assert written["loss"] == {3: pytest.approx(logs[f"{name}/loss"], abs=1e-6)}
        assert written["accuracy"] == {3: pytest.approx(logs[f"{name}/accuracy"], abs=1e-6)}
    assert "loss" not in _scalars(tmp_path / "eval")
    for name in PARTS:  # the same checkpoint, the set alone
        alone = _run(
            task_cls(only=name), tmp_path, "eval", strategy=strategy, eval_steps=eval_steps
        )
        assert {f"{name}/{k}": v for k, v in alone["eval"].items()} == {
            key: pytest.approx(value, abs=1e-6) for key, value in logs.items() if key[0] == name
        }
    if task_cls is TwoSets:  # a set that has no batches when read is named

        class EmptyB(TwoSets):
            def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
                sets = super().build_inputs(per_replica_batch_size, input_context, training)
                return sets if training else {**sets, "b": sets["b"].filter(lambda x, y: False)}

        with pytest.raises(ConfigError, match="EmptyB.build_inputs\\(training=False\\)'s "
                           "validation set 'b' yields no batches"):  # fmt: skip
            _run(EmptyB(), tmp_path, "eval", strategy=strategy)


def test_validation_control_watches_the_set_it_names(tmp_path):
    """With metric "b/loss", b's worse loss at step 4 is counted (no export) although a's
    loss improved: `best/` holds step 2."""
    control = ValidationControl(metric="b/loss")
    logs = _run(WrongB(), tmp_path, train_steps=4, eval_interval=2, learning_rate=0.05,
                validation_control=control)  # fmt: skip
    info = json.loads((tmp_path / "best" / "info.json").read_text())
    assert info["best_ckpt_global_step"] == 2
    state = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(tmp_path)))
    best = state.get_tensor("validation_control/best_value/.ATTRIBUTES/VARIABLE_VALUE")
    assert float(best) == pytest.approx(info["b"]["loss"])
    assert logs["eval"]["b/loss"] > info["b"]["loss"] and logs["eval"]["a/loss"] < info["a"]["loss"]
    worse = state.get_tensor("validation_control/worse_validations/.ATTRIBUTES/VARIABLE_VALUE")
    assert int(worse) == 1
    assert [os.path.basename(p) for p in glob.glob(str(tmp_path / "best" / "*.index"))] == [
        "best_ckpt-2.index"
    ]


class Returning(TinyTask):
    def __init__(self, value):
        super().__init__()
        self.value = value

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        return self.value


@pytest.mark.parametrize(
    "value, message",
    [
        ({}, "Returning.build_inputs\\(training=False\\) returned an empty dict; return a tf.data"),
        ({"a": np.zeros(3)}, "returned validation set 'a' as a ndarray; each value of its dict"),
        ({"a/b": tf.data.Dataset.range(2)}, "returned a validation set named 'a/b'; name each"),
    ],
)
def test_bad_sets_are_one_line(value, message):
    with pytest.raises(ConfigError, match=message) as raised:
        eval_inputs.eval_datasets(Returning(value), tf.distribute.get_strategy(), 8)
    assert "\n" not in str(raised.value)


def test_a_set_that_never_ends_is_named(tmp_path):
    class EndlessB(TwoSets):
        def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
            sets = super().build_inputs(per_replica_batch_size, input_context, training)
            return sets if training else {**sets, "b": sets["b"].repeat()}

    with pytest.raises(ConfigError, match="^validation set 'b': EndlessB.build_inputs\\("
                       "training=False\\) repeats forever"):  # fmt: skip
        _run(EndlessB(), tmp_path)
