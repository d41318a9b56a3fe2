"""`orbitask report`: a PNG of the curves and a text summary from a real run's event files."""

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from orbitask.trainers import run_experiment
from orbitask.trainers.commands import cli, report, several_runs
from orbitask.trainers.state import metrics_file
from tests.helpers import TinyTask
from tests.test_settings_record import _train


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A real 20-step train_and_eval run: summaries every loop, evals at steps 10 and 20."""
    path = tmp_path_factory.mktemp("report") / "run"
    run_experiment(
        TinyTask(),
        str(path),
        mode="train_and_eval",
        train_steps=20,
        global_batch_size=8,
        steps_per_loop=5,
        loop_seconds=None,  # 5-step loops throughout: a train summary point every 5 steps
        eval_interval=10,
        checkpoint_interval=10,
        progress=False,
    )
    return path


def test_report_writes_the_png_and_a_summary(model_dir, capsys):
    assert cli.main(["report", f"--model_dir={model_dir}"]) == 0
    out = capsys.readouterr().out
    png = model_dir / "report.png"
    with Image.open(png) as image:
        assert image.format == "PNG" and image.size == (1000, 700)
    assert re.search(r"^train +20 steps, last loss [0-9.e+-]+$", out, re.M), out
    assert re.search(
        r"^best +eval accuracy [0-9.]+ at step (10|20) \(max; last [0-9.]+ at step 20\)", out, re.M
    ), out
    assert re.search(rf"^checkpoint +{re.escape(str(model_dir))}/ckpt-20$", out, re.M), out
    assert re.search(r"^time +[0-9.]+ s in 1 process ", out, re.M), out
    assert f"plot        {png}" in out


def test_the_run_holds_every_plotted_series(model_dir):
    run = report.load_run(str(model_dir))
    for tag in ("loss", "grad_norm", "learning_rate", "steps_per_second"):
        steps, values = run.train[tag]
        assert list(steps) == [5, 10, 15, 20], tag  # one value per step, duplicates merged
    assert list(run.eval["accuracy"][0]) == [10, 20]
    assert report.pick_metric(run) == "accuracy"
    assert report.pick_metric(run, "loss") == "loss"
    value, step = report.best(run, "loss")
    assert value == min(run.eval["loss"][1]) and step in (10, 20)


def test_output_and_metric_flags(model_dir, tmp_path, capsys):
    png = tmp_path / "curves.png"
    assert report.main([f"--model_dir={model_dir}", f"--output={png}", "--metric=loss"]) == 0
    assert png.stat().st_size > 10_000
    assert re.search(r"best +eval loss [0-9.e+-]+ at step \d+ \(min;", capsys.readouterr().out)


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "--model_dir is required"),
        (["--model_dir={missing}"], "--model_dir '.*missing' does not exist"),
        (["--model_dir={empty}"], "'.*empty' is neither a run .* nor a folder of runs"),
        (["--model_dir={run}", "--model_dir={empty}"], "'.*empty' is neither a run"),
        (
            ["--model_dir={run}", "--metric=f1"],
            "--metric 'f1' is not an eval summary of this run; it has: accuracy, loss.",
        ),
        (["--model_dir={run}", "--output={missing}/x.png"], "cannot write the plot to --output"),
        (["--modle_dir=x"], "Unknown command line flag 'modle_dir'"),
        (["{run}"], "unexpected argument.*use --model_dir=DIR"),
    ],
    ids=[
        "no_dir",
        "missing",
        "empty",
        "one_empty",
        "bad_metric",
        "bad_output",
        "typo",
        "positional",
    ],
)
def test_mistakes_are_one_line(model_dir, tmp_path, capsys, args, message):
    (tmp_path / "empty").mkdir()
    paths = dict(run=model_dir, missing=tmp_path / "missing", empty=tmp_path / "empty")
    assert report.main([a.format(**paths) for a in args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("orbitask: error: "), err
    assert re.search(message, err), err


def test_cli_dispatch(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in cli.COMMANDS)
    assert cli.main(["bogus"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("orbitask: error: unknown command 'bogus'; commands: train, report, new")


def test_report_imports_no_code_from_the_model_directory(model_dir, tmp_path, capsys):
    """A module planted in the model directory and named by its operative config is not run."""
    run = tmp_path / "run"
    shutil.copytree(model_dir, run)
    name = f"planted_{os.getpid()}"
    marker = tmp_path / "planted_ran"
    (run / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    operative = (run / "operative_config.gin").read_text()
    (run / "operative_config.gin").write_text(f"import {name}\n{operative}")
    assert cli.main(["report", f"--model_dir={run}"]) == 0
    assert "best" in capsys.readouterr().out
    assert not marker.exists() and name not in sys.modules


def test_one_steps_per_second_on_the_console_in_metrics_jsonl_tensorboard_and_the_report(
    tmp_path, capsys
):
    """The progress line's figure at each step it prints is metrics.jsonl's, TensorBoard's and
    the report's, whose steps/s panel keeps every point, the first included."""
    run_experiment(TinyTask(), str(tmp_path), mode="train_and_eval", train_steps=40,
                   global_batch_size=8, steps_per_loop=5, loop_seconds=None,
                   eval_interval=20)  # fmt: skip
    out = capsys.readouterr().out
    console = {
        int(s): float(r) for s, r in re.findall(r"^step (\d+)/40 \| ([0-9.]+) steps/s", out, re.M)
    }
    assert set(console) >= {5, 40}, out  # the first loop and the last step
    rows = [r for r in metrics_file.read(str(tmp_path / "metrics.jsonl")) if r["split"] == "train"]
    jsonl = {r["step"]: r["steps_per_second"] for r in rows if "steps_per_second" in r}
    assert sorted(jsonl) == [5, 10, 15, 20, 25, 30, 35, 40]
    events = [e for p in (tmp_path / "train").glob("events.out.tfevents.*")
              for e in report.read_events(str(p)) if e[0] == "steps_per_second"]  # fmt: skip
    assert {step: value for _, step, _, value in events} == pytest.approx(jsonl, rel=1e-6)
    for step, shown in console.items():
        assert shown == round(jsonl[step], 1), (step, shown, jsonl[step])
    name, lines = report.panels(report.load_run(str(tmp_path)))[3]
    ((label, series, tag),) = lines
    steps, values = series[tag]
    assert name == "steps/s" and list(steps) == sorted(jsonl)
    assert list(values) == [jsonl[s] for s in sorted(jsonl)]


