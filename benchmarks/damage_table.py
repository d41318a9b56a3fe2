"""Damaged model directories: damage a digits run's directory, rerun the same command, tabulate.

    python benchmarks/damage_table.py [--cases NAME ...]

A run of the digits experiment (a `tf.data` shuffle input, so input positions are saved) trains
to step 60 with a checkpoint every 20 steps. For each case a copy of its directory is damaged and
the same command is run again to step 100 (or a second command beside it). The table says, per
case: the exit status, the run's one line about the damage, the step it resumed from, the work
lost (steps trained again), the files of good checkpoints lost or changed, and whether the final
weights are bit-identical to an uninterrupted run to step 100 (exact), a run refused on purpose
being "refused".
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import faults  # noqa: E402

BUFFERED = ("orbitask.DigitsClassification.shuffle_buffer=256",)
SAVED_AT = 60
FINAL = 100


@dataclass
class Case:
    """One kind of damage: `damage(model_dir)` changes the directory before the rerun;
    `extra` are gin params of the rerun; `concurrent` runs a second command beside it."""

    name: str
    damage: Callable[[Path], None]
    extra: tuple[str, ...] = ()
    concurrent: bool = False


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _truncate_data(model: Path, step: int) -> None:
    _truncate(next(model.glob(f"ckpt-{step}.data-*")))


def _state(model: Path, data: bytes) -> None:
    (model / "checkpoint").write_bytes(data)


def _every_data_truncated(model: Path) -> None:
    for data in model.glob("ckpt-*.data-*"):
        _truncate(data)


def _leftover(model: Path) -> None:
    half = model / "ckpt-80_temp"
    half.mkdir()
    (half / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"half")


MISSING = b'model_checkpoint_path: "ckpt-999"\n'
CASES = [
    Case("none (plain restart)", lambda m: None),
    Case("final checkpoint's .data truncated", lambda m: _truncate_data(m, SAVED_AT)),
    Case(
        "input position's .data truncated",
        lambda m: _truncate(next((m / "input" / f"ckpt-{SAVED_AT}").glob("worker-0-of-1.data-*"))),
    ),
    Case("state file: random bytes", lambda m: _state(m, os.urandom(64))),
    Case("state file: empty", lambda m: _state(m, b"")),
    Case("state file: garbled text", lambda m: _state(m, b"model_checkpoint_path: ckpt-20 {")),
    Case("state file: names a missing checkpoint", lambda m: _state(m, MISSING)),
    Case("state file: deleted", lambda m: (m / "checkpoint").unlink()),
    Case("every checkpoint truncated", _every_data_truncated),
    Case("a killed save's ckpt-80_temp/ left", _leftover),
    Case(
        "rerun with one more layer (shapes fit)",
        lambda m: None,
        extra=("orbitask.DigitsClassification.hidden_units=(32, 32)",),
    ),
    Case("a second run on the same directory", lambda m: None, concurrent=True),
]  # fmt: skip


def _command(model: Path, steps: int, extra=()) -> list[str]:
    return faults.command(model, steps=steps, extra=(*BUFFERED, *extra))


def _digests(model: Path) -> dict[str, str]:
    out = {}
    for path in sorted(model.glob("ckpt-*.*")):
        out[path.name] = hashlib.sha1(path.read_bytes()).hexdigest()
    return out


def _message(text: str) -> str:
    lines = [line for line in text.splitlines() if re.match(r"orbitask: (warning|error)", line)]
    lines = [line for line in lines if "stateful random" not in line]
    return (lines[0][len("orbitask: ") :] if lines else "-")[:110]


def _resumed(text: str) -> int | None:
    match = re.search(r"resumed from \S+ \(step (\d+)\)", text)
    return int(match.group(1)) if match else (0 if "step 1:" in text else None)


def run_case(case: Case, base: Path, reference: dict, workdir: Path) -> dict:
    model = workdir / re.sub(r"\W+", "_", case.name)
    shutil.copytree(base, model)
    before = _digests(model)
    case.damage(model)
    damaged = {name for name, digest in _digests(model).items() if before.get(name) != digest}
    cmd = _command(model, FINAL, case.extra)
    if case.concurrent:  # a long run holds the directory while the second one starts
        first = faults.start(
            _command(model, 50 * FINAL, ("orbitask.run_experiment.max_to_keep=1000",))
        )
        try:
            faults.wait_for_checkpoint(model, first, min_step=SAVED_AT + 20)
            result = faults.run(cmd)
        finally:
            first.kill()
            first.wait(timeout=60)
    else:
        result = faults.run(cmd)
    text = result.stdout + result.stderr
    after = _digests(model)
    lost = [n for n, d in before.items() if n not in damaged and after.get(n) not in (d, None)]
    lost += [n for n in before if n not in damaged and n not in after]
    resumed = _resumed(text)
    if result.returncode != 0:
        outcome = "refused"
    else:
        try:
            faults.assert_identical(reference, faults.final_state(model))
            outcome = "exact"
        except AssertionError:
            restarted = "training input restarts from its beginning" in text
            outcome = "input restarted" if restarted else "DIFFERENT"
    return {
        "case": case.name,
        "exit": result.returncode,
        "said": _message(text),
        "resumed": "-" if resumed is None else resumed,
        "work lost": "-" if resumed is None else f"{SAVED_AT - resumed} steps",
        "files lost": len(lost),
        "final": outcome,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", help="run only cases whose name contains these")
    args = parser.parse_args()
    cases = [c for c in CASES if not args.cases or any(k in c.name for k in args.cases)]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        assert faults.run(_command(tmp / "reference", FINAL)).returncode == 0
        reference = faults.final_state(tmp / "reference")
        base = tmp / "base"
        done = faults.run(_command(base, SAVED_AT))
        assert done.returncode == 0, done.stderr[-2000:]
        rows = [run_case(case, base, reference, tmp) for case in cases]
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    print(" | ".join(c.ljust(widths[c]) for c in columns))
    print("-+-".join("-" * widths[c] for c in columns))
    for row in rows:
        print(" | ".join(str(row[c]).ljust(widths[c]) for c in columns))


if __name__ == "__main__":
    main()
