"""The throughput harness runs end to end (tiniest plan); checks it led to: XLA, stateful input."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orbitask.trainers import ConfigError, run_experiment
from tests.helpers import TinyTask

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_tiny_benchmark_prints_the_table(tmp_path):
    report = tmp_path / "report.md"
    proc = subprocess.run(
        [sys.executable, "benchmarks/run.py", "--tiny", f"--out={report}", f"--logs={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    text = report.read_text()
    assert text in proc.stdout
    assert "| workload | replicas | contender | steps/s median | min-max |" in text
    for contender in ("(reference) |", "orbitask's bounded prefetch |", "| orbitask default |"):
        assert contender in text, text
    assert "orbitask / reference:" in text
    assert "Command: `.venv/bin/python benchmarks/run.py --tiny" in text


def _benchmark_lines(script: str, *args: str) -> list[str]:
    """Runs `benchmarks/<script>` with `args`; returns its stdout's lines."""
    proc = subprocess.run(
        [sys.executable, f"benchmarks/{script}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout.splitlines()


def _assert_variants(lines: list[str], names: list[str]) -> None:
    """Each of `lines` is a timed variant's line, starting with its name, in `names`' order."""
    for name, line in zip(names, lines, strict=True):
        assert line.startswith(name) and "steps/s" in line, line


def _one_process_table(script: str, names: list[str]) -> str:
    """Runs a one-process benchmark for 3 rounds of 10 steps; checks its header and a line per
    variant in `names`' order, the reference first at 1.000. Returns the line after them."""
    lines = _benchmark_lines(script, "--rounds=3", "--steps_per_call=10")
    assert lines[0].startswith("mlp: 3 rounds of 10 steps per variant, one shared iterator")
    _assert_variants(lines[2 : 2 + len(names)], names)
    assert lines[2].split()[-4] == "1.000"  # the reference against itself
    return lines[2 + len(names)]


@pytest.mark.slow
def test_overhead_benchmark_times_every_variant_on_one_iterator():
    names = [
        "hand-written loop (reference)",
        "orbitask loop function",
        "  the same without the history record",
        "+ TaskTrainer.train (host work)",
        "+ Controller (callbacks, progress, ...)",
        "Controller, callbacks + progress off",
    ]
    after = _one_process_table("overhead.py", names)
    assert after.startswith("cost of the default callbacks + progress: ")


def _loss(tmp_path, name, **kwargs):
    logs = run_experiment(
        TinyTask(),
        str(tmp_path / name),
        mode="train",
        train_steps=4,
        global_batch_size=8,
        progress=False,
        seed=1,
        **kwargs,
    )
    return logs["train"]["loss"]


@pytest.mark.slow
def test_jit_compile_trains_like_the_default_step(tmp_path):
    plain = _loss(tmp_path, "plain", strategy="one_device")
    assert _loss(tmp_path, "xla", strategy="one_device", jit_compile=True) == pytest.approx(
        plain, rel=1e-4
    )


XLA_PROBE = """
import os, sys
from orbitask.trainers import run_experiment
from tests.helpers import TinyTask

dump, runs = sys.argv[1:]
for name, jit in (("plain", False), ("xla", True)):
    run_experiment(TinyTask(), os.path.join(runs, name), mode="train", train_steps=2,
                   global_batch_size=8, progress=False, jit_compile=jit)
    modules = os.listdir(dump) if os.path.isdir(dump) else []
    print(name, sorted(m for m in modules if m.endswith(".before_optimizations.txt")))
"""


@pytest.mark.slow
def test_jit_compile_hands_the_train_step_to_xla(tmp_path):
    """XLA dumps every module it compiles (XLA_FLAGS, read when TensorFlow starts)."""
    dump = tmp_path / "xla_dump"
    env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={dump}", TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(
        [sys.executable, "-c", XLA_PROBE, str(dump), str(tmp_path / "runs")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [x for x in proc.stdout.splitlines() if x.startswith(("plain ", "xla "))]
    assert lines[0] == "plain []", lines  # the default step: no XLA
    assert lines[1] != "xla []", lines
    # The compiled module is the step's: the model's matrix products are in it.
    assert any(" dot(" in p.read_text() for p in dump.glob("*.before_optimizations.txt"))


def test_jit_compile_on_logical_cpu_replicas_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"`jit_compile=True` cannot run 2 replicas"):
        _loss(tmp_path, "xla2", strategy="mirrored", jit_compile=True)


@pytest.mark.slow
def test_loop_length_benchmark_times_short_and_long_loops_on_one_iterator():
    lines = _benchmark_lines("loop_length.py", "--rounds=2", "--long=200")
    assert lines[0] == "mlp: 2 rounds of 200 steps per variant, one iterator"
    names = [
        "hand-written loop, 100 steps/call",
        "hand-written loop, 200 steps/call",
        "orbitask, 100-step loops",
        "orbitask, one 200-step loop",
    ]
    _assert_variants(lines[2:6], names)
    assert lines[2].split()[-2] == "1.000"  # the first against itself
    assert lines[6].startswith("orbitask, 100-step loops / hand-written loop, 100 steps/call: ")
    assert lines[7].startswith("orbitask, one 200-step loop / hand-written loop, 200 steps/call")


@pytest.mark.slow
def test_eval_cost_benchmark_prints_orbitask_against_keras_evaluate():
    lines = _benchmark_lines("eval_cost.py", "--quick", "--workloads", "mlp")
    assert lines[0].startswith("| workload | orbitask ms/step | Keras spe=1 | Keras spe=50 |")
    assert lines[0].endswith("| orbitask, own aggregate_logs |")
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    # Figures only: a quick run's per-step difference (50 steps) is within this machine's noise
    # and may come out at or below zero; the full run is what RESULTS.md reports.
    assert cells[0] == "mlp" and all(math.isfinite(float(c)) for c in cells[1:4])
    ratio, vs, best = cells[4].split()
    assert math.isfinite(float(ratio)) and vs == "(vs" and best in ("keras1)", "keras50)")
    assert math.isfinite(float(cells[5]))


@pytest.mark.slow
def test_first_step_benchmark_prints_model_garden_against_orbitask():
    lines = _benchmark_lines("first_step.py", "--rounds=1", "--model_id=10", "--size=32")
    assert lines[-6] == "ResNet-10, 32x32, batch 8, 1 rounds"
    for row, name in zip(lines[-3:-1], ["model_garden", "orbitask"], strict=True):
        cells = row.strip("|").split("|")
        assert cells[0].strip() == name and float(cells[1]) > 0 and int(cells[3]) > 0, row
    assert lines[-1].startswith("orbitask / model_garden: ")


@pytest.mark.slow
def test_step_parts_benchmark_times_each_part_on_one_iterator():
    names = [
        "hand-written loop (reference)",
        "its step on orbitask's model and optimizer",
        "the Task's train_step under strategy.run",
        "+ TrainStep (batches, replica mean, step)",
        "+ the device-loop function",
        "the device-loop function, its own iterator",
        "hand-written loop, orbitask's prefetch bound",
    ]
    after = _one_process_table("step_parts.py", names)
    assert after.startswith("reference: ") and after.endswith(" us/step")


@pytest.mark.slow
def test_input_positions_benchmark_prints_bytes_for_each_input_style():
    lines = _benchmark_lines("input_positions.py", "--quick")
    assert lines[0].startswith("300 JPEG records of ")
    rows = [line for line in lines if line.startswith("| tf.data shuffle(")]
    assert [row.split("|")[1].strip() for row in rows] == [
        "tf.data shuffle(100)",
        "tf.data shuffle(200)",
    ]
    indexed = next(line for line in lines if line.startswith("| IndexedInput |"))
    assert int(indexed.split("|")[2].split()[0]) < 1024  # a few hundred bytes at most
    assert lines[-1].startswith("input CPU for 20 steps of 2 replicas: one process ")


@pytest.mark.slow
def test_checkpoint_stall_benchmark_prints_sync_and_async_stalls():
    lines = _benchmark_lines("checkpoint_stall.py", "--quick")
    assert any(line.startswith("checkpoint of ") for line in lines)
    header = "| saves | stall per save, ms: median | max | final wait, ms | run wall, s |"
    assert header in lines
    rows = [line.split("|")[1:-1] for line in lines if line.startswith(("| sync |", "| async |"))]
    assert [row[0].strip() for row in rows] == ["sync", "async"]
    for row in rows:
        assert all(float(cell) >= 0 for cell in row[1:])
    assert lines[-1] == "Command: `.venv/bin/python benchmarks/checkpoint_stall.py --quick`"


@pytest.mark.slow  # two worker processes
def test_worker_agreement_benchmark_times_each_agreement_on_two_workers():
    lines = _benchmark_lines("worker_agreement.py", "--calls", "3")
    assert lines[0] == "2 workers on 127.0.0.1, 3 calls each, worker 0's times:"
    rows = [line.split("|")[1:-1] for line in lines if line.startswith("| ") and "(`" in line]
    names = ["agreement", "signal_agreement", "every_worker", "smallest"]
    assert [row[0].split("`")[1] for row in rows] == names
    assert all(float(row[1]) > 0 for row in rows)
    assert lines[-1] == "Command: `.venv/bin/python benchmarks/worker_agreement.py --calls 3`"


@pytest.mark.slow
def test_damage_table_benchmark_prints_a_row_per_case():
    lines = _benchmark_lines("damage_table.py", "--cases", "garbled")
    assert lines[0].startswith("case ") and "| work lost |" in lines[0]
    (row,) = [line for line in lines if line.startswith("state file: garbled text")]
    cells = [cell.strip() for cell in row.split("|")]
    assert cells[1] == "0" and "does not parse" in cells[2]
    assert cells[3:] == ["60", "0 steps", "0", "exact"]


@pytest.mark.slow  # six short trainings
def test_the_gpu_script_runs_dry_on_the_cpu():
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(["bash", "benchmarks/gpu.sh", "--dry_run"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert any(line.startswith("Device: CPU: ") for line in lines), proc.stdout[-2000:]
    rows = [line.split(" | ") for line in lines if line.startswith("| mlp | 1 |")]
    configs = [(r[2], r[3]) for r in rows]
    assert configs == [(p, x) for p in ("float32", "mixed_float16", "mixed_bfloat16")
                       for x in ("off", "on")]  # fmt: skip
    assert all(float(r[4].replace(",", "")) > 0 for r in rows)


@pytest.mark.slow
def test_input_checks_benchmark_names_the_draw_without_the_serialized_graph_cost():
    lines = _benchmark_lines("input_checks.py", "--sizes_mib=4,16")
    rows = [
        line.split("|")[1:-1]
        for line in lines
        if line.startswith("| 4 |") or line.startswith("| 16 |")
    ]
    assert len(rows) == 2, lines
    for size, _, check_peak, names, _, whole_peak, holds in rows:
        assert names.strip() == "RandomUniform in jitter" and holds.strip() == "RandomUniform"
        assert float(check_peak) < int(size) <= float(whole_peak)  # the graph copies the data


@pytest.mark.slow
def test_prefetch_depth_benchmark_times_each_depth_against_autotune():
    lines = _benchmark_lines(
        "prefetch_depth.py", "--rounds=3", "--steps_per_call=10", "--depths=2,8", "--reverse"
    )
    assert lines[0] == "mlp: 3 rounds of 10 steps per depth, the hand-written loop"
    _assert_variants(lines[1:4], ["prefetch(AUTOTUNE) (reference)", "prefetch(8)", "prefetch(2)"])
    assert lines[1].split()[-4] == "1.000"
