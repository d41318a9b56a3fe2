"""Configuration mistakes are one line (exit 2); the user's own bugs keep their traceback (exit 1);
a dataset that ends early and a data error in a step name the step."""

import ast
import io
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from orbitask import trainers
from orbitask.trainers import ConfigError, run_experiment
from tests.helpers import TinyTask

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(task, model_dir, **kwargs):
    settings = dict(mode="train", train_steps=3, global_batch_size=8, progress=False)
    settings.update(kwargs)
    return run_experiment(task, str(model_dir), **settings)


class WrongWeights(TinyTask):
    def build_model(self):
        model = super().build_model()
        model.layers[0].set_weights([np.zeros((64, 64), np.float32)])  # the user's bug
        return model


def test_a_bug_in_build_model_keeps_its_type_and_traceback(tmp_path):
    with pytest.raises(ValueError) as info:
        _run(WrongWeights(), tmp_path)
    assert not isinstance(info.value, ConfigError)
    frames = [frame.name for frame in info.traceback]
    assert "build_model" in frames


USER_TASK = textwrap.dedent(
    """
    import gin
    import numpy as np
    from tests.helpers import TinyTask

    @gin.configurable
    class BuggyTask(TinyTask):
        def build_model(self):
            model = super().build_model()
            model.layers[0].set_weights([np.zeros((64, 64), np.float32)])
            return model
    """
)


