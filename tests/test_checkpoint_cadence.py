"""When checkpoints are written: at step multiples, after enough seconds, at the end."""

import pytest
import tensorflow as tf

from orbitask.trainers import run_experiment
from orbitask.trainers.errors import ConfigError
from tests.helpers import TinyTask


def _saved_steps(model_dir) -> list[int]:
    state = tf.train.get_checkpoint_state(str(model_dir))
    return [int(p.rsplit("-", 1)[1]) for p in state.all_model_checkpoint_paths]


def _train(model_dir, **kwargs):
    settings = dict(mode="train", train_steps=6, global_batch_size=8, steps_per_loop=2)
    settings.update(progress=False, **kwargs)
    run_experiment(TinyTask(), str(model_dir), **settings)
    return _saved_steps(model_dir)


def test_default_saves_only_at_the_end_of_a_short_run(tmp_path):
    assert _train(tmp_path) == [6]  # the time rule (600 s) is not reached


def test_time_rule_saves_after_every_loop_that_ends_late_enough(tmp_path):
    assert _train(tmp_path, checkpoint_seconds=1e-6) == [2, 4, 6]


def test_step_rule_saves_at_multiples_without_the_time_rule(tmp_path):
    assert _train(tmp_path, checkpoint_interval=3, checkpoint_seconds=None) == [3, 6]


class KeepsTwo(TinyTask):
    """A Task whose own `build_checkpoint` manager keeps 2 checkpoints."""

    def build_checkpoint(self, directory, **trackables):
        checkpoint, manager = super().build_checkpoint(directory, **trackables)
        return checkpoint, tf.train.CheckpointManager(checkpoint, directory, max_to_keep=2)


@pytest.mark.slow
@pytest.mark.parametrize(
    "task, setting", [(TinyTask(), 2), (KeepsTwo(), None)], ids=["setting", "task_manager"]
)
def test_max_to_keep_keeps_that_many_newest_checkpoints(tmp_path, task, setting):
    """Six saves with `run_experiment.max_to_keep = 2`, or with a Task's own manager keeping 2
    and the setting unset: the state file and the directory hold ckpt-5 and ckpt-6 only, also
    after a resumed run saves more."""
    settings = dict(mode="train", global_batch_size=8, steps_per_loop=1, progress=False)
    settings.update(checkpoint_interval=1, checkpoint_seconds=None, max_to_keep=setting)
    for steps in (6, 9):
        run_experiment(task, str(tmp_path), train_steps=steps, **settings)
        kept = [steps - 1, steps]
        assert _saved_steps(tmp_path) == kept
        indexes = sorted(p.name for p in tmp_path.glob("ckpt-*.index"))
        assert indexes == sorted(f"ckpt-{s}.index" for s in kept)


@pytest.mark.parametrize("bad", [0, -5, "60", True])
def test_bad_checkpoint_seconds_is_one_line(tmp_path, bad):
    with pytest.raises(ConfigError, match=r"or None\. Received: checkpoint_seconds="):
        _train(tmp_path, checkpoint_seconds=bad)
