"""Other search tools: bare NAME=VALUE arguments are gin bindings; the 'hypertune' logger."""

import json
import os

import pytest

from orbitask.trainers import run_experiment
from orbitask.trainers.commands import bindings, cli
from orbitask.trainers.state import metrics_file
from tests.helpers import TinyTask

FLAGS = {"gin_file", "model_dir", "gin_params"}


def test_bare_and_dotted_or_macro_flag_arguments_are_bindings_and_others_stay():
    argv = [
        "--gin_file=a.gin",
        "orbitask.run_experiment.learning_rate=0.01",
        "--orbitask.DigitsClassification.l2=0.001",
        "--LR=0.5",
        "--model_dir=d",
        "--unknown=3",
        "loose",
    ]
    others, found = bindings.split(argv, FLAGS)
    assert found == [
        "orbitask.run_experiment.learning_rate = 0.01",
        "orbitask.DigitsClassification.l2 = 0.001",
        "LR = 0.5",
    ]
    assert others == ["--gin_file=a.gin", "--model_dir=d", "--unknown=3", "loose"]


def test_the_binary_binds_bare_arguments_after_gin_params(tmp_path, capsys):
    argv = [
        "--gin_file=experiments/digits.gin",
        f"--model_dir={tmp_path}",
        "--mode=train",
        "--gin_params=orbitask.run_experiment.progress=False",
        "--gin_params=orbitask.run_experiment.learning_rate=0.5",
        "TRAIN_STEPS=3",
        "orbitask.run_experiment.learning_rate=0.0025",
        "--orbitask.DigitsClassification.hidden_units=(8,)",
    ]
    assert cli.main(argv) == 0, capsys.readouterr().err
    config = (tmp_path / "operative_config.gin").read_text()
    assert "run_experiment.learning_rate = 0.0025\n" in config
    assert "DigitsClassification.hidden_units = (8,)\n" in config
    assert "TRAIN_STEPS = 3\n" in config


def test_an_argument_that_is_no_binding_is_one_line(tmp_path, capsys):
    argv = ["--gin_file=experiments/digits.gin", f"--model_dir={tmp_path}", "loose"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == "orbitask: error: unexpected argument 'loose'; a gin binding is NAME=VALUE."


def test_the_hypertune_logger_reports_each_evaluation_to_the_services_file(tmp_path, monkeypatch):
    pytest.importorskip("hypertune")
    reports = tmp_path / "hypertune" / "output.metrics"
    monkeypatch.setenv("CLOUD_ML_HP_METRIC_FILE", str(reports))  # where Vertex AI reads
    monkeypatch.setenv("CLOUD_ML_TRIAL_ID", "7")
    model_dir = tmp_path / "run"
    run_experiment(
        TinyTask(), str(model_dir), mode="train_and_eval", train_steps=20, global_batch_size=8,
        steps_per_loop=10, loop_seconds=None, eval_interval=10, progress=False,
        loggers=["tensorboard", "jsonl", "hypertune"],
    )  # fmt: skip
    written = [json.loads(line) for line in reports.read_text().splitlines()]
    accuracy = [(int(r["global_step"]), float(r["accuracy"])) for r in written if "accuracy" in r]
    rows = metrics_file.read(os.path.join(model_dir, "metrics.jsonl"))
    expected = [(r["step"], r["accuracy"]) for r in rows if r["split"] == "eval"]
    assert accuracy == expected and len(expected) == 2
    assert {r["trial"] for r in written} == {"7"}
    assert any("loss" in r for r in written)
