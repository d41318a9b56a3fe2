"""Profiling steps N..M: a trace in TensorBoard's profile format holding those steps' device
loops and no others; a bad `profile_steps` is one line before any work."""

import glob
import os

import pytest

from orbitask import DigitsClassification, run_experiment
from orbitask.trainers import ConfigError


def _train_events(model_dir) -> list[int]:
    """The step numbers of the "train" step markers in the run's one trace."""
    try:
        from tsl.profiler.protobuf import xplane_pb2
    except ImportError:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2

    traces = glob.glob(os.path.join(model_dir, "train", "plugins", "profile", "*", "*.xplane.pb"))
    assert len(traces) == 1, traces
    space = xplane_pb2.XSpace()
    with open(traces[0], "rb") as f:
        space.ParseFromString(f.read())
    steps = []
    for plane in space.planes:
        names = {i: m.name for i, m in plane.event_metadata.items()}
        stats = {i: m.name for i, m in plane.stat_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                if names.get(event.metadata_id) == "train":
                    marks = {stats.get(s.metadata_id): s for s in event.stats}
                    steps.append(
                        int(marks["step_num"].int64_value or marks["step_num"].uint64_value)
                    )
    return sorted(steps)


def _run(model_dir, profile_steps, steps=12):
    return run_experiment(
        DigitsClassification(hidden_units=(16,)),
        str(model_dir),
        mode="train",
        train_steps=steps,
        steps_per_loop=3,
        loop_seconds=None,
        profile_steps=profile_steps,
        progress=False,
    )


def test_the_trace_holds_steps_n_to_m_only(tmp_path, capsys):
    _run(tmp_path, (5, 8))
    # Loops of 3 steps end after step 4 (the trace starts) and after step 8 (it stops): the
    # trace holds the loops starting at steps 4 and 7, i.e. steps 5-7 and 8.
    assert _train_events(tmp_path) == [4, 7]
    assert f"orbitask: profile of steps 5-8 in {tmp_path / 'train'}" in capsys.readouterr().out


def test_a_window_from_the_first_step_starts_before_the_first_loop(tmp_path):
    _run(tmp_path, (1, 3), steps=6)
    assert _train_events(tmp_path) == [0]


@pytest.mark.parametrize("bad", [(0, 3), (5, 4), 7, (1.0, 2)])
def test_a_bad_window_is_one_line_before_any_work(tmp_path, bad):
    with pytest.raises(ConfigError, match="`profile_steps` must be"):
        _run(tmp_path, bad)
    assert not os.path.exists(tmp_path / "train")
