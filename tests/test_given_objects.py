"""A run changes nothing it is given: the Task and the settings' objects (NaN guard, weight
averaging, validation control) stay as they were, so the same objects run again."""

from orbitask import ExponentialMovingAverage, NanGuard, ValidationControl, run_experiment
from tests.helpers import TinyTask


def _state(*objects) -> list[dict]:
    return [dict(vars(o)) for o in objects]


def test_a_run_leaves_the_task_and_the_setting_objects_as_given(tmp_path):
    task = TinyTask()
    guard, averaging, control = NanGuard(), ExponentialMovingAverage(), ValidationControl()
    given = _state(task, guard, averaging, control)
    for name in ("first", "second"):  # the same objects, twice
        logs = run_experiment(
            task, str(tmp_path / name), mode="train_and_eval", train_steps=4,
            global_batch_size=8, eval_interval=2, nan_guard=guard, ema=averaging,
            validation_control=control, strategy="one_device", progress=False,
        )  # fmt: skip
        assert logs["eval"]["loss"] > 0
        assert task.keras_flavour is None
        assert _state(task, guard, averaging, control) == given
