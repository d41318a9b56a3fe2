"""Gin files and the binary: every experiment builds, defaults hold, mistakes are one line."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

from orbitask.common import keras_compat
from orbitask.tasks import IndexedInput, Task
from orbitask.trainers.commands import train
from orbitask.trainers.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted((REPO / "experiments").glob("*.gin"))
DIGITS = str(REPO / "experiments" / "digits.gin")


def _env():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CONFIG", None)
    return env


def _binary(args, command=(sys.executable, "-m", "orbitask.trainers.train"), timeout=300):
    return subprocess.run(
        [*command, *args],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _error_line(result):
    lines = [line for line in result.stderr.splitlines() if line.startswith("orbitask: error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


# ---------------------------------------------------------------------------------- gin files


def test_there_are_experiments():
    assert EXPERIMENTS, "experiments/*.gin is empty"


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda path: path.name)
def test_experiment_parses_and_its_task_builds(path):
    train.parse_gin([str(path)], [])
    assert "configs/defaults.gin" in path.read_text()  # includes the defaults, never copies them
    train_steps = gin.query_parameter("%TRAIN_STEPS")
    assert isinstance(train_steps, int) and train_steps > 0
    task = train.build_task()
    assert isinstance(task, Task)

    model = task.build_model()
    loss_fn = task.build_losses()
    optimizer = task.build_optimizer(1e-3)
    keras_compat.check_matching(model, optimizer)
    lr = tf.Variable(1e-3)
    for training in (True, False):
        dataset = task.build_inputs(8, training=training)
        if isinstance(dataset, IndexedInput):
            dataset = dataset.as_dataset()
        dataset = task.make_batches(dataset, 8)
        assert isinstance(dataset, tf.data.Dataset)
        batch = next(iter(dataset))
        if isinstance(model, dict):  # several models: only the task's own step calls them
            logs = task.validation_step(batch, model, [], loss_fn=loss_fn, lr=lr)
            assert logs and all(np.isfinite(np.asarray(v)).all() for v in logs.values())
            continue
        outputs = model(task.input_pre(batch, lr), training=training)
        loss = loss_fn(task.loss_pre(outputs, batch, model, lr))
        assert loss.shape == () and np.isfinite(float(loss))


def test_defaults_bind_the_seed_defaults():
    train.parse_gin([DIGITS], [])
    task = train.build_task()
    assert (task.clip_norm, task.optimizer_epsilon) == (10.0, 1e-3)
    _, manager = task.build_checkpoint(tempfile.mkdtemp(), step=tf.Variable(0))
    assert manager._max_to_keep == 50  # noqa: SLF001
    optimizer = task.build_optimizer(1e-3)
    assert isinstance(optimizer, keras.optimizers.Nadam)
    assert float(optimizer.epsilon) == pytest.approx(1e-3)


def test_repository_relative_gin_file_from_another_directory(tmp_path, monkeypatch):
    """`--gin_file=experiments/digits.gin` from outside the repository, with the repository on
    the Python path (so `configs/` is importable as a namespace package, which gin's Python-path
    reader crashes on), finds the file and its `include 'configs/defaults.gin'`."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(REPO))
    train.parse_gin(["experiments/digits.gin"], ["TRAIN_STEPS = 7"])
    assert gin.query_parameter("%TRAIN_STEPS") == 7
    assert gin.query_parameter("orbitask.run_experiment.train_steps")  # configs/defaults.gin


def test_task_bindings_reach_built_in_tasks():
    train.parse_gin(
        [DIGITS], ["orbitask.Task.optimizer_epsilon = 0.5", "orbitask.Task.clip_norm = 2.5"]
    )
    task = train.build_task()
    assert (task.clip_norm, task.optimizer_epsilon) == (2.5, 0.5)


def test_typo_in_a_gin_file_names_the_binding_and_the_file(tmp_path):
    path = tmp_path / "typo.gin"
    path.write_text(
        "include 'configs/defaults.gin'\n"
        "TASK = @orbitask.DigitsClassification()\n"
        "TRAIN_STEPS = 5\n"
        "orbitask.DigitsClassification.hiden_units = (8,)\n"
    )
    with pytest.raises(ConfigError, match="hiden_units") as info:
        train.parse_gin([str(path)], [])
    assert str(path) in str(info.value) and "line 4" in str(info.value)


