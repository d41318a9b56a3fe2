"""Warm start copies model weights (all or a subset) and nothing else."""

import numpy as np
import pytest
import tensorflow as tf

from orbitask.trainers import ConfigError, WarmStart, run_experiment
from orbitask.trainers.features.warm_start import model_variables
from tests.helpers import TinyTask, checkpoint_weights


def _train(model_dir, steps, **kwargs):
    task = TinyTask(**{k: kwargs.pop(k) for k in list(kwargs) if k in ("flavour",)})
    run_experiment(
        task,
        str(model_dir),
        mode="train",
        train_steps=steps,
        global_batch_size=8,
        learning_rate=0.05,
        progress=False,
        checkpoint_interval=steps,
        **kwargs,
    )


def _tensors(model_dir):
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
    dtypes = reader.get_variable_to_dtype_map()
    return {n: reader.get_tensor(n) for n in dtypes if dtypes[n] != tf.variant}


@pytest.mark.parametrize("flavour", ["keras", "tf_keras"])
def test_warm_start_copies_weights_only(tmp_path, flavour, capsys):
    _train(tmp_path / "pre", 6, flavour=flavour)
    # One step of rate 1e-9 from the warm start: the weights are the pretrained ones.
    run_experiment(
        TinyTask(flavour=flavour),
        str(tmp_path / "new"),
        mode="train",
        train_steps=1,
        global_batch_size=8,
        learning_rate=1e-9,
        progress=False,
        warm_start=WarmStart(str(tmp_path / "pre")),
    )
    out = capsys.readouterr().out
    assert "restored 4 variable(s)" in out
    new = _tensors(tmp_path / "new")
    for a, b in zip(
        checkpoint_weights(TinyTask(flavour=flavour), tmp_path / "pre"),
        checkpoint_weights(TinyTask(flavour=flavour), tmp_path / "new"),
        strict=True,
    ):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)
    assert new["step/.ATTRIBUTES/VARIABLE_VALUE"] == 1  # its own step, not the pretrained 6
    iterations = [n for n in new if n.startswith("optimizer/") and "iteration" in n]
    assert iterations and all(new[n] == 1 for n in iterations)


def test_warm_start_subset_and_report(tmp_path, capsys):
    _train(tmp_path / "pre", 4)
    task = TinyTask()
    model = task.build_model()
    fresh = [np.array(v) for v in model.weights]
    second = model.layers[1].kernel.path.split("/")[-2] + "/"  # e.g. "dense_7/"
    report = WarmStart(str(tmp_path / "pre"), exclude=(second,)).apply(model)
    assert len(report["restored"]) == 2 and len(report["skipped"]) == 2
    assert not np.array_equal(np.array(model.weights[0]), fresh[0])  # first layer copied
    np.testing.assert_array_equal(np.array(model.weights[2]), fresh[2])  # second left alone


@pytest.mark.parametrize("by", ["layer_name", "object_path"])
def test_warm_start_include_restores_only_the_named_layer(tmp_path, by):
    """`include` by a Keras layer name, or by an object path from the checkpoint's root
    (e.g. "train_model/_layers/0/")."""
    _train(tmp_path / "pre", 4)
    pretrained = checkpoint_weights(TinyTask(), tmp_path / "pre")
    model = TinyTask().build_model()
    fresh = [np.array(v) for v in model.weights]
    if by == "layer_name":
        first = model.layers[0].kernel.path.split("/")[-2] + "/"  # e.g. "dense_6/"
    else:
        kernel = model.layers[0].kernel
        path = next(p for p, v in model_variables(model) if v is kernel)
        first = "/".join(("train_model", *path[:-1])) + "/"
    report = WarmStart(str(tmp_path / "pre"), include=(first,)).apply(model)
    assert len(report["restored"]) == 2 and len(report["skipped"]) == 2, report
    for got, want in zip(model.weights[:2], pretrained[:2], strict=True):
        np.testing.assert_array_equal(np.array(got), want)  # the included layer: pretrained
    for got, want in zip(model.weights[2:], fresh[2:], strict=True):
        np.testing.assert_array_equal(np.array(got), want)  # the rest: as built


def test_warm_start_reports_mismatch_and_refuses_nothing_matched(tmp_path):
    _train(tmp_path / "pre", 2)

    class Wider(TinyTask):
        def build_model(self):
            import keras

            return keras.Sequential(
                [keras.Input((6,)), keras.layers.Dense(5), keras.layers.Dense(3)]
            )

    report = WarmStart(str(tmp_path / "pre")).apply(Wider().build_model())
    assert any("checkpoint [6, 8] vs model [6, 5]" in m for m in report["mismatched"])
    with pytest.raises(ConfigError, match="restored nothing"):
        WarmStart(str(tmp_path / "pre"), root="model").apply(TinyTask().build_model())
    with pytest.raises(ConfigError, match="cannot be read"):
        WarmStart(str(tmp_path / "nowhere")).apply(TinyTask().build_model())


def test_a_resumed_run_keeps_its_own_weights(tmp_path, capsys):
    _train(tmp_path / "pre", 4)

    def warm_started(model_dir, steps):
        run_experiment(
            TinyTask(),
            str(model_dir),
            mode="train",
            train_steps=steps,
            global_batch_size=8,
            learning_rate=0.05,
            checkpoint_interval=2,
            progress=False,
            warm_start=WarmStart(str(tmp_path / "pre")),
        )

    warm_started(tmp_path / "full", 4)
    warm_started(tmp_path / "split", 2)
    assert "warm start from" in capsys.readouterr().out
    warm_started(tmp_path / "split", 4)  # resumes from its step-2 checkpoint
    for a, b in zip(
        checkpoint_weights(TinyTask(), tmp_path / "full"),
        checkpoint_weights(TinyTask(), tmp_path / "split"),
        strict=True,
    ):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)
    assert "warm start from" not in capsys.readouterr().out