@pytest.mark.slow
def test_the_binary_prints_the_users_traceback_and_exits_1(tmp_path):
    (tmp_path / "buggy_task.py").write_text(USER_TASK)
    (tmp_path / "buggy.gin").write_text(
        "include 'configs/defaults.gin'\nimport buggy_task\n"
        "TASK = @BuggyTask()\nTRAIN_STEPS = 3\norbitask.run_experiment.progress = False\n"
    )
    env = dict(os.environ, PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(
        [sys.executable, "-m", "orbitask.trainers.commands.train", "--gin_file=buggy.gin",
         f"--model_dir={tmp_path / 'run'}", "--mode=train"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "Traceback (most recent call last)" in result.stderr
    assert 'buggy_task.py", line 10, in build_model' in result.stderr
    assert "orbitask: error:" not in result.stderr


@pytest.mark.slow
def test_a_configuration_mistake_is_one_line_and_exit_2(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(
        [sys.executable, "-m", "orbitask.trainers.train", "--gin_file=experiments/digits.gin",
         "--gin_params=orbitask.run_experiment.steps_per_loop = 0",
         f"--model_dir={tmp_path / 'run'}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("orbitask: error:")]
    assert lines == [
        "orbitask: error: Expected a positive integer. Received: steps_per_loop=0 of type int. "
        "Fix orbitask.run_experiment.steps_per_loop in your experiment's .gin file or with "
        "--gin_params."
    ]


class Finite(TinyTask):
    """16 batches of 8, no repeat."""

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ds = tf.data.Dataset.from_tensor_slices((self.x[:128], self.y[:128]))
        return ds.batch(per_replica_batch_size, drop_remainder=True)


@pytest.mark.slow
@pytest.mark.parametrize("steps_per_loop", [5, 100])
def test_a_dataset_that_ends_early_names_the_step_after_saving(tmp_path, steps_per_loop):
    task = Finite(n=128)
    with pytest.raises(
        ConfigError, match=r"ended after step 16 of train_steps 100: .*\.repeat\(\)"
    ):
        _run(task, tmp_path, train_steps=100, steps_per_loop=steps_per_loop, loop_seconds=None)
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-16")


class BadLabel(TinyTask):
    """Step 7's batch holds a label out of range."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.y = self.y.copy()
        self.y[6 * 8 + 3] = 40

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ds = tf.data.Dataset.from_tensor_slices((self.x, self.y))
        return ds.batch(per_replica_batch_size, drop_remainder=True).repeat()


def test_a_data_error_in_a_step_names_the_step(tmp_path):
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        _run(BadLabel(), tmp_path, train_steps=20, steps_per_loop=20, loop_seconds=None)
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "after global step 6" in notes, notes


class NameErrorInLossPre(TinyTask):
    def loss_pre(self, outputs, batch, model, lr):
        return outputs, labels  # noqa: F821 -- the user's bug


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_a_bug_in_a_stage_during_the_pre_flight_check_keeps_its_type_and_traceback(
    tmp_path, strategy
):
    with pytest.raises(NameError, match="labels") as info:
        _run(NameErrorInLossPre(), tmp_path, strategy=strategy)
    assert not isinstance(info.value, ConfigError)
    assert info.traceback[-1].name == "loss_pre"
    assert "before the first step" in " ".join(info.value.__notes__)
    assert tf.train.latest_checkpoint(str(tmp_path)) is None


# The binary in-process: the user's module (imported by a gin `import` line) raises in its own
# code; the exception leaves main() with its type and its traceback to the user's file.
USER_BUGS = [
    (
        "type_error_in_init",
        """
        @gin.configurable
        class {name}(TinyTask):
            def __init__(self, **kwargs):
                super().__init__(**kwargs)
                self.scale = "2" * 1.5
        """,
        TypeError,
        "__init__",
    ),
    (
        "type_error_at_import",
        """
        SCALE = len(3)
        """,
        TypeError,
        "<module>",
    ),
    (
        "own_not_implemented_error",
        """
        @gin.configurable
        class {name}(TinyTask):
            def build_model(self):
                raise NotImplementedError("a model for this data is still to come")
        """,
        NotImplementedError,
        "build_model",
    ),
]


@pytest.mark.parametrize("case, source, error, function", USER_BUGS, ids=[c[0] for c in USER_BUGS])
def test_the_binary_keeps_the_users_exception_and_traceback(
    tmp_path, case, source, error, function
):
    name = f"Bug_{case}_{os.getpid()}"
    module = f"user_{case}_{tmp_path.name}".replace("-", "_")
    header = "import gin\nfrom tests.helpers import TinyTask\n"
    (tmp_path / f"{module}.py").write_text(header + textwrap.dedent(source.format(name=name)))
    task = f"@{name}()" if "{name}" in source else "@orbitask.DigitsClassification()"
    (tmp_path / "user.gin").write_text(
        f"include 'configs/defaults.gin'\nimport {module}\nTASK = {task}\nTRAIN_STEPS = 3\n"
        "orbitask.run_experiment.progress = False\n"
    )
    from orbitask.common.errors import MissingBuilder
    from orbitask.trainers.commands import train

    argv = [f"--gin_file={tmp_path / 'user.gin'}", f"--model_dir={tmp_path / 'run'}"]
    with pytest.raises(error) as info:
        train.main([*argv, "--mode=train"])
    assert not isinstance(info.value, (ConfigError, MissingBuilder))
    user_frames = [e.name for e in info.traceback if e.path.name == f"{module}.py"]
    assert user_frames and user_frames[-1] == function, info.traceback


# Framework settings of the wrong type or range: one line, exit 2, before any work.
@pytest.mark.parametrize(
    "binding, expected",
    [
        (
            "orbitask.run_experiment.learning_rate = 'fast'",
            "Received: learning_rate='fast' of type str. Fix orbitask.run_experiment.learning_rate",
        ),
        (
            "orbitask.run_experiment.learning_rate = -1.0",
            "Received: learning_rate=-1.0 of type float. Fix orbitask.run_experiment.learning_rate",
        ),
        (
            "orbitask.run_experiment.max_to_keep = 'five'",
            "Expected a positive integer or None. Received: max_to_keep='five' of type str. Fix "
            "orbitask.run_experiment.max_to_keep",
        ),
    ],
    ids=["learning_rate_str", "negative_learning_rate", "max_to_keep_str"],
)
def test_the_binary_refuses_a_bad_setting_in_one_line(tmp_path, capsys, binding, expected):
    from orbitask.trainers.commands import train

    status = train.main(
        [f"--gin_file={REPO}/experiments/digits.gin", f"--model_dir={tmp_path / 'run'}",
         f"--gin_params={binding}"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and err.startswith("orbitask: error: "), err
    assert expected in err, err
    assert not (tmp_path / "run").exists()


class EmptyValidation(TinyTask):
    """A validation input without a batch; `unknown` hides its size from TensorFlow."""

    def __init__(self, unknown=False, **kwargs):
        super().__init__(**kwargs)
        self.unknown = unknown

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        if training:
            return super().build_inputs(per_replica_batch_size, input_context, training)
        ds = tf.data.Dataset.from_tensor_slices((self.x, self.y))
        ds = ds.filter(lambda x, y: x[0] > 100) if self.unknown else ds.take(0)
        return ds.batch(per_replica_batch_size)


@pytest.mark.parametrize("unknown", [False, True], ids=["known_size", "unknown_size"])
def test_an_empty_validation_input_is_one_line(tmp_path, unknown):
    message = r"EmptyValidation.build_inputs\(training=False\) yields no batches"
    with pytest.raises(ConfigError, match=message):
        task = EmptyValidation(unknown=unknown)
        _run(task, tmp_path, mode="train_and_eval", checkpoint_interval=1, loop_seconds=None)
    # Known to be empty: refused before the first step; else at the first evaluation (step 3).
    trained = tf.train.latest_checkpoint(str(tmp_path))
    assert (trained is None) == (not unknown), trained


class FailingCallback(TinyTask):
    """A callback with the user's bug, due at step 6."""

    def at_step(self):
        return {6: lambda task, ctx: {}["missing key"]}


class FailingEvaluation(TinyTask):
    """Its own validation_step fails when it runs (the first evaluation)."""

    def validation_step(self, batch, model, metrics=None, **kwargs):
        tf.debugging.assert_equal(1, 0, message="the user's evaluation check")
        return {"loss": tf.constant(0.0), "num_examples": tf.constant(1.0)}


class FailingSaveHook(TinyTask):
    """Its `on_checkpoint_saved` has the user's bug: it runs in the schedule's `checkpoint`
    entry, after the first save (step 6)."""

    def on_checkpoint_saved(self, ctx):
        return {}["missing key"]


@pytest.mark.parametrize(
    "task, mode, place",
    [
        (FailingCallback(), "train", "a callback (every_steps / at_step)"),
        (FailingEvaluation(), "train_and_eval", "the evaluation"),
        (FailingSaveHook(), "train", "saving a checkpoint or its on_checkpoint_saved"),
    ],
    ids=["callback", "evaluation", "checkpoint"],
)
def test_an_error_outside_the_step_saves_the_trained_steps_first(tmp_path, task, mode, place):
    """No interval save before step 6: the steps are kept only because the error saved them
    (the checkpoint hook's: the save at 6 holds them); the user's exception keeps its type and
    traceback, and its note names where it came."""
    error = tf.errors.InvalidArgumentError if isinstance(task, FailingEvaluation) else KeyError
    interval = 6 if isinstance(task, FailingSaveHook) else None
    with pytest.raises(error) as info:
        _run(task, tmp_path, mode=mode, train_steps=20, steps_per_loop=2, loop_seconds=None,
             eval_interval=6, checkpoint_seconds=None, checkpoint_interval=interval)  # fmt: skip
    saved = tf.train.latest_checkpoint(str(tmp_path))
    assert saved == str(tmp_path / "ckpt-6")
    assert info.value.__notes__[-1] == (
        f"orbitask: raised during {place} at global step 6; the trained steps are saved in "
        f"checkpoint {saved}: the same command resumes."
    )
    if error is KeyError:  # the user's own line is in the traceback
        own = "<lambda>" if isinstance(task, FailingCallback) else "on_checkpoint_saved"
        assert info.traceback[-1].frame.code.name == own


class ClosedProgressStream(io.StringIO):
    """A `sys.stdout` whose progress lines fail as a closed stream's writes do."""

    def write(self, text):
        if text.startswith("step "):
            raise ValueError("I/O operation on closed file.")
        return super().write(text)


def test_an_error_from_the_progress_display_saves_the_trained_steps_first(tmp_path, monkeypatch):
    """Its first line comes after the first device loop (step 2), where no rule saves."""
    monkeypatch.setattr(sys, "stdout", ClosedProgressStream())
    with pytest.raises(ValueError, match="closed file") as info:
        _run(TinyTask(), tmp_path, train_steps=20, steps_per_loop=2, loop_seconds=None,
             checkpoint_seconds=None, progress=True)  # fmt: skip
    saved = tf.train.latest_checkpoint(str(tmp_path))
    assert saved == str(tmp_path / "ckpt-2")
    assert info.value.__notes__[-1] == (
        "orbitask: raised during the progress display at global step 2; the trained steps are "
        f"saved in checkpoint {saved}: the same command resumes."
    )


def _schedule_entry_names() -> set[str]:
    """The name of every schedule entry orbitask builds: each `Periodic("<name>", ...)`."""
    names = set()
    for path in pathlib.Path(os.path.dirname(trainers.__file__)).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            called = getattr(node, "func", None)
            if getattr(called, "id", None) == "Periodic" and node.args:
                assert isinstance(node.args[0], ast.Constant), f"{path}: {ast.unparse(node)}"
                names.add(node.args[0].value)
    return names


ENTRIES = sorted(_schedule_entry_names())


def test_the_schedule_entries_are_found():
    assert {"callbacks", "progress", "checkpoint", "evaluation", "summary_writes"} <= set(ENTRIES)


@pytest.mark.parametrize("entry", ENTRIES)
def test_an_error_in_any_schedule_entry_is_outside_the_step(entry):
    """Every entry of the schedule runs between device loops: an error there (where
    `schedule.running` names the entry) saves the trained steps first and is named, never
    taken for the step's own."""
    from orbitask.trainers.engine import step_errors

    step, saves = tf.Variable(4, dtype=tf.int64), []
    save = lambda: saves.append(1) or "/run/ckpt-4"  # noqa: E731
    with pytest.raises(KeyError) as info:
        with step_errors.named_by_step(step, None, 10, lambda: entry, save):
            raise KeyError("the user's bug")
    assert saves == [1]
    place = step_errors.OUTSIDE_THE_STEP[entry]
    assert info.value.__notes__ == [
        f"orbitask: raised during {place} at global step 4; the trained steps are saved in "
        "checkpoint /run/ckpt-4: the same command resumes."
    ]
    with pytest.raises(KeyError) as info:  # the step's own: named as the step's, no save
        with step_errors.named_by_step(step, None, 10, lambda: "step", save):
            raise KeyError("the user's bug")
    assert saves == [1] and not getattr(info.value, "__notes__", None)


def test_an_error_in_an_evaluation_only_run_names_the_evaluation(tmp_path):
    _run(TinyTask(), tmp_path, train_steps=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="the user's evaluation check") as e:
        _run(FailingEvaluation(), tmp_path, mode="eval")
    assert e.value.__notes__[-1] == "orbitask: raised during the evaluation at global step 2."
