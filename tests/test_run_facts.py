"""Run facts: each model's parameter count, `model_summary.txt`, `run.json` (an entry per start)
and the closing line of examples/s and peak memory."""

import json
import re

import pytest
import tensorflow as tf

from orbitask.trainers import run_experiment
from tests.helpers import DiesAt, Killed


def _run(task, model_dir, steps):
    return run_experiment(task, str(model_dir), mode="train", train_steps=steps,
                          global_batch_size=8, steps_per_loop=2, loop_seconds=None,
                          checkpoint_interval=2, strategy="one_device", progress=False)  # fmt: skip


def test_a_run_says_its_size_and_speed_and_keeps_an_entry_per_start(tmp_path, capsys):
    with pytest.raises(Killed):
        _run(DiesAt(at=3), tmp_path, 6)
    _run(DiesAt(), tmp_path, 6)
    out = capsys.readouterr().out
    # TinyTask: Dense(6 -> 8) and Dense(8 -> 3): 56 + 27 weights, all trainable.
    assert out.count("orbitask: model Sequential: 83 parameters (83 trainable, 0 not)") == 2
    speed = re.findall(r"^orbitask: ([0-9,]+) examples/s \(global, 4 steps in [0-9.]+ s\); peak "
                       r"host memory [0-9,]+ MiB$", out, re.M)  # fmt: skip
    assert len(speed) == 1 and int(speed[0].replace(",", "")) > 0, out
    summary = (tmp_path / "model_summary.txt").read_text()
    assert summary.startswith("# model\n") and "Total params: 83" in summary
    first, second = json.loads((tmp_path / "run.json").read_text())
    assert (first["start_step"], first["end_step"], first["ended"]) == (0, 3, "Killed")
    assert (second["start_step"], second["end_step"], second["ended"]) == (2, 6, "finished")
    assert second["versions"]["tensorflow"] == tf.__version__
    assert second["replicas"] == 1 and second["global_batch_size"] == 8
    assert second["examples_per_second"] > 0 and second["peak_host_mib"] > 0
    assert "# Parameters for run_experiment:" in second["bindings"]
