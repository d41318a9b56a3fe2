"""A model directory on object storage: TensorFlow's `ram://` file system goes through
`tf.io.gfile` as `gs://` does (and, like `gs://`, has no local folder), so every run here writes
there, in this process, with no network. Train, kill and resume, evaluate, predict, export, warm
start, report; the logs in segments (no append there); nothing in the working directory."""

import csv
import io
import os
import uuid

import numpy as np
import pytest
import tensorflow as tf

import orbitask
from orbitask.common import files
from orbitask.trainers import WarmStart, run_experiment
from orbitask.trainers.commands import export, report, train
from orbitask.trainers.errors import ConfigError
from orbitask.trainers.state import metrics_file
from tests.helpers import DiesAt, Killed

BUCKET = f"ram://orbitask-tests-{uuid.uuid4().hex[:8]}"
SETTINGS = dict(mode="train_and_eval", train_steps=8, global_batch_size=8, steps_per_loop=2,
                loop_seconds=None, checkpoint_interval=4, checkpoint_seconds=None,
                eval_interval=4, strategy="one_device", progress=False, seed=0,
                keep_input_positions=1, loggers=("tensorboard", "jsonl", "csv"))  # fmt: skip


def _run(task, model_dir, **kwargs):
    return run_experiment(task, model_dir, **{**SETTINGS, **kwargs})


def _rows(model_dir) -> list[dict]:
    rows = metrics_file.read(f"{model_dir}/metrics.jsonl")
    for row in rows:
        row.pop("steps_per_second", None)  # the one figure of the clock
    return rows


def _csv(model_dir) -> list[list[str]]:
    rows = list(csv.reader(io.StringIO(files.read_appended(f"{model_dir}/metrics.csv"))))
    return [r for r in rows if "steps_per_second" not in r]


