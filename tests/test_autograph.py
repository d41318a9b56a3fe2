"""AutoGraph at start-up: the step's plumbing (gradient sums, clipping, Keras adapters, the
extra-loss terms, the loss's scaling) runs as written and is not converted, while a Task's own
stages still are, so their Python `if` on a tensor works."""

import pytest
import tensorflow as tf
from tensorflow.python.autograph.pyct import transpiler

from orbitask.trainers import run_experiment
from tests.helpers import TinyTask

PLUMBING = (
    "orbitask.tasks.gradients",
    "orbitask.common.keras_compat",
    "orbitask.tasks.extra_losses",
)


class BranchingTask(TinyTask):
    """An `input_pre` with a Python `if` on a tensor: it traces only when converted."""

    def input_pre(self, batch, lr):
        x = batch[0]
        if tf.reduce_sum(x) > 1e9:
            x = x * 0.0
        return x


@pytest.fixture
def conversions(monkeypatch):
    """The `module.qualname` of each function AutoGraph is asked to convert (cached or not)."""
    seen = []
    convert = transpiler.PyToPy.transform_function

    def recorded(self, fn, user_context):
        seen.append(f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}")
        return convert(self, fn, user_context)

    monkeypatch.setattr(transpiler.PyToPy, "transform_function", recorded)
    return seen


def test_the_steps_plumbing_is_not_converted_and_a_tasks_stage_is(tmp_path, conversions):
    run_experiment(
        BranchingTask(), str(tmp_path / "run"), mode="train", train_steps=2, global_batch_size=8,
        steps_per_loop=2, progress=False, strategy="mirrored",
    )  # fmt: skip
    assert any(name.endswith("BranchingTask.input_pre") for name in conversions), conversions
    assert any(name.startswith("orbitask.tasks.default_steps.") for name in conversions)
    plumbing = [n for n in conversions if n.startswith(PLUMBING) or n.endswith("._scaled_loss")]
    assert plumbing == []
