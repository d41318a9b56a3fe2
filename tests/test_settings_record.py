"""Each training start keeps its settings, and a resume names what changed: the real binary's
`main`, in-process, on the digits experiment (a few steps each)."""

from pathlib import Path

import tensorflow as tf

from orbitask.trainers.commands import train
from orbitask.trainers.state import settings_record

DIGITS = str(Path(__file__).resolve().parents[1] / "experiments" / "digits.gin")


def _train(model_dir, steps, *params, mode="train"):
    flags = [f"--gin_file={DIGITS}", f"--model_dir={model_dir}", f"--mode={mode}"]
    flags += ["--gin_params=orbitask.run_experiment.progress = False"]
    flags += [f"--gin_params=TRAIN_STEPS = {steps}", *(f"--gin_params={p}" for p in params)]
    assert train.main(flags) == 0


def _said(capsys) -> list[str]:
    out = capsys.readouterr().out
    return [x for x in out.splitlines() if "changed settings" in x or "training state" in x]


def _starts(model_dir) -> list[str]:
    return sorted(p.name for p in Path(model_dir).glob("operative_config-*.gin"))


def test_a_resume_names_each_changed_binding_and_the_record_keeps_both_starts(tmp_path, capsys):
    _train(tmp_path, 4)
    assert _said(capsys) == [] and _starts(tmp_path) == ["operative_config-0.gin"]

    _train(tmp_path, 6)  # only TRAIN_STEPS changed
    said = "orbitask: resumed at step 4 with changed settings: TRAIN_STEPS 4 -> 6"
    assert _said(capsys) == [said]
    _train(tmp_path, 6)  # nothing changed: no line, no new file
    assert _said(capsys) == []
    assert _starts(tmp_path) == ["operative_config-0.gin", "operative_config-4.gin"]

    _train(tmp_path, 8, "orbitask.run_experiment.learning_rate = 0.05")
    lines = _said(capsys)
    assert lines == [
        "orbitask: resumed at step 6 with changed settings: "
        "TRAIN_STEPS 6 -> 8; run_experiment.learning_rate None -> 0.05",
        "orbitask: the learning rate is training state: the checkpoint's rate 0.001 goes on "
        "(a callback that assigns ctx.lr changes it)",
    ]
    # The record says which rate applied: the checkpoint's, not the new binding.
    record = (tmp_path / "operative_config-6.gin").read_text()
    assert record.startswith("# resumed at step 6 with changed settings: TRAIN_STEPS 6 -> 8;")
    assert "# the learning rate is training state: the checkpoint's rate 0.001 goes on" in record
    assert (tmp_path / "operative_config.gin").read_text() == record
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(tmp_path)))
    assert abs(float(reader.get_tensor("lr/.ATTRIBUTES/VARIABLE_VALUE")) - 1e-3) < 1e-9
    # Each start's file holds the settings it ran with.
    first = settings_record.bindings((tmp_path / "operative_config-0.gin").read_text())
    assert first["TRAIN_STEPS"] == "4" and first["run_experiment.learning_rate"] == "None"


def test_a_changed_macro_that_also_sets_a_step_count_is_named(tmp_path, capsys):
    schedule = [
        "orbitask.run_experiment.learning_rate = @orbitask.learning_rate_schedule()",
        "orbitask.learning_rate_schedule.kind = 'cosine'",
        "orbitask.learning_rate_schedule.decay_steps = %TRAIN_STEPS",
    ]
    _train(tmp_path, 4, *schedule)
    capsys.readouterr()
    _train(tmp_path, 6, *schedule)
    out = capsys.readouterr().out
    assert "orbitask: resumed at step 4 with changed settings: TRAIN_STEPS 4 -> 6\n" in out
    assert (
        "orbitask: TRAIN_STEPS also sets learning_rate_schedule.decay_steps: a length counted in "
        "steps changes in the middle of the run"
    ) in out
    assert "training state" not in out  # a schedule sets the rate: the new one applies


def test_evaluation_writes_no_settings_record(tmp_path):
    _train(tmp_path, 4)
    before = {p.name: p.read_bytes() for p in tmp_path.glob("operative_config*.gin")}
    _train(tmp_path, 4, "orbitask.run_experiment.eval_steps = 2", mode="eval")
    after = {p.name: p.read_bytes() for p in tmp_path.glob("operative_config*.gin")}
    assert after == before
