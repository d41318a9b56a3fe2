"""`--mode=predict`: a checkpoint's model over the prediction input, on 1 device and 2 replicas
with a partial last batch, written in shards; killed with SIGKILL and rerun, every example
once, equal to an uninterrupted prediction and to the model applied directly."""

import json
import os
import random
import re
import shutil
import signal
import sys
import time

import gin
import numpy as np
import pytest
import tensorflow as tf

import orbitask
from orbitask import DigitsClassification, run_experiment
from orbitask.trainers.errors import ConfigError
from orbitask.trainers.state import predictions
from tests import faults, launching
from tests.helpers import TinyTask

SETTINGS = dict(global_batch_size=16, progress=False, steps_per_loop=5, train_steps=None)
SHARD = re.compile(r"worker-\d{3}-from-\d{9}\.npz")


def shard_names(folder: str) -> list[str]:
    """The whole shard files in `folder` (`worker-<w>-from-<step>.npz`), sorted."""
    return sorted(n for n in tf.io.gfile.listdir(folder) if SHARD.fullmatch(n))


@gin.configurable
class SlowPredictions(DigitsClassification):
    """The digits classifier, its prediction step slowed (20 ms) so a kill lands mid-way, and
    its outputs a dict: the logits and each example's class."""

    def predict_step(self, batch, model):
        logits = super().predict_step(batch, model)
        pause = tf.py_function(lambda: time.sleep(0.02) or 0.0, [], tf.float32)
        with tf.control_dependencies([pause]):
            return {"logits": tf.identity(logits), "class": tf.argmax(logits, -1)}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A digits model trained 10 steps; its validation inputs and the model's outputs on them,
    applied directly."""
    model_dir = tmp_path_factory.mktemp("predict") / "run"
    run_experiment(DigitsClassification(), str(model_dir), mode="train", train_steps=10,
                   global_batch_size=16, progress=False, strategy="one_device")  # fmt: skip
    model = DigitsClassification().build_model()
    tf.train.Checkpoint(train_model=model).restore(
        tf.train.latest_checkpoint(str(model_dir))
    ).expect_partial()
    inputs = np.concatenate([x for x, _ in DigitsClassification().build_inputs(16, None, False)])
    return model_dir, inputs, model(inputs, training=False).numpy()


@pytest.mark.slow  # two predictions and a training run
@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_predictions_are_the_model_applied_directly(trained, tmp_path, strategy):
    model_dir, inputs, expected = trained
    assert len(inputs) % 16, "the last batch must be partial"
    done = run_experiment(DigitsClassification(), str(model_dir), mode="predict",
                          strategy=strategy, output_dir=str(tmp_path), **SETTINGS)  # fmt: skip
    assert done["predict"]["examples"] == len(inputs) and done["predict"]["step"] == 10
    got = orbitask.read_predictions(str(tmp_path))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    shards = shard_names(str(tmp_path / "predictions"))
    assert len(shards) == -(-len(inputs) // 16 // 5)  # a shard every steps_per_loop steps
    assert not (model_dir / "predictions").exists()  # --output_dir: the model dir only read


def _command(model_dir, gin_file, out, *params):
    command = [sys.executable, "-m", "orbitask.trainers.commands.train", f"--gin_file={gin_file}",
               f"--model_dir={model_dir}", "--mode=predict", f"--output_dir={out}"]  # fmt: skip
    return command + [f"--gin_params=orbitask.run_experiment.{p}" for p in params]


@pytest.mark.slow  # the real program, stopped and run again
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_a_stopped_prediction_reruns_to_every_example_once(trained, tmp_path, sig):
    """SIGKILL or Ctrl-C (SIGINT: it stops after the next shard, exit 130, one line) to
    `orbitask --mode=predict` on 2 replicas after a drawn number of shards; the same command
    again gives what an uninterrupted prediction gives, each example once."""
    model_dir, inputs, expected = trained
    gin_file = tmp_path / "slow.gin"
    gin_file.write_text(
        "include 'experiments/digits.gin'\nimport tests.test_predict\nTASK = @SlowPredictions()\n"
    )
    out = tmp_path / "out"
    settings = ["cpu_devices = 2", "global_batch_size = 4", "steps_per_loop = 3"]
    command = _command(model_dir, gin_file, out, *settings)
    batches = random.Random(0).choice([6, 15, 30])
    proc, said = faults.kill_after_line(command, random.Random(0), sig, steps=(0,), timeout=240,
                                        line=f"orbitask: predicted {batches} batches")  # fmt: skip
    if sig == signal.SIGINT:
        assert proc.returncode == 130, said
        assert "orbitask: interrupted: SIGINT received: stopped with the predictions" in said
        assert "Traceback" not in said, said
    else:
        assert proc.returncode == -signal.SIGKILL, said
    folder = out / "predictions"
    assert not (folder / "worker-000-done.json").exists(), "the kill came too late"
    written = predictions.steps_done(str(folder), 1)
    assert written >= batches
    with pytest.raises(ConfigError, match="is not complete .* run the same --mode=predict"):
        orbitask.read_predictions(str(out))

    kept = {n: os.stat(folder / n).st_mtime_ns for n in shard_names(str(folder))}
    again = faults.run(command, timeout=240)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"after the {written} batches a run before wrote" in again.stdout
    assert all(os.stat(folder / n).st_mtime_ns == t for n, t in kept.items())  # not redone
    got = orbitask.read_predictions(str(out))
    assert sorted(got) == ["class", "logits"] and len(got["logits"]) == len(inputs)
    np.testing.assert_allclose(got["logits"], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got["class"], expected.argmax(-1))


def test_a_folder_of_another_checkpoint_is_refused_in_one_line(tmp_path):
    facts = {"checkpoint": "ckpt-10", "step": 10, "workers": 1, "global_batch_size": 16}
    predictions.write_manifest(str(tmp_path), facts, {"a": 0})
    with pytest.raises(ConfigError, match=r"other settings \(checkpoint 'ckpt-10' -> 'ckpt-20'"):
        predictions.check_manifest(str(tmp_path), {**facts, "checkpoint": "ckpt-20"})


def test_shards_join_in_step_order_and_a_half_written_one_is_dropped(tmp_path):
    folder = str(tmp_path)
    predictions.write_manifest(folder, {"workers": 1}, ({"b": 0, "a": 0}, 0))
    for start, rows in ((0, [0, 1, 2]), (3, [3, 4])):
        block = np.array(rows)
        leaves = [block * 10, block, -block]  # a, b (sorted keys), then the tuple's second
        predictions.write_shard(folder, 0, start, len(rows), leaves)  # a row a step
    (tmp_path / "worker-000-from-000000005.tmp99.npz").write_bytes(b"cut")
    predictions.remove_partial(folder, 0)
    assert predictions.steps_done(folder, 1) == 5
    predictions.write_done(folder, 0, 5)
    (first, second) = orbitask.read_predictions(folder)
    assert list(first) == ["b", "a"]
    np.testing.assert_array_equal(first["a"], [0, 10, 20, 30, 40])
    np.testing.assert_array_equal(second, [0, -1, -2, -3, -4])
    assert os.listdir(folder).count("worker-000-from-000000005.tmp99.npz") == 0


WORKERS = {"worker": ["localhost:1", "localhost:2"]}


def test_a_rerun_goes_on_after_the_steps_every_worker_covers_with_the_same_batch_size(
    tmp_path, monkeypatch, capsys
):
    """Each worker of a 2-worker job (TF_CONFIG; one device each, so each predicts the whole
    input: 12 batches) reruns from the steps that every worker's shards cover, 2 here although
    worker 0 wrote 6: the workers' steps run together. A rerun with another global batch size
    is refused before any step (its batches would not be the shards' steps)."""
    model_dir, out = tmp_path / "run", tmp_path / "out"
    task = TinyTask()
    run_experiment(task, str(model_dir), mode="train", train_steps=2, global_batch_size=8,
                   progress=False, strategy="one_device")  # fmt: skip
    model = task.build_model()
    tf.train.Checkpoint(train_model=model).restore(
        tf.train.latest_checkpoint(str(model_dir))
    ).expect_partial()
    expected = model(task.x, training=False).numpy()

    def predict(worker, batch=8):
        job = {"cluster": WORKERS, "task": {"type": "worker", "index": worker}}
        monkeypatch.setenv("TF_CONFIG", json.dumps(job))
        done = run_experiment(TinyTask(), str(model_dir), mode="predict", output_dir=str(out),
                              strategy="one_device", **{**SETTINGS, "global_batch_size": batch,
                                                        "steps_per_loop": 2})  # fmt: skip
        return done["predict"]["examples"]

    assert predict(0) == 96  # all of worker 0's shards; worker 1 wrote only its first
    folder = out / "predictions"
    os.remove(folder / "worker-000-done.json")
    shutil.copy(folder / "worker-000-from-000000000.npz", folder / "worker-001-from-000000000.npz")
    before = sorted(os.listdir(folder))
    with pytest.raises(ConfigError, match=r"other settings \(global_batch_size 8 -> 4\)"):
        predict(0, batch=4)
    assert sorted(os.listdir(folder)) == before
    capsys.readouterr()
    assert [predict(0), predict(1)] == [80, 80]
    assert capsys.readouterr().out.count("after the 2 batches a run before wrote") == 2
    got = orbitask.read_predictions(str(out))
    np.testing.assert_allclose(got, np.concatenate([expected, expected]), rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # the trained fixture
def test_an_infinite_prediction_input_is_refused_in_one_line(trained, tmp_path):
    class Forever(DigitsClassification):
        def build_predict_inputs(self, per_replica_batch_size, input_context=None):
            return super().build_predict_inputs(per_replica_batch_size, input_context).repeat()

    model_dir, _, _ = trained
    with pytest.raises(ConfigError, match=r"^Forever.build_predict_inputs returned an infinite"):
        run_experiment(Forever(), str(model_dir), mode="predict", output_dir=str(tmp_path),
                       strategy="one_device", **SETTINGS)  # fmt: skip


@pytest.mark.slow  # the trained fixture
def test_fast_dev_run_predicts_one_step_and_writes_nothing(trained, capsys):
    model_dir, _, _ = trained
    before = sorted(os.listdir(model_dir))
    done = run_experiment(DigitsClassification(), str(model_dir), mode="predict",
                          fast_dev_run=True, strategy="mirrored", **SETTINGS)  # fmt: skip
    assert done["predict"]["examples"] == 16 and sorted(os.listdir(model_dir)) == before
    assert "fast_dev_run: one prediction step ran with ckpt-10 (outputs [16, 10])" in (
        capsys.readouterr().out
    )


@pytest.mark.slow  # a 2-worker job under the launcher
def test_two_workers_predict_every_example_once(trained, tmp_path):
    """Under `orbitask launch --workers 2`, each worker predicts its shard of the input
    (`Dataset.shard`: every second example) into its own files; read_predictions gives worker
    0's examples, then worker 1's."""
    model_dir, inputs, expected = trained
    out = tmp_path / "out"
    flags = ["--gin_file=experiments/digits.gin", f"--model_dir={model_dir}", "--mode=predict",
             f"--output_dir={out}", "--gin_params=TRAIN_STEPS = 10",
             "--gin_params=orbitask.run_experiment.global_batch_size = 16",
             "--gin_params=orbitask.run_experiment.progress = False"]  # fmt: skip
    status, text = launching.run(["--workers", "2"], flags, tmp_path / "job")
    assert status == 0, text[-3000:]
    assert "CollectiveAllReduceStrategy, 2 replicas" in text, text[-3000:]  # 2 workers
    got = orbitask.read_predictions(str(out))
    np.testing.assert_allclose(got, np.concatenate([expected[0::2], expected[1::2]]),
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    names = shard_names(str(out / "predictions"))
    assert {n[:10] for n in names} == {"worker-000", "worker-001"}


@pytest.mark.slow  # a 2-worker job under the launcher, stopped, then run again
@pytest.mark.parametrize("ctrl_c", [False, True])
def test_sigterm_to_the_launcher_stops_both_workers_after_one_shard_and_the_rerun_ends_it(
    trained, tmp_path, ctrl_c
):
    """SIGTERM to `orbitask launch` while 2 workers predict (TensorFlow's multi-worker runtime
    has a SIGTERM handler that only logs), or a terminal's Ctrl-C (SIGINT to the launcher's
    process group: the workers are detached from the terminal, so each gets the launcher's
    relay only, not a second SIGINT that would end it at once): both stop after the same shard, exit
    75 (130) with one line each, as does the launcher; the same command predicts the rest,
    every example once."""
    model_dir, inputs, expected = trained
    gin_file = tmp_path / "slow.gin"
    gin_file.write_text(
        "include 'experiments/digits.gin'\nimport tests.test_predict\nTASK = @SlowPredictions()\n"
    )
    out = tmp_path / "out"
    flags = [f"--gin_file={gin_file}", f"--model_dir={model_dir}", "--mode=predict",
             f"--output_dir={out}", "--gin_params=TRAIN_STEPS = 10",
             "--gin_params=orbitask.run_experiment.global_batch_size = 4",
             "--gin_params=orbitask.run_experiment.steps_per_loop = 3"]  # fmt: skip
    proc = launching.start(["--workers", "2"], flags, tmp_path / "first")
    try:
        deadline = time.monotonic() + 240
        while "predicted 6 batches" not in launching.output(tmp_path / "first"):
            assert proc.poll() is None and time.monotonic() < deadline, launching.output(
                tmp_path / "first"
            )[-3000:]
            time.sleep(0.05)
        if ctrl_c:
            text = launching.stop_with(proc, -proc.pid, tmp_path / "first", signal.SIGINT)
        else:
            text = launching.stop_with(proc, proc.pid, tmp_path / "first")
    finally:
        launching.stop(proc)
    assert proc.returncode == (130 if ctrl_c else 75), text[-3000:]
    stopped = launching.preempted(
        text,
        r"stopped with the predictions of (\d+) batches written \(\d+ by this run\) into \S+; "
        "run the same command again",
        "interrupted: SIGINT" if ctrl_c else "preempted: SIGTERM",
    )
    assert sorted(w for w, _ in stopped) == ["0", "1"], text[-3000:]
    written = {int(n) for _, n in stopped}
    assert len(written) == 1 and written.pop() < -(-len(inputs) // 4) // 2, text[-3000:]
    assert not (out / "predictions" / "worker-000-done.json").exists()
    status, again = launching.run(["--workers", "2"], flags, tmp_path / "second")
    assert status == 0, again[-3000:]
    got = orbitask.read_predictions(str(out))
    assert len(got["logits"]) == len(inputs)
    np.testing.assert_allclose(got["logits"], np.concatenate([expected[0::2], expected[1::2]]),
                               rtol=1e-5, atol=1e-6)  # fmt: skip


@pytest.mark.slow  # a training run and two predictions
def test_a_run_with_ema_predicts_with_the_averaged_weights(tmp_path):
    """As evaluation and export do: with `run_experiment.ema` set, predict puts the
    checkpoint's averages into the model; without it, the trained weights."""
    from orbitask.trainers.run.saved_model import restored_model

    ema = orbitask.ExponentialMovingAverage(decay=0.5)
    model_dir = tmp_path / "run"
    run_experiment(DigitsClassification(), str(model_dir), mode="train", train_steps=10, ema=ema,
                   global_batch_size=16, progress=False, strategy="one_device")  # fmt: skip
    path = tf.train.latest_checkpoint(str(model_dir))
    inputs = np.concatenate([x for x, _ in DigitsClassification().build_inputs(16, None, False)])
    expected = {}
    for averaged in (True, False):
        model, _ = restored_model(DigitsClassification(), path, averaged, None, 16)
        expected[averaged] = model(inputs, training=False).numpy()
    assert not np.allclose(expected[True], expected[False], atol=1e-3)
    for averaged in (True, False):
        out = tmp_path / f"averaged_{averaged}"
        run_experiment(DigitsClassification(), str(model_dir), mode="predict", output_dir=str(out),
                       ema=ema if averaged else None, **SETTINGS)  # fmt: skip
        got = orbitask.read_predictions(str(out))
        np.testing.assert_allclose(got, expected[averaged], rtol=1e-5, atol=1e-6)
