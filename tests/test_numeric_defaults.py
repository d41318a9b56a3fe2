"""The defaults that change a run's numbers are named in one line at start, each with the binding
or override that turns it off; a task that turns them off gets no line."""

import keras
import pytest

from orbitask import NanGuard
from orbitask.tasks.examples.digits_gan import DigitsGAN
from orbitask.trainers import run_experiment
from tests.helpers import TinyTask


class OwnOptimizer(TinyTask):
    def build_optimizer(self, learning_rate):
        return keras.optimizers.SGD(learning_rate)


def _said(task, tmp_path, capsys, **kwargs):
    capsys.readouterr()
    settings = dict(mode="train", train_steps=2, global_batch_size=8, progress=False)
    run_experiment(task, str(tmp_path), **{**settings, **kwargs})
    out = capsys.readouterr().out
    return [x for x in out.splitlines() if "defaults that change the numbers" in x]


def test_the_seeds_defaults_are_named_with_how_to_turn_them_off(tmp_path, capsys):
    (line,) = _said(TinyTask(), tmp_path, capsys)
    assert "global norm 10.0 (orbitask.Task.clip_norm = None turns it off)" in line
    assert "non-finite gradient entries set to 0" in line
    assert "orbitask.run_experiment.nan_guard = @orbitask.NanGuard()" in line
    assert "Nadam(epsilon=0.001), as the task builds none" in line


@pytest.mark.parametrize(
    "task, kwargs",
    [
        (OwnOptimizer(clip_norm=None), {"nan_guard": NanGuard()}),
        (DigitsGAN(), {}),  # its own step and optimizers: none of the defaults apply
    ],
    ids=["turned_off", "own_step"],
)
def test_no_line_when_no_such_default_is_in_effect(tmp_path, capsys, task, kwargs):
    assert _said(task, tmp_path, capsys, **kwargs) == []


def test_only_what_is_still_in_effect_is_named(tmp_path, capsys):
    (line,) = _said(OwnOptimizer(), tmp_path, capsys, nan_guard=NanGuard())
    assert "global norm 10.0" in line
    assert "non-finite" not in line and "Nadam" not in line


@pytest.mark.parametrize("seed", [None, 0])
def test_a_training_run_without_a_seed_says_what_a_resume_reproduces(tmp_path, capsys, seed):
    run_experiment(
        TinyTask(), str(tmp_path), mode="train", train_steps=2, global_batch_size=8,
        progress=False, seed=seed,
    )  # fmt: skip
    lines = [x for x in capsys.readouterr().out.splitlines() if "no seed" in x]
    if seed is None:
        assert lines == [
            "orbitask: no seed: a resumed run equals an uninterrupted one up to float rounding, "
            "as TensorFlow's ops may sum in another order; orbitask.run_experiment.seed = 0 "
            "makes it bit-identical (it turns on op determinism)"
        ]
    else:
        assert lines == []
