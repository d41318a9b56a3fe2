"""Device loops of quick steps grow (`loop_seconds`); the steps trained stay the same."""

from __future__ import annotations

import numpy as np
import pytest

from orbitask.trainers import ConfigError, run_experiment
from orbitask.trainers.engine.loop_length import LoopLength
from orbitask.trainers.run.controller import Controller
from tests.helpers import TinyTask, checkpoint_weights


def test_quick_loops_double_until_one_lasts_half_loop_seconds():
    lengths = LoopLength(100, loop_seconds=1.0)
    lengths.observe(100, 5.0)  # the first loop traces: it only counts
    assert lengths.steps == 100
    seen = []
    for _ in range(6):  # 0.1 s per 100 steps: 100 -> 800 steps (0.8 s), then stop
        lengths.observe(lengths.steps, lengths.steps * 1e-3)
        seen.append(lengths.steps)
    assert seen == [200, 400, 800, 800, 800, 800]
    assert not lengths.growing


def test_a_loop_cut_short_by_a_callback_counts_as_its_whole_length():
    lengths = LoopLength(100, loop_seconds=1.0)
    lengths.observe(100, 1.0)
    lengths.observe(25, 0.15)  # 25 of 100 steps in 0.15 s: a full loop would last 0.6 s
    assert (lengths.steps, lengths.growing) == (100, False)


def test_loops_stop_at_100_times_steps_per_loop_and_never_grow_without_loop_seconds():
    lengths = LoopLength(3, loop_seconds=1e6)
    for _ in range(20):
        lengths.observe(lengths.steps, 0.0)
    assert lengths.steps == 192  # 3 x 2^6; 384 would pass 300
    fixed = LoopLength(3, loop_seconds=None)
    for _ in range(5):
        fixed.observe(3, 0.0)
    assert fixed.steps == 3


def test_every_worker_must_agree_to_grow():
    votes = []

    def agree(grow):
        votes.append(grow)
        return False  # another worker's loop was slow

    lengths = LoopLength(10, loop_seconds=1.0, agree=agree)
    lengths.observe(10, 0.0)
    lengths.observe(10, 0.0)
    assert votes == [True] and lengths.steps == 10 and not lengths.growing


class LoopCounting(Controller):
    loops: list = []

    def _train_n_steps(self, num_steps, start=None):
        LoopCounting.loops.append(num_steps)
        return super()._train_n_steps(num_steps, start)


def _run(tmp_path, name, loop_seconds, monkeypatch):
    monkeypatch.setattr("orbitask.trainers.run.runner.Controller", LoopCounting)
    LoopCounting.loops = []
    run_experiment(
        TinyTask(),
        str(tmp_path / name),
        mode="train",
        train_steps=120,
        steps_per_loop=5,
        loop_seconds=loop_seconds,
        seed=7,
        progress=False,
    )
    return list(LoopCounting.loops)


def test_grown_loops_train_the_same_weights_as_fixed_ones(tmp_path, monkeypatch):
    fixed = _run(tmp_path, "fixed", None, monkeypatch)
    fixed_weights = checkpoint_weights(TinyTask(), tmp_path / "fixed")
    grown = _run(tmp_path, "grown", 1e6, monkeypatch)  # every loop counts as quick

    assert fixed == [5] * 24
    # print_loss (every 10 steps) is deferred and cuts no loop: 5, 5, 10, 20, 40, 40.
    assert grown == [5, 5, 10, 20, 40, 40]
    for a, b in zip(fixed_weights, checkpoint_weights(TinyTask(), tmp_path / "grown"), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_bad_loop_seconds_names_its_binding(tmp_path):
    with pytest.raises(ConfigError, match=r"number or None\. Received: loop_seconds=0 "):
        run_experiment(TinyTask(), str(tmp_path), train_steps=10, loop_seconds=0)


class _CountedTraces(TinyTask):
    """Counts the traces of its step: `update_pre` runs once per trace of the train step."""

    traces = 0

    def update_pre(self, gradients, loss, outputs, batch, model, loss_fn, lr, optimizer):
        type(self).traces += 1
        return super().update_pre(gradients, loss, outputs, batch, model, loss_fn, lr, optimizer)


@pytest.mark.parametrize("flavour, traces", [("keras", 1), ("tf_keras", 2)])
def test_the_device_loop_calls_the_step_it_traced_for_its_logs(tmp_path, flavour, traces):
    """The loop function traces the step to learn its logs and calls that trace in its
    `tf.while_loop`: the step is traced once whatever the loops, plus, for a tf_keras
    optimizer, whose first step creates its slots, the retrace TensorFlow makes of a function
    whose first trace created variables (a Keras 3 optimizer is built before)."""
    _CountedTraces.traces = 0
    run_experiment(
        _CountedTraces(flavour=flavour), str(tmp_path), mode="train", train_steps=9,
        steps_per_loop=3, loop_seconds=None, global_batch_size=8, progress=False,
    )  # fmt: skip
    assert _CountedTraces.traces == traces
