"""`<model_dir>/metrics.jsonl`: every scalar sent to TensorBoard, one line per loop, per point a
callback kept (print_loss) and per evaluation; a resumed run first drops the lines past its
checkpoint."""

import json

import pytest
import tensorflow as tf

from orbitask.trainers import run_experiment
from orbitask.trainers.state import metrics_file
from tests.helpers import DiesAt, Killed


def _run(task, model_dir, **kwargs):
    settings = dict(mode="train_and_eval", train_steps=12, global_batch_size=8, steps_per_loop=2,
                    loop_seconds=None, checkpoint_interval=4, checkpoint_seconds=None,
                    eval_interval=4, strategy="one_device", progress=False)  # fmt: skip
    settings.update(kwargs)
    return run_experiment(task, str(model_dir), **settings)


def _rows(model_dir) -> list[dict]:
    rows = metrics_file.read(str(model_dir / "metrics.jsonl"))
    for row in rows:
        row.pop("steps_per_second", None)  # the one figure of the clock
    return rows


def test_every_loop_and_evaluation_is_one_line(tmp_path):
    _run(DiesAt(), tmp_path)
    rows = _rows(tmp_path)
    train = [r["step"] for r in rows if r["split"] == "train"]
    assert train == [2, 4, 6, 8, 10, 12]
    assert [r["step"] for r in rows if r["split"] == "eval"] == [4, 8, 12]
    assert {"loss", "learning_rate", "accuracy"} <= set(rows[0])
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["steps_per_second"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("dies_at", [7, 11])
def test_a_killed_and_resumed_run_leaves_an_uninterrupted_runs_file(tmp_path, dies_at):
    """Killed after step 7 (checkpoint 4, whose record lacks the evaluation at 4) or 11
    (checkpoint 8): the resumed run's file is the uninterrupted one's, line for line."""
    _run(DiesAt(), tmp_path / "whole")
    with pytest.raises(Killed):
        _run(DiesAt(at=dies_at), tmp_path / "split")
    before = _rows(tmp_path / "split")
    assert max(r["step"] for r in before) > (4 if dies_at == 7 else 8)  # lines past the ckpt
    _run(DiesAt(), tmp_path / "split")
    assert _rows(tmp_path / "split") == _rows(tmp_path / "whole")


def test_rewind_drops_train_and_eval_lines_past_their_steps(tmp_path):
    metrics = metrics_file.MetricsFile(str(tmp_path))
    for step in (2, 4, 6):
        metrics.write(step, "train", {"loss": float(step)})
        metrics.write_eval(step, {"loss": 1.0, "clean": {"loss": 2.0}})
    with open(metrics.path, "a") as f:
        f.write('{"step": 8, "spl')  # a line cut short by the kill
    assert metrics.rewind(train_step=6, eval_step=4) == 3
    rows = metrics_file.read(metrics.path)
    assert [(r["step"], r["split"]) for r in rows] == [
        (2, "train"), (2, "eval"), (2, "eval/clean"),
        (4, "train"), (4, "eval"), (4, "eval/clean"),
        (6, "train"),
    ]  # fmt: skip


def test_the_file_holds_the_train_points_tensorboard_holds(tmp_path):
    """Loops of 25 steps: print_loss's points every 10 steps join each loop's last step, as in
    TensorBoard, with the same values."""
    _run(
        DiesAt(), tmp_path, mode="train", train_steps=50, steps_per_loop=25, checkpoint_interval=25
    )
    rows = [r for r in _rows(tmp_path) if r["split"] == "train"]
    assert [r["step"] for r in rows] == [10, 20, 25, 30, 40, 50]
    assert [r["step"] for r in rows if "learning_rate" in r] == [25, 50]  # the loops' own rows
    from tensorboard.backend.event_processing import plugin_event_accumulator

    reader = plugin_event_accumulator.EventAccumulator(str(tmp_path / "train"))
    reader.Reload()
    board = {e.step: float(tf.make_ndarray(e.tensor_proto)) for e in reader.Tensors("loss")}
    assert board == pytest.approx({r["step"]: r["loss"] for r in rows}, rel=1e-6)


def _tensorboard_steps(folder, tag: str) -> list[int]:
    """The steps TensorBoard's reader shows for `tag` (it drops the points a restart orphans)."""
    from tensorboard.backend.event_processing import plugin_event_accumulator

    reader = plugin_event_accumulator.EventAccumulator(str(folder))
    reader.Reload()
    return [event.step for event in reader.Tensors(tag)]


@pytest.mark.slow
def test_tensorboard_shows_a_resumed_run_as_an_uninterrupted_one(tmp_path):
    """Killed after step 7 with points written to step 6; the resume marks its restart at the
    checkpoint's step, and TensorBoard's reader shows each step once."""
    _run(DiesAt(), tmp_path / "whole")
    with pytest.raises(Killed):
        _run(DiesAt(at=7), tmp_path / "split")
    _run(DiesAt(), tmp_path / "split")
    for split, tag in (("train", "loss"), ("eval", "accuracy")):
        whole = _tensorboard_steps(tmp_path / "whole" / split, tag)
        assert _tensorboard_steps(tmp_path / "split" / split, tag) == whole, split
