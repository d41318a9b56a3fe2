"""`orbitask sweep`: --param kinds, pruning, a SIGKILLed sweep resumed, processes sharing it."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import optuna
import pytest
import tensorflow as tf

from orbitask.trainers.commands import cli
from orbitask.trainers.commands.sweeps import params, study, sweeping
from orbitask.trainers.commands.sweeps import trial as trial_lib
from orbitask.trainers.errors import ConfigError
from orbitask.trainers.state import metrics_file
from tests import faults

GIN = [
    "TRAIN_STEPS=40",
    "orbitask.run_experiment.seed=7",
    "orbitask.run_experiment.steps_per_loop=10",
    "orbitask.run_experiment.loop_seconds=None",
    "orbitask.run_experiment.eval_interval=20",
    "orbitask.run_experiment.checkpoint_interval=20",
    "orbitask.run_experiment.progress=False",
    "orbitask.DigitsClassification.hidden_units=(16,)",
]
PARAMS = [
    "orbitask.run_experiment.learning_rate=loguniform(1e-3, 1e-1)",
    "orbitask.DigitsClassification.hidden_units=choice([(16,), (8, 8)])",
]


def _url(folder) -> str:
    return "sqlite:///" + os.path.join(str(folder), "study.db")


def _study(folder) -> optuna.Study:
    return optuna.load_study(study_name=os.path.basename(str(folder)), storage=_url(folder))


# --param


def test_each_kind_is_parsed():
    found = params.parse_all(
        [
            "orbitask.run_experiment.learning_rate=loguniform(1e-4, 1e-1)",
            "orbitask.DigitsClassification.l2 = uniform(0, 0.01)",
            "orbitask.run_experiment.global_batch_size=int(32, 256, step=32)",
            "orbitask.DigitsClassification.hidden_units=choice([(64,), (128, 64)])",
        ]
    )
    assert [(p.kind, p.args, p.options) for p in found] == [
        ("loguniform", (1e-4, 1e-1), {}),
        ("uniform", (0, 0.01), {}),
        ("int", (32, 256), {"step": 32}),
        ("choice", ("(64,)", "(128, 64)"), {}),
    ]
    trial = optuna.create_study().ask()
    assert trial_lib.bindings(trial, found[3:]) in (
        ["orbitask.DigitsClassification.hidden_units = (64,)"],
        ["orbitask.DigitsClassification.hidden_units = (128, 64)"],
    )


@pytest.mark.parametrize(
    "text, why",
    [
        ("lr=normal(0, 1)", "unknown kind 'normal'"),
        ("lr loguniform(1e-4, 1e-1)", "expected NAME=KIND(ARGS)"),
        ("lr=loguniform(0, 1)", "loguniform needs low > 0"),
        ("lr=uniform(1, 0.5)", "low must be less than high"),
        ("lr=uniform(1)", "uniform takes (low, high)"),
        ("units=int(1.5, 4)", "int's low and high must be integers"),
        ("units=choice([])", "choice needs distinct values"),
        ("units=choice(1, 2)", "choice takes one list of values"),
        ("units=choice([x])", "the arguments must be Python literals"),
        ("lr=uniform(0, 1", "expected KIND(ARGS)"),
    ],
)
def test_a_bad_param_is_one_line_naming_it(text, why):
    with pytest.raises(ConfigError) as error:
        params.parse_all(["a.b=uniform(0, 1)", text])
    message = str(error.value)
    assert message.startswith(f'--param "{text}": ') and why in message, message
    assert "\n" not in message


def test_a_name_swept_twice_and_no_param_are_refused():
    with pytest.raises(ConfigError, match=r'--param "a=int\(1, 2\)": a is swept by another'):
        params.parse_all(["a=uniform(0, 1)", "a=int(1, 2)"])
    with pytest.raises(ConfigError, match="needs at least one --param"):
        params.parse_all([])


def test_the_command_says_a_bad_param_in_one_line(tmp_path, capsys):
    argv = ["sweep", "--gin_file=experiments/digits.gin", f"--model_dir={tmp_path}"]
    assert cli.main([*argv, "--param=lr=gauss(1, 2)", "--objective=accuracy"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith('orbitask: error: --param "lr=gauss(1, 2)": unknown kind'), err
    assert "\n" not in err


# Pruning, in this process


class PruneAtOrAfter(optuna.pruners.BasePruner):
    """Prunes every trial once it reported step `step` (a plain Python stand-in pruner)."""

    def __init__(self, step):
        self.step = step

    def prune(self, study, trial):
        return trial.last_step is not None and trial.last_step >= self.step


def test_a_pruned_trial_is_marked_pruned_and_keeps_its_last_step(tmp_path, capsys):
    sweep = sweeping.Sweep(["experiments/digits.gin"], GIN, str(tmp_path), 1, PARAMS[:1])
    objective = trial_lib.Objective("accuracy", True)
    url = "sqlite:///" + os.path.join(str(tmp_path), "study.db")
    found = optuna.create_study(storage=url, direction="maximize", pruner=PruneAtOrAfter(20))
    trial, lock, resumed = study.next_trial(found, str(tmp_path), 1)
    try:
        sweep.run_trial(found, trial, resumed, objective)
    finally:
        lock.release()
    (frozen,) = found.get_trials()
    assert frozen.state == optuna.trial.TrialState.PRUNED
    assert list(frozen.intermediate_values) == [20]
    folder = str(tmp_path / "trial-0")
    assert tf.train.latest_checkpoint(folder) == os.path.join(folder, "ckpt-20")
    lr = frozen.params["orbitask.run_experiment.learning_rate"]
    with open(os.path.join(folder, "operative_config.gin")) as f:
        assert re.search(rf"learning_rate = {re.escape(repr(lr))}", f.read())
    assert "trial 0 pruned at step 20" in capsys.readouterr().out
    assert study.next_trial(found, str(tmp_path), 1) is None  # a pruned trial counts


# The command, in processes


def _command(folder, *extra) -> list[str]:
    argv = ["--gin_file=experiments/digits.gin", f"--model_dir={folder}", "--trials=4"]
    argv += [f"--gin_params={g}" for g in GIN] + [f"--param={p}" for p in PARAMS]
    argv += ["--objective=eval/accuracy", "--pruner=none", *extra]
    return [sys.executable, "-m", "orbitask.trainers.commands.cli", "sweep", *argv]


def _run(cmd, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd, cwd=faults.REPO, env=faults.env(), capture_output=True, text=True, timeout=timeout
    )


def _stop_in_trial(cmd, folder, number, sig=signal.SIGKILL, timeout=400) -> tuple[int, str]:
    """Starts the sweep, waits until trial `number` finished saving its step-20 checkpoint (the
    state file names it), sends `sig`; returns its exit status and output."""
    proc = subprocess.Popen(
        cmd, cwd=faults.REPO, env=faults.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    trial_dir = os.path.join(str(folder), f"trial-{number}")
    deadline = time.monotonic() + timeout
    try:
        while not (tf.train.latest_checkpoint(trial_dir) or "").endswith("ckpt-20"):
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "trial never reached step 20"
            time.sleep(0.05)
        os.killpg(proc.pid, sig)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, proc.stdout.read()


def _starts(trial_dir) -> list[dict]:
    """run.json's entry of each start of a trial's run."""
    return json.loads((trial_dir / "run.json").read_text())


@pytest.mark.slow
def test_a_sweep_killed_inside_a_trial_resumes_that_trial_and_counts_it_once(tmp_path):
    folder = tmp_path / "sweep"
    # SIGTERM inside trial 1: stopped as a preemption (saved, exit 75), the trial left running.
    status, first = _stop_in_trial(_command(folder), folder, 1, signal.SIGTERM)
    assert status == 75 and "orbitask: preempted" in first, first
    assert _study(folder).get_trials()[1].state == optuna.trial.TrialState.RUNNING
    # SIGKILL inside trial 2, after trial 1 was resumed and finished.
    _, before = _stop_in_trial(_command(folder), folder, 2)
    assert "trial 1 resumed in" in before and "trial 2 started" in before, before
    kept = _study(folder).get_trials()[2]
    assert kept.state == optuna.trial.TrialState.RUNNING
    again = _run(_command(folder))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "trial 2 resumed in" in again.stdout, again.stdout
    trials = _study(folder).get_trials()
    assert [t.number for t in trials] == [0, 1, 2, 3]
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert trials[2].params == kept.params
    for number in (1, 2):
        starts = _starts(folder / f"trial-{number}")
        assert [s["start_step"] >= 20 for s in starts] == [False, True], (number, starts)
        assert starts[-1]["ended"] == "finished"
    # Trial 2 went on from its checkpoint with the same values, each step evaluated once.
    starts = _starts(folder / "trial-2")
    lr = repr(kept.params["orbitask.run_experiment.learning_rate"])
    assert all(f"run_experiment.learning_rate = {lr}\n" in s["bindings"] for s in starts)
    rows = metrics_file.read(str(folder / "trial-2" / "metrics.jsonl"))
    assert [r["step"] for r in rows if r["split"] == "eval"] == [20, 40]
    assert trials[2].intermediate_values.keys() == {20, 40}
    assert re.search(r"^best trial  trial-\d: eval accuracy ", again.stdout, re.M), again.stdout


def test_openers_racing_on_a_new_study_all_open_the_same_one(tmp_path):
    # Six openers of one new SQLite study at the same instant race to make its tables; Optuna
    # fails the losers ("table studies already exists", or the schema version's UNIQUE
    # constraint), and each of them opens again.
    gate, opened, failed = threading.Barrier(6), [], []

    def open_one() -> None:
        gate.wait()
        try:
            found = study.open_study(str(tmp_path), None, "race", "maximize", "median")
            opened.append(found._study_id)  # noqa: SLF001
        except Exception as e:  # noqa: BLE001 - the test reports every failure
            failed.append(f"{type(e).__name__}: {str(e).splitlines()[0]}")

    openers = [threading.Thread(target=open_one) for _ in range(6)]
    for one in openers:
        one.start()
    for one in openers:
        one.join()
    assert failed == []
    assert len(opened) == 6 and len(set(opened)) == 1
    assert [s.study_name for s in optuna.get_all_study_summaries(_url(tmp_path))] == ["race"]


@pytest.mark.slow
def test_two_sweep_processes_share_one_study_without_duplicates(tmp_path):
    folder = tmp_path / "sweep"
    done = _run(_command(folder, "--processes=2"))
    assert done.returncode == 0, done.stdout + done.stderr
    started = re.findall(r"orbitask: trial (\d+) started in", done.stdout)
    assert sorted(started) == ["0", "1", "2", "3"], done.stdout
    assert "resumed" not in done.stdout
    trials = _study(folder).get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 4
    assert sorted(p.name for p in folder.glob("trial-*")) == [f"trial-{n}" for n in range(4)]
    # orbitask report on the sweep's folder: the best trial, then the table of all trials.
    report = _run([sys.executable, "-m", "orbitask.trainers.commands.cli", "report",
                   f"--model_dir={folder}"])  # fmt: skip
    assert report.returncode == 0, report.stderr
    assert re.search(r"^best trial  trial-\d: eval accuracy [0-9.]+ at step", report.stdout, re.M)
    assert all(f"trial-{n} " in report.stdout for n in range(4)), report.stdout
