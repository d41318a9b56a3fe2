"""`run_experiment(...)["best"]`: the ranked metric's best evaluation, its step and checkpoint."""

import json
import os

from orbitask.trainers import ValidationControl, run_experiment
from orbitask.trainers.run import best
from tests.helpers import TinyTask

SETTINGS = dict(
    mode="train_and_eval",
    global_batch_size=8,
    steps_per_loop=5,
    loop_seconds=None,
    eval_interval=10,
    checkpoint_interval=10,
    progress=False,
    seed=3,
)


def _eval_lines(model_dir) -> list[dict]:
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        return [row for row in map(json.loads, f) if row["split"] == "eval"]


def test_best_is_the_best_evaluation_line_of_metrics_jsonl_across_a_resume(tmp_path, capsys):
    control = ValidationControl(metric="loss", higher_is_better=True, halve_lr_on_worse=False)
    run_experiment(
        TinyTask(), str(tmp_path), train_steps=20, validation_control=control, **SETTINGS
    )
    results = run_experiment(
        TinyTask(), str(tmp_path), train_steps=40, validation_control=control, **SETTINGS
    )
    lines = _eval_lines(tmp_path)
    assert [row["step"] for row in lines] == [10, 20, 30, 40]
    top = max(lines, key=lambda row: (row["loss"], -row["step"]))
    found = results["best"]
    assert (found.metric, found.value, found.step) == ("loss", top["loss"], top["step"])
    assert found.higher_is_better
    assert found.checkpoint == os.path.join(str(tmp_path), "best", f"best_ckpt-{top['step']}")
    assert os.path.exists(found.checkpoint + ".index")
    assert found.line() in capsys.readouterr().out


def test_without_a_control_accuracy_is_ranked_and_the_checkpoint_is_the_runs(tmp_path):
    results = run_experiment(TinyTask(), str(tmp_path), train_steps=30, **SETTINGS)
    lines = _eval_lines(tmp_path)
    top = max(lines, key=lambda row: (row["accuracy"], -row["step"]))
    found = results["best"]
    assert (found.metric, found.value, found.step) == ("accuracy", top["accuracy"], top["step"])
    assert found.checkpoint == os.path.join(str(tmp_path), f"ckpt-{top['step']}")


def test_mode_train_has_no_best(tmp_path):
    settings = {**SETTINGS, "mode": "train"}
    assert run_experiment(TinyTask(), str(tmp_path), train_steps=5, **settings)["best"] is None


def test_the_ranked_metric_follows_reports_rule_and_ties_go_to_the_earliest_step():
    assert best.ranked(["loss", "accuracy"]) == ("accuracy", True)
    assert best.ranked(["loss", "f1", "auc"]) == ("auc", True)
    assert best.ranked(["loss", "error_rate"]) == ("loss", False)
    assert best.ranked([]) is None
    evaluations = [(10, {"loss": 2.0}), (20, {"loss": 1.0}), (30, {"loss": 1.0})]
    assert best.pick(evaluations, "loss", False) == (1.0, 20)
    assert best.pick([(10, {"loss": float("nan")})], "loss", False) is None
    rows = [
        {"step": 10, "split": "train", "loss": 3.0},
        {"step": 10, "split": "eval", "loss": 2.0},
        {"step": 10, "split": "eval/clean", "accuracy": 0.5},
    ]
    assert best.evaluations_of(rows) == [(10, {"loss": 2.0, "clean/accuracy": 0.5})]
