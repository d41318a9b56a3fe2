"""`fast_dev_run`: one training step and one evaluation step of the user's Task, in a temporary
folder; nothing is written to the model directory."""

import pytest

from orbitask.trainers import ConfigError, run_experiment
from tests.helpers import Recorder, TinyTask


class Counted(TinyTask):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.steps = Recorder()

    def every_steps(self):
        return {1: self.steps}


@pytest.mark.parametrize("mode", ["train_and_eval", "train"])
def test_one_train_step_and_one_evaluation_step_and_nothing_written(tmp_path, capsys, mode):
    """`--mode=train` too checks its evaluation: the step that `train_and_eval` would run."""
    task, model = Counted(), tmp_path / "run"
    logs = run_experiment(task, str(model), mode=mode, train_steps=500,
                          global_batch_size=8, fast_dev_run=True)  # fmt: skip
    assert [step for step, _ in task.steps.calls] == [1]
    assert set(logs["eval"]) >= {"loss", "accuracy"}
    assert not model.exists()
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1] == (
        f"orbitask: fast_dev_run: one training step and one evaluation step ran; nothing was "
        f"written to {model}"
    )


def test_a_wrong_value_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="Received: fast_dev_run='yes'"):
        run_experiment(TinyTask(), str(tmp_path), train_steps=5, fast_dev_run="yes")
