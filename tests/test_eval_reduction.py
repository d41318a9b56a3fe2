"""Evaluation logs are reduced by one documented rule (tasks/eval_logs.py): sums with
`num_examples` become per-example means; a step's mean loss without it is averaged over steps and
replicas, as Model Garden does. Both report the same loss on 1 device and on 2 replicas."""

import numpy as np
import pytest
import tensorflow as tf

from orbitask import run_experiment
from tests.helpers import TinyTask


class Kept(TinyTask):
    def build_model(self):
        self.model = super().build_model()
        return self.model


class MeanLossStep(Kept):
    """A Keras / Model Garden style validation step: the batch's mean loss, no num_examples."""

    def validation_step(self, batch, model, metrics=None, *, loss_fn, lr):
        inputs, labels = batch
        logits = model(inputs, training=False)
        per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        return {"loss": tf.reduce_mean(per_example)}


def _true_mean_loss(task):
    logits = task.model(task.x, training=False)
    return float(tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(task.y, logits)))


@pytest.mark.slow
@pytest.mark.parametrize("task_cls", [Kept, MeanLossStep], ids=["sum+num_examples", "mean"])
@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_eval_loss_is_the_mean_loss(tmp_path, task_cls, strategy):
    task = task_cls(l2=0.0)
    logs = run_experiment(
        task, str(tmp_path), mode="train_and_eval", train_steps=2, global_batch_size=8,
        eval_interval=None, strategy=strategy, progress=False,
    )  # fmt: skip
    replicas = task.model.distribute_strategy.num_replicas_in_sync
    assert replicas == (2 if strategy == "mirrored" else 1)
    assert logs["eval"]["loss"] == pytest.approx(_true_mean_loss(task), rel=1e-5)
    assert "_orbitask_values" not in logs["eval"]


def test_the_rule_on_plain_values():
    from orbitask.tasks import eval_logs

    state = None
    for step in ({"loss": (1.0, 3.0)}, {"loss": (5.0, 7.0)}):
        state = eval_logs.aggregate(state, step)
    assert eval_logs.reduce(state) == {"loss": 4.0}
    state = eval_logs.aggregate(None, {"loss": (6.0, 2.0), "num_examples": (3.0, 1.0)})
    assert eval_logs.reduce(state) == {"loss": 2.0}
    assert eval_logs.reduce(eval_logs.aggregate(None, {"image": (np.ones((2, 2)),)}))["image"].shape
