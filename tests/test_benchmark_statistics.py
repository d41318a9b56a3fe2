"""The harness's statistics: processes of one contender pooled, bootstrap intervals, lead-ins;
its pacing: processes started interleaved, waiting ones frozen."""

import io
import json
import os
import subprocess
import sys
import time

import pytest

from benchmarks import table, worker
from benchmarks.harness import Group, Result, Worker, base_name, start_order

GROUP = Group("mlp", 1, ["reference", "reference#2", "orbitask"])


def _result(name, rates, rss=100.0):
    return Result(GROUP, name, rates=list(rates), peak_rss_mb=rss)


def test_processes_of_one_contender_are_pooled_round_by_round():
    results = [
        _result("reference", [100, 200, 300], rss=100),
        _result("reference#2", [110, 180, 330], rss=120),
        _result("orbitask", [1, 2, 3]),
    ]
    ref = table.pooled(results, "reference")
    assert ref.rates == pytest.approx([105, 190, 315])
    assert ref.peak_rss_mb == pytest.approx(110)
    assert table.pooled(results, "orbitask") is results[2]
    assert table.pooled(results, "keras3@N") is None


def test_the_interval_brackets_the_median_and_narrows_with_more_rounds():
    base = _result("reference", [100.0] * 40)
    noisy = [95, 99, 97, 101, 96, 98, 100, 94] * 5
    wide = table.ratio_interval(_result("orbitask", noisy[:8]), _result("reference", [100.0] * 8))
    narrow = table.ratio_interval(_result("orbitask", noisy), base)
    median = table.paired_ratio(_result("orbitask", noisy), base)
    assert narrow[0] <= median <= narrow[1]
    assert narrow[1] - narrow[0] < wide[1] - wide[0]
    assert table.ratio_interval(_result("x", [90.0] * 5), _result("y", [100.0] * 5)) == (
        pytest.approx(0.9),
        pytest.approx(0.9),
    )


def test_the_table_names_second_processes_and_reports_the_noise_floor():
    results = [
        _result("reference", [100, 100, 100]),
        _result("reference#2", [96, 96, 96]),
        _result("orbitask", [98, 98, 98]),
    ]
    text = table.markdown([results], 100)
    assert "| hand-written loop, 100 steps/call (reference), process 2 | 96.0 |" in text
    assert "| orbitask default | 98.0 | 98.0-98.0 | 1.000 (1.000-1.000) |" in text
    lines = table.targets([results])
    assert any("noise floor: each reference process / their mean: 1.020, 0.980" in x for x in lines)
    assert "- [met] mlp x1 orbitask / reference: 1.000 (95% interval 1.000-1.000" in lines[1]


def test_a_gate_with_a_lead_in_times_every_second_window(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("go\n" * 5))
    report = io.StringIO()
    gate = worker.Gate(report, steps=10, lead_in=1)
    for _ in range(5):
        gate()
    events = [json.loads(line) for line in report.getvalue().splitlines()]
    assert [e["event"] for e in events] == ["ready"] + ["window"] * 4
    assert [e["timed"] for e in events[1:]] == [False, True, False, True]
    assert len(gate.windows) == 2


def test_every_plan_names_known_contenders_and_keeps_a_reference():
    from benchmarks.run import PLANS

    for plan, (rounds, _, lead_in, groups) in PLANS.items():
        assert rounds >= 1 and lead_in >= 0, plan
        for group in groups:
            assert "reference" in group.contenders, (plan, group)
            assert len(set(group.contenders)) == len(group.contenders), (plan, group)
            for name in group.contenders:
                assert base_name(name) in worker.CONTENDERS, (plan, name)


def test_the_cpu_time_ratio_pairs_rounds_and_pools_processes():
    results = [
        Result(GROUP, "reference", rates=[100, 50], cpu_rates=[200, 100]),
        Result(GROUP, "reference#2", rates=[100, 50], cpu_rates=[100, 300]),
        Result(GROUP, "orbitask", rates=[50, 100], cpu_rates=[150, 100]),
    ]
    text = table.markdown([results], 100)
    # pooled reference: 150 and 200 steps per CPU-second; orbitask's rounds 1.0 and 0.5
    row = next(line for line in text.splitlines() if "| orbitask default |" in line)
    assert "| 0.750 (0.500-1.000) |" in row, row
    no_cpu = [_result("reference", [100, 100]), _result("orbitask", [90, 90])]
    row = next(x for x in table.markdown([no_cpu], 100).splitlines() if "orbitask default" in x)
    assert "| 0.900 (0.900-0.900) | - |" in row, row


def test_processes_start_interleaved_first_copies_first():
    names = ["reference", "reference#2", "reference#3", "orbitask", "orbitask#2", "keras3@N"]
    started = [names[i] for i in start_order(names)]
    assert started == [
        "reference",
        "orbitask",
        "keras3@N",
        "reference#2",
        "orbitask#2",
        "reference#3",
    ]


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _state(pid: int) -> str:
    """The process's state letter in /proc: R running, S sleeping, T stopped, ..."""
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]


def _until(condition, seconds: float = 20.0) -> bool:
    """Polls `condition` until it holds or `seconds` pass (a busy machine schedules late)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_frozen_worker_runs_nothing_until_thawed():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    worker_ = object.__new__(Worker)  # a Worker's signals, on a process that only spins
    worker_.process = busy
    try:
        assert _until(lambda: _cpu_seconds(busy.pid) > 0.05)  # it spins
        worker_.freeze()
        assert _until(lambda: _state(busy.pid) == "T")
        frozen = _cpu_seconds(busy.pid)
        time.sleep(0.4)
        assert _cpu_seconds(busy.pid) == frozen
        worker_.thaw()
        assert _until(lambda: _cpu_seconds(busy.pid) > frozen + 0.1)
    finally:
        busy.kill()
        busy.wait()
