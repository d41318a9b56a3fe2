"""A `shuffle(seed=...).batch(B).repeat()` input saved near an epoch boundary resumes exactly.

The last batch of each epoch is short, so `batch` meets the end of its shuffle iterator before
`repeat` starts the next epoch; a position saved there holds no seed-generator position unless
orbitask keeps it (`shuffle_seeds.ShuffleSeeds`). At each cut point the training input of
`inputs.train_input` (orbitask's prefetch on top, or none) is saved, restored into a freshly built
input, and read into the epoch after next: every batch equals the user's pipeline's own.
"""

import numpy as np
import pytest
import tensorflow as tf

from orbitask import Task
from orbitask.trainers.engine import inputs
from orbitask.trainers.state import shuffle_seeds

N = 45  # examples per epoch: 11 batches of 4 and one of 1
BATCH = 4
EPOCH = 12  # batches per epoch
CUTS = [*range(EPOCH - 4, EPOCH + 2), *range(2 * EPOCH - 4, 2 * EPOCH + 2)]
REPEATS = 3
AFTER = EPOCH + 4  # batches compared after a cut: into the epoch after next


class ShuffledIds(Task):
    """Example ids, shuffled with a seed and reshuffled each epoch; `prefetch`: ends with
    `prefetch(AUTOTUNE)` (orbitask bounds it), else tf.data injects none."""

    def __init__(self, prefetch: bool):
        super().__init__()
        self.prefetch = prefetch

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        ds = tf.data.Dataset.from_tensor_slices(np.arange(N, dtype=np.int64))
        ds = ds.shuffle(32, seed=0).batch(per_replica_batch_size).repeat()
        if self.prefetch:
            return ds.prefetch(tf.data.AUTOTUNE)
        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False
        return ds.with_options(options)

    def build_model(self):
        raise NotImplementedError

    def build_losses(self):
        raise NotImplementedError

    def build_optimizer(self, learning_rate):
        raise NotImplementedError


def _train_input(task, model_dir, step):
    strategy = tf.distribute.get_strategy()
    return inputs.train_input(task, strategy, BATCH, 1, step, str(model_dir))


def _resumes(task, tmp_path) -> list[tuple[int, int]]:
    """(repetition, cut) of each cut point whose resumed batches differ from the user's own.

    Each repetition trains one input through all the cut points, saving at each."""
    plain = iter(task.build_inputs(BATCH, training=True))
    expected = [next(plain).numpy() for _ in range(CUTS[-1] + AFTER)]
    wrong = []
    for repetition in range(REPEATS):
        model_dir = tmp_path / f"{task.prefetch}-{repetition}"
        step = tf.Variable(0, dtype=tf.int64)
        saved = _train_input(task, model_dir, step)
        assert shuffle_seeds.ShuffleSeeds.of(saved.iterator) is not None
        taken = 0
        for cut in CUTS:
            while taken < cut:
                assert np.array_equal(next(saved.iterator).numpy(), expected[taken])
                taken += 1
            step.assign(cut)
            record = saved.serialize()
            resumed = _train_input(task, model_dir, tf.Variable(0, dtype=tf.int64))
            resumed.deserialize(record)
            after = [next(resumed.iterator).numpy() for _ in range(AFTER)]
            if not all(np.array_equal(a, b) for a, b in zip(after, expected[cut:], strict=False)):
                wrong.append((repetition, cut))
    return wrong


@pytest.mark.slow
def test_a_shuffled_input_saved_around_epoch_boundaries_resumes_in_the_same_order(tmp_path):
    assert _resumes(ShuffledIds(prefetch=False), tmp_path) == []
    assert _resumes(ShuffledIds(prefetch=True), tmp_path) == []