# In-process `main()`: more mistakes, no TensorFlow start-up per case; none may start work.
@pytest.mark.parametrize(
    "args, expected",
    [
        (["--gin_params=TASK=3"], "TASK must be a tasks.Task instance.*received 3 of type int"),
        (["--gin_params=orbitask.Task.clip_norm=-1"], "Received: clip_norm=-1 .*Task.clip_norm"),
        (
            ["--gin_params=orbitask.run_experiment.train_prefetch=0"],
            "Expected a positive integer or None. Received: train_prefetch=0 of type int",
        ),
        (
            ["--gin_params=orbitask.run_experiment.train_prefetch_bytes=1.5"],
            "Received: train_prefetch_bytes=1.5 of type float",
        ),
        (
            ["--gin_params=orbitask.run_experiment.steps_per_loop=0"],
            "Expected a positive integer. Received: steps_per_loop=0 of type int",
        ),
        (
            ["--gin_params=TRAIN_STEP = 600"],
            r"macro TRAIN_STEP is bound but nothing uses it \(no %TRAIN_STEP anywhere\), so it "
            "would change nothing; did you mean TRAIN_STEPS\\?",
        ),
        (["--gin_params=LR = 0.1"], "macro LR is bound but nothing uses it .*use it as %LR"),
        (
            ["--gin_params=TRAIN_STEPS = %UNDEFINED_STEPS"],
            r"macro %UNDEFINED_STEPS is used but not defined; bind it \(UNDEFINED_STEPS = ",
        ),
        (["--no_such_flag=1"], "Unknown command line flag 'no_such_flag'"),
        (["--model_dir="], "--model_dir is required"),
    ],
    ids=[
        "task_not_a_task",
        "bad_clip_norm",
        "zero_train_prefetch",
        "float_train_prefetch_bytes",
        "zero_steps_per_loop",
        "typo_of_a_macro",
        "unused_macro",
        "undefined_macro_of_a_setting",
        "unknown_flag",
        "no_model_dir",
    ],
)
def test_main_reports_mistakes_in_one_line(tmp_path, capsys, args, expected):
    model_dir = tmp_path / "run"
    status = train.main([f"--gin_file={DIGITS}", f"--model_dir={model_dir}", *args])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("orbitask: error: ")
    assert re.search(expected, err), err
    assert not model_dir.exists()


def test_main_forgets_the_previous_calls_flags(tmp_path, capsys):
    assert train.main([f"--gin_file={DIGITS}", "--gin_params=TASK=3", f"--model_dir={tmp_path}"])
    capsys.readouterr()
    assert train.main([f"--gin_file={DIGITS}"]) == 2
    assert "--model_dir is required" in capsys.readouterr().err


# ---------------------------------------------------------------------------- the binary

# (name, args, fragments the error line must contain). Each case is one real process.
BAD_RUNS = [
    (
        "typo_in_parameter",
        [f"--gin_file={DIGITS}", "--gin_params=orbitask.run_experiment.stratgy='x'"],
        ["orbitask.run_experiment", "stratgy"],
    ),
    (
        "unknown_configurable",
        [f"--gin_file={DIGITS}", "--gin_params=TASK = @orbitask.NoSuchTask()"],
        ["@orbitask.NoSuchTask()"],
    ),
    ("missing_gin_file", ["--gin_file=nope.gin"], ["--gin_file", "nope.gin", "does not exist"]),
    ("unknown_mode", [f"--gin_file={DIGITS}", "--mode=bogus"], ["--mode=bogus", "train_and_eval"]),
    (
        "zero_train_steps",
        [f"--gin_file={DIGITS}", "--gin_params=TRAIN_STEPS=0"],
        ["Received: train_steps=0 of type int", "orbitask.run_experiment.train_steps"],
    ),
    (
        "unknown_strategy",
        [f"--gin_file={DIGITS}", "--gin_params=orbitask.run_experiment.strategy='warp'"],
        ["`strategy`", "'warp'", "mirrored"],
    ),
    ("defaults_only", ["--gin_file=configs/defaults.gin"], ["no task", "TASK = @YourTask()"]),
]


def _orbitask_script():
    script = Path(sys.executable).parent / "orbitask"
    return str(script) if script.exists() else shutil.which("orbitask")


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory):
    """Runs every bad case (and the console script) as real processes, one per CPU at a time."""
    root = tmp_path_factory.mktemp("bad_runs")
    jobs = {name: ([*args, f"--model_dir={root / name}"],) for name, args, _ in BAD_RUNS}
    script = _orbitask_script()
    if script:
        jobs["console_script"] = (["--gin_file=nope.gin", f"--model_dir={root / 'x'}"], [script])
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        futures = {name: pool.submit(_binary, *job) for name, job in jobs.items()}
        results = {name: future.result() for name, future in futures.items()}
    return root, results


@pytest.mark.slow
@pytest.mark.parametrize("name, args, fragments", BAD_RUNS, ids=[case[0] for case in BAD_RUNS])
def test_binary_reports_bad_config_in_one_line(bad_runs, name, args, fragments):
    root, results = bad_runs
    result = results[name]
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    line = _error_line(result)
    for fragment in fragments:
        assert fragment in line
    assert not (root / name).exists()  # stopped before any work


@pytest.mark.slow
def test_console_script_is_the_same_binary(bad_runs):
    _, results = bad_runs
    if "console_script" not in results:
        pytest.skip("the `orbitask` console script is not installed")
    script, module = results["console_script"], results["missing_gin_file"]
    assert script.returncode == module.returncode == 2
    assert _error_line(script) == _error_line(module)


