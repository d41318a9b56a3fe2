"""Weighted examples train as Keras `fit(sample_weight=...)` and `fit(class_weight=...)` do.

The original is Keras `fit` on a small classifier: 100 examples, batches of 32 without shuffling
(each epoch ends with a partial batch of 4), Adam at 1e-2, and either a weight per example or a
weight per class. The port yields `(inputs, labels, weights)` batches, or sets
`Task.class_weight`, with orbitask's default step (`clip_norm=None`, as `fit` does not clip).
Both weight each example's loss and divide a step by its examples (Keras' "sum_over_batch_size").
The port ends at `fit`'s weights on one device and on 2 replicas, and its evaluation of weighted
batches is Keras' `evaluate(..., sample_weight=...)`. A `class_weight` naming only some classes
weighs the others 1.0 (`fit`'s array path), set as the constructor's argument or as a class
attribute of the Task; with weighted batches too, each example weighs its weight times its
class's (`fit` refuses both at once, so its side gets their product as `sample_weight`).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import orbitask
from tests.ports import BATCH_SIZE, EPOCHS, EXAMPLES, SEED, STEPS, weights_of

CLASSES = 3
CLASS_WEIGHT = {0: 1.0, 1: 3.0, 2: 0.5}
PARTIAL = {1: 3.0}  # classes 0 and 2 weigh 1.0; 2 is past the largest class named
TOLERANCE = dict(rtol=1e-5, atol=1e-6)


def make_data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inputs, labels and example weights in [0, 2) (seeded)."""
    rng = np.random.RandomState(SEED)
    x = rng.uniform(size=(EXAMPLES, 16)).astype(np.float32)
    y = rng.randint(0, CLASSES, size=EXAMPLES).astype(np.int64)
    return x, y, rng.uniform(0, 2, size=EXAMPLES).astype(np.float32)


def get_model() -> keras.Model:
    keras.utils.set_random_seed(SEED)
    return keras.Sequential(
        [keras.Input((16,)), keras.layers.Dense(8, "relu"), keras.layers.Dense(CLASSES)]
    )


def fit(by_class: bool, class_weight: dict = CLASS_WEIGHT, sample: bool = False) -> keras.Model:
    """Keras `fit` with `sample_weight` or `class_weight` (with both, `sample`: their product as
    `sample_weight`, a class not named weighing 1.0); returns the trained model."""
    x, y, w = make_data()
    model = get_model()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss)
    if by_class and sample:
        by_label = np.array([class_weight.get(int(label), 1.0) for label in y], np.float32)
        weighting = {"sample_weight": w * by_label}
    else:
        weighting = {"class_weight": class_weight} if by_class else {"sample_weight": w}
    model.fit(x, y, batch_size=BATCH_SIZE, epochs=EPOCHS, shuffle=False, verbose=0, **weighting)
    return model


class Weighted(orbitask.Task):
    """`by_class`: `class_weight` given (default `CLASS_WEIGHT`); `sample`: batches of
    `(inputs, labels, weights)` (default: without `by_class`)."""

    def __init__(self, by_class: bool, per_example: bool = True, sample=None, **kwargs):
        if by_class and "class_weight" not in kwargs:
            kwargs["class_weight"] = CLASS_WEIGHT
        super().__init__(clip_norm=None, **kwargs)
        self.sample = not by_class if sample is None else sample
        self.per_example = per_example
        self.model = None

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        x, y, w = make_data()
        dataset = tf.data.Dataset.from_tensor_slices((x, y, w) if self.sample else (x, y))
        dataset = dataset.batch(per_replica_batch_size)
        return dataset.repeat() if training else dataset

    def build_model(self):
        self.model = get_model()
        return self.model

    def build_losses(self):
        reduction = "none" if self.per_example else "sum"
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)
        return lambda loss_input: loss(loss_input[1], loss_input[0])

    def build_optimizer(self, learning_rate):
        return keras.optimizers.Adam(1e-2)