@pytest.mark.slow
def test_the_command_prints_no_tensorflow_start_up_lines(model_dir):
    command = [sys.executable, "-m", "orbitask.trainers.commands.cli", "report"]
    quiet = ("CUDA_VISIBLE_DEVICES", "TF_CPP_MIN_LOG_LEVEL")  # as a user's shell has them
    env = {k: v for k, v in os.environ.items() if k not in quiet}
    done = subprocess.run(
        [*command, f"--model_dir={model_dir}"], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "" and done.stdout.startswith("run "), done.stderr


@pytest.mark.slow  # three digits runs
def test_several_runs_are_overlaid_and_tabled_with_the_bindings_that_differ(tmp_path, capsys):
    """A sweep's folder, or its runs named one by one: a row per run with its final and best
    evaluation (from its metrics file) and the bindings that differ between the runs."""
    rate = "orbitask.run_experiment.learning_rate = {}"
    _train(tmp_path / "sweep" / "lr_0.1", 30, rate.format(0.1), mode="train_and_eval")
    _train(tmp_path / "sweep" / "lr_0.001", 30, rate.format(0.001), mode="train_and_eval")
    _train(tmp_path / "sweep" / "lr_0.001_long", 40, rate.format(0.001), mode="train_and_eval")
    capsys.readouterr()
    assert report.main([f"--model_dir={tmp_path / 'sweep'}"]) == 0
    out = capsys.readouterr().out
    header, *rows = out.split("\n\n")[0].splitlines()
    assert header.split() == ["run", "steps", "final", "accuracy", "best", "accuracy", "(step)",
                              "TRAIN_STEPS", "run_experiment.learning_rate"]  # fmt: skip
    assert [r.split()[0] for r in rows] == ["lr_0.001", "lr_0.001_long", "lr_0.1"]
    for row in rows:
        name, steps, final, best, best_step, train_steps, lr = row.split()
        evals = [r for r in metrics_file.read(str(tmp_path / "sweep" / name / "metrics.jsonl"))
                 if r["split"] == "eval"]  # fmt: skip
        assert int(steps) == int(train_steps) == evals[-1]["step"]
        assert float(final) == pytest.approx(evals[-1]["accuracy"], abs=5e-5)
        top = max(evals, key=lambda r: r["accuracy"])
        assert float(best) == pytest.approx(top["accuracy"], abs=5e-5)
        assert best_step == f"({top['step']})" and lr == name.split("_")[1]
    with Image.open(tmp_path / "sweep" / "report.png") as image:
        assert image.size == (1000, 700)

    two = [f"--model_dir={tmp_path / 'sweep' / n}" for n in ("lr_0.1", "lr_0.001")]
    assert report.main([*two, f"--output={tmp_path / 'two.png'}"]) == 0
    header, *rows = capsys.readouterr().out.split("\n\n")[0].splitlines()
    assert header.split()[-1] == "run_experiment.learning_rate" and "TRAIN_STEPS" not in header
    assert [r.split()[0] for r in rows] == ["lr_0.1", "lr_0.001"]
    assert (tmp_path / "two.png").stat().st_size > 10_000


def test_the_table_tells_a_runs_final_evaluation_from_its_best(tmp_path):
    runs = [str(tmp_path / "a"), str(tmp_path / "b")]
    evals = [{"accuracy": (np.array([10, 20, 30]), np.array([0.5, 0.9, 0.7]))},
             {"loss": (np.array([10]), np.array([1.0]))}]  # fmt: skip
    loaded = [report.Run(train={}, eval=e, seconds=[1.0]) for e in evals]
    rows = [r.split() for r in several_runs.table(runs, loaded, "accuracy").splitlines()[1:]]
    assert rows == [["a", "30", "0.7", "0.9", "(20)"], ["b", "10", "-", "-"]]


def test_each_run_keeps_one_colour_in_every_panel():
    """Run `a` has no evaluation: `b` and `c` keep their colours in the eval panels."""
    points = (np.array([10, 20]), np.array([1.0, 0.5]))
    rate = {"loss": points, "learning_rate": points}
    loaded = [report.Run(train=rate, eval={}, seconds=[1.0])]
    loaded += [report.Run(train=rate, eval={"loss": points, "accuracy": points}, seconds=[1.0])] * 2
    figure = several_runs.figure(["runs/a", "runs/b", "runs/c"], loaded, "accuracy")
    colours = {}
    for ax in figure.axes:
        for line in ax.get_lines():
            colours.setdefault(line.get_label(), set()).add(line.get_color())
    assert sorted(colours) == ["a", "b", "c"]
    assert all(len(c) == 1 for c in colours.values()), colours
    assert len({c for cs in colours.values() for c in cs}) == 3


def test_the_table_fits_120_columns_with_the_set_bindings_and_lists_the_rest(tmp_path):
    """Bindings set in gin (run.json's `set`) are columns while they fit; the others that
    differ, set or not, are listed below, one a line."""
    import json

    runs = []
    for i, rate in enumerate(("0.1", "0.01", "0.001")):
        run = tmp_path / f"lr_{rate}"
        run.mkdir()
        operative = {
            "run_experiment.learning_rate": rate,
            "run_experiment.loop_seconds": f"{i}.0",  # differs, set by nobody
            "TASK/DigitsClassification.hidden_units": f"({', '.join(['128'] * (6 + i))})",
            "TASK/DigitsClassification.l2": f"0.00{i}",
        }
        (run / "operative_config.gin").write_text(
            "".join(f"{k} = {v}\n" for k, v in operative.items())
        )
        set_ = {k: v for k, v in operative.items() if "loop_seconds" not in k}
        text = "".join(f"orbitask.{k.rpartition('/')[2]} = {v}\n" for k, v in set_.items())
        (run / "run.json").write_text(json.dumps([{"set": text}]))
        runs.append(str(run))
    loaded = [
        report.Run(train={}, eval={"accuracy": (np.array([10]), np.array([0.5]))}, seconds=[1.0])
    ] * 3
    text = several_runs.table(runs, loaded, "accuracy")
    assert max(len(line) for line in text.splitlines()) <= 120, text
    header = text.splitlines()[0]
    assert "run_experiment.learning_rate" in header and "loop_seconds" not in header, text
    below = text.split("\n\n")[1].splitlines()[1:]
    assert "  run_experiment.loop_seconds: 0.0 | 1.0 | 2.0" in below, text
    named = {line.split(":")[0].strip() for line in below}
    for key in ("TASK/DigitsClassification.hidden_units", "TASK/DigitsClassification.l2"):
        assert (key in header) != (key in named), (key, text)  # a column, or listed below
    assert "TASK/DigitsClassification.hidden_units" in named  # too wide after the others