@pytest.mark.slow
def test_binary_trains_evaluates_and_writes_its_outputs(tmp_path):
    model_dir = tmp_path / "digits"
    result = _binary(
        [
            f"--gin_file={DIGITS}",
            "--gin_params=TRAIN_STEPS=30",
            "--gin_params=orbitask.run_experiment.eval_interval=30",
            "--gin_params=orbitask.run_experiment.checkpoint_interval=10",
            f"--model_dir={model_dir}",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "step 30/30" in result.stdout
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-30")
    operative = (model_dir / "operative_config.gin").read_text()
    assert "TRAIN_STEPS = 30" in operative
    assert "checkpoint_interval = 10" in operative
    for sub in ("train", "eval"):
        assert list((model_dir / sub).glob("events.out.tfevents.*")), f"no {sub} summaries"


# Mistakes in the user's own files, in-process: one line, exit 2, nothing written.
HEAD = "include 'configs/defaults.gin'\nTRAIN_STEPS = 5\n"
USER_FILES = [
    (
        "syntax_error",
        HEAD + "TASK = @orbitask.DigitsClassification(\norbitask.Task.clip_norm = 1.0\n",
        [],
        r"bad gin config: .*\(user\.gin, line \d+\)",
    ),
    (
        "missing_module",
        HEAD + "import no_such_module\nTASK = @orbitask.DigitsClassification()\n",
        [],
        r"No module named 'no_such_module'.*gin `import` line must be importable",
    ),
    (
        "module_with_a_broken_import",  # user_task.py sits next to the .gin file
        HEAD + "import user_task\nTASK = @orbitask.DigitsClassification()\n",
        [],
        r"No module named 'not_installed_package'.*import user_task",
    ),
    (
        "not_a_task",
        HEAD + "TASK = @orbitask.NanGuard()\n",
        [],
        r"TASK must be a tasks.Task instance.*of type NanGuard",
    ),
    (
        "abstract_task",
        HEAD + "TASK = @orbitask.Task()\n",
        [],
        r"Task must implement build_model\(\)\. Fix TASK in your experiment's .gin file",
    ),
    (
        "unclosed_bracket_in_a_binding",
        HEAD + "TASK = @orbitask.DigitsClassification()\n",
        ["--gin_params=TRAIN_STEPS = ("],
        r"unclosed bracket or quote in --gin_params",
    ),
    ("gin_file_is_a_folder", None, [], r"--gin_file '.*' does not exist"),
    (
        "undefined_macro",
        HEAD + "TASK = %MY_TASK\n",
        [],
        r"macro %MY_TASK is used but not defined; bind it \(MY_TASK = \.\.\.\)",
    ),
    (
        "parameter_server_without_a_cluster",
        HEAD + "TASK = @orbitask.DigitsClassification()\n",
        ["--gin_params=orbitask.run_experiment.strategy = 'parameter_server'"],
        r"'parameter_server' needs a cluster .* in TF_CONFIG, which is not set",
    ),
]


@pytest.mark.parametrize(
    "name, text, args, expected", USER_FILES, ids=[case[0] for case in USER_FILES]
)
def test_mistakes_in_user_files_are_one_line(
    tmp_path, capsys, monkeypatch, name, text, args, expected
):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    gin_file = tmp_path / "user.gin"
    if text is None:
        gin_file = tmp_path
    else:
        gin_file.write_text(text)
    (tmp_path / "user_task.py").write_text("import not_installed_package\n")
    model_dir = tmp_path / "run"
    status = train.main([f"--gin_file={gin_file}", f"--model_dir={model_dir}", *args])
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith("orbitask: error: "), err
    assert re.search(expected, err), err
    assert not model_dir.exists() or not any(model_dir.glob("ckpt-*"))


def test_a_model_dir_under_home_is_expanded(tmp_path, monkeypatch, capsys):
    """`--model_dir=~/run` (a shell leaves `~` after `=` as it is) writes under the home folder,
    where the last line points, and makes no folder named `~`."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    status = train.main(
        [f"--gin_file={DIGITS}", "--model_dir=~/run", "--mode=train",
         "--gin_params=TRAIN_STEPS = 2", "--gin_params=orbitask.run_experiment.progress = False"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0
    assert tf.train.latest_checkpoint(str(home / "run")).endswith("ckpt-2")
    assert not (tmp_path / "~").exists()
    assert out.strip().splitlines()[-1].endswith(f"--logdir {home / 'run'}")


def test_ctrl_c_while_a_command_imports_its_modules_is_one_line_and_exit_130(
    tmp_path, monkeypatch, capsys
):
    """A Ctrl-C at start-up, while the command's modules import (TensorFlow's take seconds),
    reaches no run's handler: one line, exit 130, no traceback."""
    from orbitask.trainers.commands import cli

    (tmp_path / "slow_start.py").write_text("raise KeyboardInterrupt  # Ctrl-C during imports\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.COMMANDS, "train", ("slow_start", "a command that imports slowly"))
    monkeypatch.setattr(sys, "argv", ["orbitask", f"--gin_file={DIGITS}"])
    try:
        with pytest.raises(SystemExit) as info:
            cli.run()
    except KeyboardInterrupt:
        pytest.fail("the Ctrl-C at start-up came out of the command as a KeyboardInterrupt")
    assert info.value.code == 130
    assert capsys.readouterr().err == (
        "orbitask: interrupted (Ctrl-C) outside training; nothing saved\n"
    )