class PartlyWeighted(Weighted):
    """`class_weight` as a class attribute, naming one class of three."""

    class_weight = PARTIAL


def _port(model_dir, by_class: bool, replicas: int = 1, task=None) -> tuple[list, dict]:
    """The port's weights and eval logs after `STEPS` steps."""
    task = task or Weighted(by_class)
    distribution = {"strategy": "mirrored", "cpu_devices": replicas} if replicas > 1 else {}
    logs = orbitask.run_experiment(
        task, str(model_dir), mode="train_and_eval", train_steps=STEPS,
        global_batch_size=BATCH_SIZE, eval_interval=STEPS, progress=False, seed=SEED,
        **distribution,
    )  # fmt: skip
    return weights_of(task.model), logs["eval"]


def _assert_close(expected, got):
    assert len(expected) == len(got)
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_allclose(b, a, **TOLERANCE)


@pytest.mark.parametrize(
    "by_class,replicas",
    [(False, 1), pytest.param(False, 2, marks=pytest.mark.slow), (True, 1)],
    ids=["sample_weight", "sample_weight-2_replicas", "class_weight"],
)
def test_weighted_examples_train_fits_weights(tmp_path, by_class, replicas):
    model = fit(by_class)
    got, eval_logs = _port(tmp_path, by_class, replicas)
    _assert_close(weights_of(model), got)
    if not by_class:
        x, y, w = make_data()
        expected = model.evaluate(x, y, sample_weight=w, batch_size=BATCH_SIZE, verbose=0)
        assert eval_logs["loss"] == pytest.approx(expected, rel=1e-5)


def test_a_partial_class_weight_as_a_class_attribute_trains_fits_weights(tmp_path):
    model = fit(True, PARTIAL)
    got, _ = _port(tmp_path, True, task=PartlyWeighted(by_class=False, sample=False))
    _assert_close(weights_of(model), got)


def test_class_and_sample_weights_together_train_fits_weights_for_their_product(tmp_path):
    model = fit(True, CLASS_WEIGHT, sample=True)
    got, eval_logs = _port(tmp_path, True, task=Weighted(by_class=True, sample=True))
    _assert_close(weights_of(model), got)
    x, y, w = make_data()
    product = w * np.array([CLASS_WEIGHT[int(label)] for label in y], np.float32)
    expected = model.evaluate(x, y, sample_weight=product, batch_size=BATCH_SIZE, verbose=0)
    assert eval_logs["loss"] == pytest.approx(expected, rel=1e-5)


def test_class_weight_comes_from_the_argument_else_the_class_attribute():
    assert np.array(PartlyWeighted(by_class=False).class_weight).tolist() == [1.0, 3.0]
    given = PartlyWeighted(by_class=False, class_weight={0: 2.0})
    assert np.array(given.class_weight).tolist() == [2.0]
    assert orbitask.Task().class_weight is None


def test_a_class_weight_class_attribute_that_is_not_a_dict_is_refused_naming_it():
    class Wrong(Weighted):
        class_weight = [1.0, 2.0]

    with pytest.raises(
        orbitask.ConfigError, match=r"received \[1.0, 2.0\]. Fix Wrong.class_weight"
    ):
        Wrong(by_class=False)


def test_weights_on_a_summed_loss_are_refused_in_one_line(tmp_path):
    task = Weighted(by_class=False, per_example=False)
    with pytest.raises(orbitask.ConfigError, match=r"^Weighted's batches are weighted .*needs"):
        orbitask.run_experiment(
            task, str(tmp_path), mode="train", train_steps=2, global_batch_size=8,
            progress=False,
        )  # fmt: skip


def test_a_class_weight_that_is_not_a_dict_of_classes_is_refused():
    with pytest.raises(orbitask.ConfigError, match="Fix orbitask.Task.class_weight"):
        orbitask.Task(class_weight={"cat": 2.0})
