"""The checks before step 1 consume nothing: the first batch trained is the one the same
`build_inputs` pipeline yields first without orbitask, on one process and on two workers, for a
`shuffle(seed=...)` that reshuffles at each iteration (a second iteration gives another order).
"""

import gin
import numpy as np
import pytest
import tensorflow as tf

from orbitask.trainers import run_experiment
from tests import launching
from tests.helpers import LinearTask, checkpoint_weights

N = 32  # examples: x[i] is the i-th unit vector
SEED = 7


@gin.configurable("first_batch_test.Reshuffled")
class Reshuffled(LinearTask):
    """`y = x @ w`, w at 0, loss SUM(y), SGD: after one step at rate 1, w[i] is -1/global batch
    for each example i of the first global batch and 0 for the others."""

    def __init__(self, **kwargs):
        super().__init__(np.eye(N, dtype=np.float32), **kwargs)

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ds = tf.data.Dataset.from_tensor_slices((self.x, self.m))
        if input_context is not None and input_context.num_input_pipelines > 1:
            ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return ds.shuffle(N, seed=0).repeat().batch(per_replica_batch_size, drop_remainder=True)


def first_batches(per_replica, pipelines) -> tuple[set, set]:
    """Without orbitask, under the run's global seed: the examples of the first batch of each
    pipeline, and of the batch a second iteration of the same datasets starts with."""
    tf.random.set_seed(SEED)
    first, second = set(), set()
    for index in range(pipelines):
        context = tf.distribute.InputContext(pipelines, index, pipelines)
        dataset = Reshuffled().build_inputs(per_replica, context)
        for found in (first, second):
            x, _ = next(iter(dataset))
            found.update(np.argmax(x.numpy(), axis=1).tolist())
    return first, second


def trained(weights, global_batch) -> set:
    (kernel,) = weights
    moved = np.flatnonzero(kernel[:, 0])
    np.testing.assert_allclose(kernel[moved, 0], -1.0 / global_batch, rtol=1e-6)
    return set(moved.tolist())


def test_one_process_trains_first_on_the_pipelines_first_batch(tmp_path):
    run_experiment(
        Reshuffled(),
        str(tmp_path),
        mode="train",
        train_steps=1,
        global_batch_size=4,
        learning_rate=1.0,
        seed=SEED,
        strategy="one_device",
        progress=False,
    )
    first, second = first_batches(4, 1)
    assert first != second  # a consumed iteration would show
    assert trained(checkpoint_weights(Reshuffled(), tmp_path), 4) == first


@pytest.mark.slow
def test_two_workers_train_first_on_each_pipelines_first_batch(tmp_path):
    """Each worker checks, before step 1, that its input is sharded (`warn_if_unsharded`); the
    step still trains on each shard's first batch."""
    gin_file = tmp_path / "first_batch.gin"
    gin_file.write_text(
        "\n".join(
            [
                "include 'configs/defaults.gin'",
                "import tests.test_first_batch",
                "TASK = @first_batch_test.Reshuffled()",
                "TRAIN_STEPS = 1",
                "orbitask.run_experiment.global_batch_size = 8",
                "orbitask.run_experiment.learning_rate = 1.0",
                f"orbitask.run_experiment.seed = {SEED}",
                "orbitask.run_experiment.progress = False",
            ]
        )
    )
    model = tmp_path / "model"
    flags = [f"--gin_file={gin_file}", f"--model_dir={model}", "--mode=train"]
    status, text = launching.run(["--workers", "2"], flags, tmp_path)
    assert status == 0, text[-3000:]
    assert "[worker 0] orbitask: CollectiveAllReduceStrategy, 2 replicas" in text, text[-3000:]
    assert "same first batch" not in text
    first, second = first_batches(4, 2)
    assert first != second
    assert trained(checkpoint_weights(Reshuffled(), model), 8) == first