def _weights(model_dir) -> dict[str, np.ndarray]:
    """Every tensor of the latest checkpoint but its save counter (the resumed run saved more)
    and its object graph (which names each process's optimizer)."""
    reader = files.checkpoint_reader(tf.train.latest_checkpoint(model_dir))
    skip = ("save_counter", "_CHECKPOINTABLE_OBJECT_GRAPH")
    names = [n for n in reader.get_variable_to_shape_map() if not n.startswith(skip)]
    return {n: reader.get_tensor(n) for n in names}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An uninterrupted run and one killed after step 7 and resumed (seed 0), both on ram://,
    trained from an empty working directory; returns their paths and that directory."""
    here, cwd = tmp_path_factory.mktemp("cwd"), os.getcwd()
    os.chdir(here)
    try:
        whole, split = f"{BUCKET}/runs/whole", f"{BUCKET}/runs/split"
        _run(DiesAt(), whole)
        with pytest.raises(Killed):
            _run(DiesAt(at=7), split)
        killed = _rows(split)
        _run(DiesAt(), split)
    finally:
        os.chdir(cwd)
    return dict(whole=whole, split=split, cwd=here, killed=killed)


def test_a_run_on_object_storage_leaves_nothing_in_the_working_directory(runs):
    assert os.listdir(runs["cwd"]) == []
    assert files.exists(f"{runs['whole']}/ckpt-8.index")


def test_killed_and_resumed_equals_uninterrupted_bit_for_bit(runs):
    whole, split = runs["whole"], runs["split"]
    # held for the next checkpoint, the lines past checkpoint 4 were written at the run's end
    assert max(r["step"] for r in runs["killed"]) > 4
    mine, theirs = _weights(split), _weights(whole)
    assert mine.keys() == theirs.keys() and mine
    for name in mine:
        np.testing.assert_array_equal(mine[name], theirs[name])
    assert _rows(split) == _rows(whole)
    assert _csv(split) == _csv(whole)
    assert [(r["step"], r["split"]) for r in _rows(whole)] == [
        (2, "train"), (4, "train"), (4, "eval"), (6, "train"), (8, "train"), (8, "eval")
    ]  # fmt: skip


def test_logs_are_written_in_segments_and_read_back_as_one(runs):
    """No append on object storage: each checkpoint interval's lines are one more object; the
    resume rewrote the file whole from its checkpoint and went on in segments."""
    for run in (runs["whole"], runs["split"]):
        for name in ("metrics.jsonl", "metrics.csv"):
            parts = files.pieces(f"{run}/{name}")
            assert len(parts) >= 2 and all(
                ".part-" in p for p in parts[1 if "split" in run else 0 :]
            )
    import pandas

    whole = files.pieces(f"{runs['whole']}/metrics.jsonl")
    frame = pandas.concat(
        pandas.read_json(io.StringIO(files.read_text(p)), lines=True) for p in whole
    )
    assert list(frame["step"]) == [r["step"] for r in _rows(runs["whole"])]


def test_run_json_settings_record_and_input_positions(runs):
    split = runs["split"]
    entries = files.read_json(f"{split}/run.json")
    assert [e["start_step"] for e in entries] == [0, 4], entries  # both starts kept
    assert files.listdir(f"{split}/input") == ["ckpt-8"]  # keep_input_positions = 1: pruned
    assert "operative_config-0.gin" in files.listdir(split)
    assert files.exists(f"{split}/model_summary.txt")


def test_eval_eval_all_and_continuous_eval_from_object_storage(runs):
    whole = runs["whole"]
    out = f"{BUCKET}/eval-out"
    logs = _run(DiesAt(), whole, mode="eval", output_dir=out)
    assert "accuracy" in logs["eval"]
    _run(DiesAt(), whole, mode="eval_all", output_dir=f"{BUCKET}/eval-all")
    steps = [r["step"] for r in metrics_file.read(f"{BUCKET}/eval-all/eval/metrics.jsonl")]
    assert steps == [4, 8]
    _run(DiesAt(), whole, mode="continuous_eval", continuous_eval_timeout=1,
         output_dir=f"{BUCKET}/eval-cont")  # fmt: skip
    assert metrics_file.read(f"{BUCKET}/eval-cont/eval/metrics.jsonl")[-1]["step"] == 8
    assert metrics_file.read(f"{out}/eval/metrics.jsonl")[-1]["step"] == 8


def test_predict_and_read_predictions_on_object_storage(runs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = f"{BUCKET}/predicted"
    _run(DiesAt(), runs["whole"], mode="predict", output_dir=out)
    got = orbitask.read_predictions(out)
    assert got.shape == (96, 3)
    assert os.listdir(tmp_path) == []  # no local `ram:/...` folder


def test_export_and_export_to_an_output_dir(runs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    whole = runs["whole"]
    path = export.checkpoint_to_export(whole, best=False)
    assert export.export(DiesAt(), whole, path) == f"{whole}/export/8"
    assert files.listdir(f"{whole}/export") == ["8"]  # the temporary folder moved into place
    out = f"{BUCKET}/exported"
    assert export.export(DiesAt(), whole, path, output_dir=out) == f"{out}/8"
    serve = tf.saved_model.load(f"{out}/8").signatures["serving_default"]
    assert serve(inputs=tf.zeros((2, 6)))["outputs"].shape == (2, 3)
    assert os.listdir(tmp_path) == []


def test_warm_start_from_a_checkpoint_on_object_storage(runs):
    """`tf.train.load_checkpoint` would take the `ram://` prefix for a folder."""
    model = DiesAt().build_model()
    found = WarmStart(init_checkpoint=f"{runs['whole']}/ckpt-8").apply(model)
    assert found["restored"] and not found["missing"]
    saved = _weights(runs["whole"])
    kernel = saved["optimizer/_trainable_variables/0/.ATTRIBUTES/VARIABLE_VALUE"]  # saved once
    np.testing.assert_array_equal(model.weights[0].numpy(), kernel)


def test_report_over_one_run_and_several(runs, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert report.main([f"--model_dir={runs['whole']}"]) == 0
    assert files.exists(f"{runs['whole']}/report.png")
    assert "best        eval accuracy" in capsys.readouterr().out
    assert report.main([f"--model_dir={BUCKET}/runs"]) == 0
    text = capsys.readouterr().out
    assert "split" in text and "whole" in text
    assert files.exists(f"{BUCKET}/runs/report.png")
    assert os.listdir(tmp_path) == []


def test_the_id_files_of_mlflow_and_wandb_on_object_storage():
    from orbitask.trainers.state import loggers, tracking_loggers

    folder = f"{BUCKET}/ids"
    files.makedirs(folder)
    tracking_loggers._write(f"{folder}/wandb_run_id", "abc")
    assert tracking_loggers._read(f"{folder}/wandb_run_id") == "abc"
    assert tracking_loggers._read(f"{folder}/mlflow_run_id") is None
    assert loggers.run_name(f"{BUCKET}/runs/digits/") == "digits"


@pytest.mark.parametrize("flag", ["--model_dir", "--output_dir"])
def test_a_scheme_tensorflow_does_not_know_is_refused_before_any_work(flag, capsys, tmp_path):
    args = ["--gin_file=experiments/digits.gin", "--model_dir=s3://bucket/run", "--mode=eval"]
    if flag == "--output_dir":
        args[1:2] = [f"--model_dir={tmp_path}", "--output_dir=s3://bucket/out"]
    assert train.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{flag} 's3://bucket/" in err[0]
    assert "mount" in err[0] and "sync folder" in err[0] and "local directory" in err[0]
    with pytest.raises(ConfigError, match="no file system for s3://"):
        run_experiment(DiesAt(), "s3://bucket/run", **SETTINGS)


def test_report_refuses_a_scheme_tensorflow_does_not_know_and_expands_home(capsys, tmp_path):
    assert report.main(["--model_dir=s3://bucket/run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--model_dir 's3://bucket/run'" in err[0] and "mount" in err[0]
    os.environ["HOME"], home = str(tmp_path), os.environ["HOME"]
    try:
        assert report.main(["--model_dir=~/missing"]) == 2
    finally:
        os.environ["HOME"] = home
    assert f"{tmp_path}/missing" in capsys.readouterr().err
