"""`orbitask new NAME`: the Task file and gin file it writes train at once through the binary."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orbitask.trainers.commands import cli, scaffold

REPO = Path(__file__).resolve().parents[1]


def _orbitask():
    script = Path(sys.executable).parent / "orbitask"
    if script.exists():
        return [str(script)]
    return (
        [shutil.which("orbitask")]
        if shutil.which("orbitask")
        else [sys.executable, "-m", "orbitask.trainers.commands.cli"]
    )


@pytest.mark.slow
def test_new_writes_a_task_and_an_experiment_that_train(tmp_path, capsys):
    project = tmp_path / "project"
    assert cli.main(["new", "flowers", f"--dir={project}"]) == 0
    out = capsys.readouterr().out
    assert f"--gin_file={project / 'flowers.gin'} --model_dir=runs/flowers" in out
    gin_text = (project / "flowers.gin").read_text()
    assert "import flowers" in gin_text and "TASK = @FlowersTask()" in gin_text
    assert "class FlowersTask(Task):" in (project / "flowers.py").read_text()

    # The console script, from another folder: the .gin file's folder makes `import flowers` work.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CONFIG", None)
    env.pop("PYTHONPATH", None)
    result = subprocess.run(
        [
            *_orbitask(),
            f"--gin_file={project / 'flowers.gin'}",
            "--gin_params=TRAIN_STEPS = 20",
            "--gin_params=orbitask.run_experiment.eval_interval = 20",
            "--model_dir=runs/flowers",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step 20/20" in result.stdout
    assert (tmp_path / "runs" / "flowers" / "ckpt-20.index").exists()
    assert list((tmp_path / "runs" / "flowers" / "eval").glob("events.out.tfevents.*"))


def test_class_names():
    assert scaffold.class_name("my_task") == "MyTask"
    assert scaffold.class_name("flowers") == "FlowersTask"
    assert scaffold.class_name("gan_v2") == "GanV2Task"


@pytest.mark.parametrize(
    "args, message",
    [
        ([], r"expected one NAME, e\.g\. `orbitask new my_task`; received 0"),
        (["My-Task"], r"NAME must be a lowercase Python module name .* received 'My-Task'"),
        (["class"], r"received 'class'"),
        (["json"], r"'json' is already an importable module"),
        (["tasks"], r"'tasks' is already an importable module"),
        (["taken"], r"taken\.py already exists; choose another NAME"),
        (["fresh", "--dir={blocker}"], r"cannot write into --dir '.*blocker'"),
        (["--dri=x", "fresh"], r"Unknown command line flag 'dri'"),
    ],
    ids=["no_name", "not_a_module_name", "keyword", "stdlib", "ours", "exists", "bad_dir", "typo"],
)
def test_mistakes_are_one_line(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken.py").write_text("")
    (tmp_path / "blocker").write_text("a file, not a folder")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert scaffold.main([a.format(blocker=tmp_path / "blocker") for a in args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("orbitask: error: "), err
    assert re.search(message, err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written
