"""A read-only model directory: the evaluation modes and `orbitask export` read it and write
elsewhere (`--output_dir`), or say in one line that they need to. The real binary, on a model
directory it cannot write: a read-only bind mount as root (permissions do not bind root), else
one without write permission."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from orbitask.trainers.commands import train
from tests import faults

REPO = Path(__file__).resolve().parents[1]
DIGITS = str(REPO / "experiments" / "digits.gin")


def _files(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The trained, then read-only, model directory `model/`, and `out/` for what is written."""
    base = tmp_path_factory.mktemp("read_only")
    trained, model = base / "trained", base / "model"
    flags = [f"--gin_file={DIGITS}", f"--model_dir={trained}", "--mode=train"]
    flags += [
        "--gin_params=TRAIN_STEPS = 20",
        "--gin_params=orbitask.run_experiment.progress=False",
    ]
    assert train.main(flags) == 0
    (base / "out").mkdir()
    if os.geteuid() == 0:
        model.mkdir()
        mounted = subprocess.run(["mount", "--bind", "-o", "ro", str(trained), str(model)])
        assert mounted.returncode == 0, "root without a read-only bind mount"
    else:
        trained.rename(model)
        for folder, _, _ in os.walk(model):
            os.chmod(folder, stat.S_IRUSR | stat.S_IXUSR)
    yield base
    if os.geteuid() == 0:
        subprocess.run(["umount", str(model)], check=True)
    else:
        for folder, _, _ in os.walk(model):
            os.chmod(folder, stat.S_IRWXU)


def _as_reader(command: list[str], home: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        command, env=faults.env(), cwd=REPO, capture_output=True, text=True, timeout=300
    )


def _binary(*args) -> list[str]:
    return [sys.executable, "-m", "orbitask.trainers.commands.cli", *args]


@pytest.mark.slow
def test_a_read_only_model_dir_is_evaluated_and_exported_elsewhere(shared):
    model, out = shared / "model", shared / "out"
    before = _files(model)
    flags = [f"--gin_file={DIGITS}", f"--model_dir={model}", "--mode=eval"]

    refused = _as_reader(_binary(*flags), out)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .startswith(f"orbitask: error: --model_dir '{model}' is not writable (")
    ), refused.stderr[-2000:]
    assert "(an evaluation writes eval/ there: pass --output_dir=DIR)" in refused.stderr

    evaluated = _as_reader(_binary(*flags, f"--output_dir={out / 'evaluation'}"), out)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "orbitask: eval at step 20: accuracy" in evaluated.stdout
    assert f"eval summaries in {out / 'evaluation'}" in evaluated.stdout
    assert list((out / "evaluation" / "eval").glob("events.out.tfevents.*"))

    export = ["export", f"--model_dir={model}"]
    refused = _as_reader(_binary(*export), out)
    assert refused.returncode == 2, refused.stderr[-3000:]
    line = refused.stderr.strip().splitlines()[-1]
    assert line.startswith(f"orbitask: error: cannot write the SavedModel under {model}/export ")
    assert line.endswith("(orbitask export --output_dir=DIR).")

    exported = _as_reader(_binary(*export, f"--output_dir={out / 'saved'}"), out)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert (out / "saved" / "20" / "saved_model.pb").is_file()
    assert [p.name for p in (out / "saved").iterdir()] == ["20"]
    assert _files(model) == before  # nothing in the model directory changed


@pytest.mark.slow  # its fixture trains the model (the other test's)
def test_predict_on_a_read_only_model_dir_needs_an_output_dir(shared, capsys):
    """In-process: `--mode=predict` says in one line to pass --output_dir, as eval and export
    do, then predicts into it."""
    model, out = shared / "model", shared / "out"
    before = _files(model)
    flags = [f"--gin_file={DIGITS}", f"--model_dir={model}", "--mode=predict"]
    flags.append("--gin_params=orbitask.run_experiment.progress=False")
    capsys.readouterr()
    assert train.main(flags) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"orbitask: error: --model_dir '{model}' is not writable ("), err
    assert "(predict writes predictions/ there: pass --output_dir=DIR)" in err
    assert train.main([*flags, f"--output_dir={out / 'predicted'}"]) == 0
    assert list((out / "predicted" / "predictions").iterdir())
    assert _files(model) == before
