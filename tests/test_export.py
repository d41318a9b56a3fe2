"""SavedModel export: `orbitask export` and `export_at_end` write SavedModels that plain TensorFlow
loads (no orbitask in the process) and that predict what the trained model predicts."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from typing import NamedTuple

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

from orbitask.trainers import ValidationControl, run_experiment
from orbitask.trainers.commands import cli, export, train
from orbitask.trainers.run import saved_model
from tests.helpers import TinyTask

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULTS = os.path.join(REPO, "configs", "defaults.gin")
X = np.random.RandomState(5).normal(size=(7, 6)).astype(np.float32)


@gin.configurable("ExportTinyTask")
class ExportTinyTask(TinyTask):
    """TinyTask, configurable; keeps the model it built (the trained model, after a run)."""

    def build_model(self):
        self.model = super().build_model()
        return self.model


# Loads SavedModels and calls their serving_default signature with orbitask unreachable.
PLAIN_TF = textwrap.dedent(
    """
    import importlib.abc, json, sys

    class Blocked(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("orbitask", "tasks", "trainers"):
                raise ImportError(f"{name} imported while serving")

    sys.meta_path.insert(0, Blocked())
    sys.path = [p for p in sys.path if p not in ("", sys.argv[2])]
    import numpy as np
    import tensorflow as tf

    results = []
    for path, inputs in json.load(open(sys.argv[1])):
        serve = tf.saved_model.load(path).signatures["serving_default"]
        kwargs = {k: tf.constant(np.asarray(v, np.float32)) for k, v in inputs.items()}
        outputs = {name: value.numpy().tolist() for name, value in serve(**kwargs).items()}
        specs = serve.structured_input_signature[1]
        shapes = {name: spec.shape.as_list() for name, spec in specs.items()}
        results.append({"outputs": outputs, "input_shapes": shapes})
    assert not [m for m in sys.modules if m.split(".")[0] == "orbitask"], "orbitask was imported"
    print(json.dumps(results))
    """
)


class Served(NamedTuple):
    outputs: dict  # output name -> array
    input_shapes: dict  # the signature's input name -> shape (None: any size)


def plain_tf_predict(tmp_path, calls) -> list[Served]:
    """`[(saved model folder, {input name: array})]` -> what each serving_default signature
    returned and its input shapes, computed in a fresh Python process that cannot import
    orbitask."""
    spec = tmp_path / "calls.json"
    spec.write_text(json.dumps([(str(p), {k: v.tolist() for k, v in x.items()}) for p, x in calls]))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    env.pop("PYTHONPATH", None)
    result = subprocess.run(
        [sys.executable, "-c", PLAIN_TF, str(spec), REPO],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return [
        Served({k: np.array(v, np.float32) for k, v in r["outputs"].items()}, r["input_shapes"])
        for r in json.loads(result.stdout.splitlines()[-1])
    ]


def restored(model, path):
    tf.train.Checkpoint(train_model=model).restore(path).expect_partial()
    return model


def train_with_gin(model_dir, *params):
    bindings = [
        "TASK = @ExportTinyTask()",
        "TRAIN_STEPS = 6",
        "orbitask.run_experiment.global_batch_size = 8",
        "orbitask.run_experiment.learning_rate = 0.1",
        "orbitask.run_experiment.progress = False",
        *params,
    ]
    args = [f"--gin_params={b}" for b in bindings]
    status = train.main([f"--gin_file={DEFAULTS}", *args, f"--model_dir={model_dir}"])
    assert status == 0


@pytest.mark.slow
@pytest.mark.parametrize("flavour", ["keras", "tf_keras"])
def test_export_command_writes_the_latest_checkpoints_model(tmp_path, capsys, flavour):
    """`orbitask export --model_dir=D` alone: the task from D's operative config."""
    run = tmp_path / "run"
    train_with_gin(run, f"ExportTinyTask.flavour = '{flavour}'", "ExportTinyTask.l2 = 0.0")
    assert cli.main(["export", f"--model_dir={run}"]) == 0
    assert f"exported ckpt-6 to {run / 'export' / '6'}" in capsys.readouterr().out
    assert (run / "export" / "6" / "saved_model.pb").is_file()

    (served,) = plain_tf_predict(tmp_path, [(run / "export" / "6", {"inputs": X})])
    task = ExportTinyTask(flavour=flavour)
    trained = restored(task.build_model(), tf.train.latest_checkpoint(str(run)))
    assert served.input_shapes == {"inputs": [None, 6]} and list(served.outputs) == ["outputs"]
    outputs = served.outputs["outputs"]
    np.testing.assert_allclose(outputs, trained(X).numpy(), rtol=1e-5, atol=1e-6)
    assert not np.allclose(outputs, task.build_model()(X).numpy(), atol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize(
    "flavour, strategy",
    [("keras", "one_device"), ("tf_keras", "mirrored")],
    ids=["keras", "tf_keras-mirrored"],
)
def test_export_at_end_writes_the_trained_model(tmp_path, flavour, strategy):
    task = ExportTinyTask(flavour=flavour)
    logs = run_experiment(
        task,
        str(tmp_path / "run"),
        mode="train_and_eval",
        train_steps=6,
        global_batch_size=8,
        learning_rate=0.1,
        eval_interval=3,
        strategy=strategy,
        progress=False,
        export_at_end=True,
    )
    folder = tmp_path / "run" / "export" / "6"
    assert logs["export"] == str(folder)
    (served,) = plain_tf_predict(tmp_path, [(folder, {"inputs": X})])
    outputs = served.outputs["outputs"]
    np.testing.assert_allclose(outputs, task.model(X).numpy(), rtol=1e-5, atol=1e-6)


def test_export_at_end_is_off_by_default(tmp_path):
    logs = run_experiment(
        ExportTinyTask(), str(tmp_path), mode="train", train_steps=2, global_batch_size=8,
        progress=False,
    )  # fmt: skip
    assert "export" not in logs and not (tmp_path / "export").exists()


@pytest.mark.slow
def test_ema_exports_the_averages_at_the_end_and_with_the_option(tmp_path):
    run = tmp_path / "run"
    ema = ["orbitask.run_experiment.ema = @orbitask.ExponentialMovingAverage()"]
    ema.append("orbitask.ExponentialMovingAverage.decay = 0.5")
    train_with_gin(run, *ema, "orbitask.run_experiment.export_at_end = True")
    exports = {}
    for name, flags in (("at_end", None), ("ema", ["--ema"]), ("raw", [])):
        if flags is not None:
            assert export.main([f"--model_dir={run}", *flags]) == 0
        exports[name] = shutil.copytree(run / "export" / "6", tmp_path / name)
    served = plain_tf_predict(tmp_path, [(exports[n], {"inputs": X}) for n in exports])
    at_end, with_option, raw = (s.outputs["outputs"] for s in served)

    path = tf.train.latest_checkpoint(str(run))
    model = restored(ExportTinyTask().build_model(), path)
    np.testing.assert_allclose(raw, model(X).numpy(), rtol=1e-5, atol=1e-6)
    reader = tf.train.load_checkpoint(path)
    for i, variable in enumerate(model.trainable_variables):
        variable.assign(reader.get_tensor(f"ema/shadows/{i}/.ATTRIBUTES/VARIABLE_VALUE"))
    averaged = model(X).numpy()
    np.testing.assert_allclose(at_end, averaged, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(with_option, averaged, rtol=1e-5, atol=1e-6)
    assert not np.allclose(raw, averaged, atol=1e-3)


@pytest.mark.slow
def test_best_option_exports_the_best_checkpoint(tmp_path):
    """With the loss as a higher-is-better metric the first evaluation stays the best."""
    run, experiment = tmp_path / "run", tmp_path / "tiny.gin"
    run_experiment(
        ExportTinyTask(), str(run), mode="train_and_eval", train_steps=6, global_batch_size=8,
        learning_rate=0.1, eval_interval=2, progress=False,
        validation_control=ValidationControl(
            metric="loss", higher_is_better=True, halve_lr_on_worse=False
        ),
    )  # fmt: skip
    experiment.write_text(f"include '{DEFAULTS}'\nTASK = @ExportTinyTask()\nTRAIN_STEPS = 6\n")
    assert export.main([f"--model_dir={run}", "--best", f"--gin_file={experiment}"]) == 0
    best_step = json.loads((run / "best" / "info.json").read_text())["best_ckpt_global_step"]
    assert best_step == 2 and sorted(os.listdir(run / "export")) == ["2"]

    (served,) = plain_tf_predict(tmp_path, [(run / "export" / "2", {"inputs": X})])
    best = restored(ExportTinyTask().build_model(), tf.train.latest_checkpoint(str(run / "best")))
    latest = restored(ExportTinyTask().build_model(), tf.train.latest_checkpoint(str(run)))
    np.testing.assert_allclose(served.outputs["outputs"], best(X).numpy(), rtol=1e-5, atol=1e-6)
    assert not np.allclose(served.outputs["outputs"], latest(X).numpy(), atol=1e-3)


def _gin_run(model_dir, experiment, *params):
    bindings = ["TRAIN_STEPS = 3", "orbitask.run_experiment.global_batch_size = 16", *params]
    bindings.append("orbitask.run_experiment.progress = False")
    args = [f"--gin_file={os.path.join(REPO, 'experiments', experiment)}", "--mode=train"]
    args += [f"--gin_params={b}" for b in bindings]
    assert train.main([*args, f"--model_dir={model_dir}"]) == 0
    train.parse_gin(export.gin_files(str(model_dir), []), [])
    task = train.build_task()  # the same task again, to build the expected model
    gin.clear_config()
    return task


@pytest.mark.slow
def test_a_dict_of_models_exports_one_saved_model_per_model(tmp_path):
    run = tmp_path / "run"
    task = _gin_run(run, "digits_gan.gin")
    assert export.main([f"--model_dir={run}"]) == 0
    assert sorted(os.listdir(run / "export" / "3")) == ["discriminator", "generator"]

    noise = np.random.RandomState(1).normal(size=(5, 16)).astype(np.float32)
    images = np.random.RandomState(2).uniform(size=(5, 64)).astype(np.float32)
    folder = run / "export" / "3"
    calls = [
        (folder / "generator", {"inputs": noise}),
        (folder / "discriminator", {"inputs": images}),
    ]
    generated, judged = plain_tf_predict(tmp_path, calls)
    assert generated.input_shapes == {"inputs": [None, 16]}
    models = restored(task.build_model(), tf.train.latest_checkpoint(str(run)))
    got, want = generated.outputs["outputs"], models["generator"](noise).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    got, want = judged.outputs["outputs"], models["discriminator"](images).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_model_without_input_layers_takes_what_evaluation_gives_it(tmp_path):
    """MultiTask's model is a subclassed model of a dict `{task: inputs}` (after input_pre)."""
    run = tmp_path / "run"
    task = _gin_run(run, "digits_multitask.gin", "orbitask.run_experiment.export_at_end = True")
    images = np.random.RandomState(3).uniform(size=(4, 64)).astype(np.float32)
    (served,) = plain_tf_predict(
        tmp_path, [(run / "export" / "3", {"digit": images, "parity": images[:2]})]
    )
    model = task.build_model()
    restored(model, tf.train.latest_checkpoint(str(run)))
    expected = model({"digit": images, "parity": images[:2]})
    assert served.input_shapes == {"digit": [None, 64], "parity": [None, 64]}
    assert sorted(served.outputs) == ["digit", "parity"]
    for name in ("digit", "parity"):
        got, want = served.outputs[name], expected[name].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@gin.configurable("NoInputTask")
class NoInputTask(ExportTinyTask):
    """A model without an Input layer (weights from its first call) and validation batches of
    a fixed size."""

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        dataset = super().build_inputs(per_replica_batch_size, input_context, training)
        return dataset if training else dataset.unbatch().batch(8, drop_remainder=True)

    def build_model(self):
        layers = keras.layers
        self.model = keras.Sequential([layers.Dense(8, activation="tanh"), layers.Dense(3)])
        return self.model


@pytest.mark.slow
def test_a_model_without_input_layers_gets_a_free_batch_dimension(tmp_path):
    run = tmp_path / "run"
    train_with_gin(run, "TASK = @NoInputTask()")
    assert export.main([f"--model_dir={run}"]) == 0
    (served,) = plain_tf_predict(tmp_path, [(run / "export" / "6", {"inputs": X})])
    model = NoInputTask().build_model()
    model(X)  # creates the weights the checkpoint restores
    expected = restored(model, tf.train.latest_checkpoint(str(run)))(X).numpy()
    assert served.input_shapes == {"inputs": [None, 6]}
    np.testing.assert_allclose(served.outputs["outputs"], expected, rtol=1e-5, atol=1e-6)


class TwoInputTask(TinyTask):
    """A functional model of two named inputs, which validation batches give as a dict."""

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        dataset = tf.data.Dataset.from_tensor_slices(({"a": self.x[:, :2], "b": self.x}, self.y))
        return dataset.batch(per_replica_batch_size)

    def build_model(self):
        a, b = keras.Input((2,), name="a"), keras.Input((6,), name="b")
        joined = keras.layers.Concatenate()([keras.layers.Dense(4)(a), b])
        return keras.Model({"a": a, "b": b}, keras.layers.Dense(3)(joined))


@pytest.mark.slow
def test_a_model_of_several_inputs_takes_them_by_name(tmp_path):
    task = TwoInputTask()
    model = task.build_model()
    folder = saved_model.write(task, model, str(tmp_path / "export"), 0, per_replica_batch_size=8)
    (served,) = plain_tf_predict(tmp_path, [(folder, {"a": X[:, :2], "b": X})])
    assert served.input_shapes == {"a": [None, 2], "b": [None, 6]}
    expected = model({"a": X[:, :2], "b": X}).numpy()
    np.testing.assert_allclose(served.outputs["outputs"], expected, rtol=1e-5, atol=1e-6)


def _hand_made_run(model_dir, with_model=True, operative=True):
    """A model directory with one checkpoint (of a TinyTask's model, or of a step only)."""
    objects = {"step": tf.Variable(4, dtype=tf.int64)}
    if with_model:
        objects["train_model"] = ExportTinyTask().build_model()
    tf.train.Checkpoint(**objects).save(os.path.join(model_dir, "ckpt"))
    if operative:
        (model_dir / "operative_config.gin").write_text("TASK = @ExportTinyTask()\n")


@pytest.mark.parametrize(
    "setup, args, expected",
    [
        (None, [], "--model_dir is required: the directory of the run to export."),
        (None, ["--model_dir={d}/absent"], "--model_dir '{d}/absent' does not exist"),
        ("empty", ["--model_dir={d}"], "no checkpoint in '{d}' to export; pass the --model_dir"),
        ("no_config", ["--model_dir={d}"], "--gin_file is required: '{d}' has no operative_con"),
        ("run", ["--model_dir={d}", "--best"], "--best: '{d}' has no best checkpoint under best/"),
        ("run", ["--model_dir={d}", "--ema"], r"--ema: checkpoint {d}/ckpt-1 holds no EMA"),
        ("other_model", ["--model_dir={d}"], "checkpoint {d}/ckpt-1 does not fit the model"),
        ("run", ["--model_dir={d}", "extra"], "unexpected argument(s) extra"),
        ("run", ["--model_dir={d}", "--bst"], "Unknown command line flag 'bst'"),
    ],
    ids=["no_model_dir", "absent", "empty", "no_config", "no_best", "no_ema", "other_model",
         "extra_argument", "unknown_flag"],
)  # fmt: skip
def test_mistakes_are_one_line_and_exit_2(tmp_path, capsys, setup, args, expected):
    if setup is not None and setup != "empty":
        _hand_made_run(tmp_path, with_model=setup != "other_model", operative=setup != "no_config")
    status = cli.main(["export", *[a.format(d=tmp_path) for a in args]])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("orbitask: error: "), err
    assert expected.format(d=tmp_path) in err, err
    assert not (tmp_path / "export").exists()


def test_export_is_a_command_of_the_binary(capsys):
    assert cli.main(["--help"]) == 0
    assert "export   write a run's model as a SavedModel" in capsys.readouterr().out


def test_export_imports_no_code_from_the_model_directory(tmp_path, monkeypatch, capsys):
    """A module planted in the model directory and named by its operative config is not run;
    the same module in the working directory is imported, as in training."""
    run, cwd = tmp_path / "run", tmp_path / "cwd"
    run.mkdir()
    cwd.mkdir()
    _hand_made_run(run)
    name = f"planted_{os.getpid()}_{abs(hash(str(tmp_path)))}"
    marker = tmp_path / "planted_ran"
    (run / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (run / "operative_config.gin").write_text(f"import {name}\nTASK = @ExportTinyTask()\n")
    monkeypatch.chdir(cwd)
    monkeypatch.syspath_prepend(str(cwd))  # removed again after the test
    for argv in ([f"--model_dir={run}"], [f"--model_dir={run}", f"--gin_file={DEFAULTS}",
                 f"--gin_file={run / 'operative_config.gin'}"]):  # fmt: skip
        assert cli.main(["export", *argv]) == 2
        err = capsys.readouterr().err
        assert f"No module named '{name}'" in err and err.count("\n") == 1, err
        assert not marker.exists() and name not in sys.modules
    monkeypatch.chdir(run)  # a working directory inside the model directory is not searched
    assert cli.main(["export", f"--model_dir={run}"]) == 2 and not marker.exists()
    monkeypatch.chdir(cwd)

    (cwd / f"{name}.py").write_text("VALUE = 1\n")
    try:
        assert cli.main(["export", f"--model_dir={run}"]) == 0
        assert sys.modules[name].__file__ == str(cwd / f"{name}.py")
    finally:
        sys.modules.pop(name, None)
    assert not marker.exists() and (run / "export" / "4" / "saved_model.pb").is_file()


def test_the_next_export_removes_what_a_killed_one_left(tmp_path, capsys):
    """A kill -9 leaves `export/temp-<step>-<host>-<pid>-<hex>/`: the next export removes those
    of this host whose process is gone, and keeps one whose process runs (this one's, here) and
    another host's (its pid says nothing here)."""
    run = tmp_path / "run"
    train_with_gin(run)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    host = saved_model._host()
    dead = run / "export" / f"temp-6-{host}-{int(gone.stdout)}-0123abcd"
    alive = run / "export" / f"temp-6-{host}-{os.getpid()}-89abcdef"
    other = run / "export" / f"temp-6-other-host.x-{int(gone.stdout)}-0123abcd"
    for folder in (dead, alive, other):
        folder.mkdir(parents=True)
        (folder / "saved_model.pb").write_bytes(b"half")
    assert cli.main(["export", f"--model_dir={run}"]) == 0
    kept = sorted(p.name for p in (run / "export").iterdir())
    assert kept == sorted(["6", alive.name, other.name])


@pytest.mark.slow
def test_sigterm_during_an_export_removes_it_and_exits_75(tmp_path):
    run = tmp_path / "run"
    flags = [f"--gin_file={os.path.join(REPO, 'experiments', 'digits.gin')}", f"--model_dir={run}"]
    flags += ["--mode=train", "--gin_params=TRAIN_STEPS = 10"]
    assert train.main([*flags, "--gin_params=orbitask.run_experiment.progress = False"]) == 0
    command = [
        sys.executable,
        "-m",
        "orbitask.trainers.commands.cli",
        "export",
        f"--model_dir={run}",
    ]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))  # fmt: skip
    try:
        while not list(run.glob("export/temp-*")) and proc.poll() is None:
            time.sleep(0.01)  # the export takes seconds; leave it the cores
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 75, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        "orbitask: preempted: SIGTERM received during the export: nothing of it was kept; run "
        "the same command again."
    )
    assert list((run / "export").iterdir()) == []
