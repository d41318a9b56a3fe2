"""Model Garden's own tasks, unchanged from site-packages, trained by orbitask on tiny TFRecords.

`SentencePredictionTask` with a tiny BERT encoder and its own dropout (0.1): device loops of any
length draw the same dropout masks; a stopped and resumed run ends with the weights of an
uninterrupted one bit for bit (the dropout generators, the attention's included, are saved under
`random_state/`); the run starts from the initial weights of Model Garden's own, unchanged
`train_lib.run_experiment`, and trains its weights where nothing draws (ResNet) or with
`save_layer_draws=False` (BERT).

`ImageClassificationTask` from the registered `resnet_imagenet` experiment, shrunk, with its
default augmentation (`aug_crop`, `aug_rand_hflip`): the run goes on with one warning line naming
the parser's stateful random ops, and a resumed run restores the input position.
"""

import re
import shutil

import numpy as np
import pytest
import tensorflow as tf
from official.core import config_definitions as cfg
from official.core import exp_factory, train_lib
from official.nlp.configs import encoders
from official.nlp.data import sentence_prediction_dataloader
from official.nlp.tasks import sentence_prediction
from official.vision.tasks import image_classification

from orbitask.tasks import ModelGardenTask
from orbitask.trainers import run_experiment
from orbitask.trainers.engine.determinism import make_deterministic
from tests.helpers import checkpoint_weights, weights

DRAWS = "draws random numbers with stateful ops"
RESTARTS = "restarts from its beginning"


def _int64(values) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))


def _write(path, examples) -> str:
    with tf.io.TFRecordWriter(str(path)) as writer:
        for features in examples:
            example = tf.train.Example(features=tf.train.Features(feature=features))
            writer.write(example.SerializeToString())
    return str(path)


def _assert_same(expected, got):
    assert len(expected) == len(got)
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------ sentence prediction (BERT)

SEQ = 8
BERT_STEPS = 10


def _sentences(path) -> str:
    """32 examples as the sentence prediction loader reads them: input_ids, input_mask,
    segment_ids (SEQ int64 each) and label_ids (int64)."""
    rng = np.random.RandomState(0)
    examples = []
    for _ in range(32):
        ids = rng.randint(1, 64, size=SEQ)
        examples.append(
            {
                "input_ids": _int64(ids),
                "input_mask": _int64(np.ones(SEQ)),
                "segment_ids": _int64(np.zeros(SEQ)),
                "label_ids": _int64([ids[0] > 32]),
            }
        )
    return _write(path, examples)


def bert_experiment(data_path: str, attention_dropout: float = 0.1) -> cfg.ExperimentConfig:
    """A 1-layer BERT (vocab 64, hidden 16, 2 heads) with dropout 0.1 on its embeddings, its
    attention output, its feed-forward output and the classifier's input, and
    `attention_dropout` on the attention probabilities; seeded shuffles; SGD with momentum at
    a constant 0.1."""

    def data(training):
        return sentence_prediction_dataloader.SentencePredictionDataConfig(
            input_path=data_path, global_batch_size=4, seq_length=SEQ, is_training=training,
            seed=1, shuffle_buffer_size=8, drop_remainder=True,
        )  # fmt: skip

    bert = encoders.BertEncoderConfig(
        vocab_size=64, hidden_size=16, num_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=16, dropout_rate=0.1,
        attention_dropout_rate=attention_dropout,
    )  # fmt: skip
    model = sentence_prediction.ModelConfig(
        num_classes=2, encoder=encoders.EncoderConfig(type="bert", bert=bert)
    )
    task = sentence_prediction.SentencePredictionConfig(
        model=model, train_data=data(True), validation_data=data(False)
    )
    experiment = cfg.ExperimentConfig(task=task)
    sgd = {
        "optimizer": {"type": "sgd", "sgd": {"momentum": 0.9}},
        "learning_rate": {"type": "constant", "constant": {"learning_rate": 0.1}},
    }
    experiment.override({"trainer": {"optimizer_config": sgd}})
    return experiment


def bert_task(data_path: str, attention_dropout: float = 0.1) -> ModelGardenTask:
    experiment = bert_experiment(data_path, attention_dropout)
    task = sentence_prediction.SentencePredictionTask(experiment.task)
    return ModelGardenTask(task, experiment=experiment)


BERT_RUN = dict(mode="train", global_batch_size=4, seed=0, progress=False)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """The data and the reference: one uninterrupted run of BERT_STEPS steps in device loops
    of one step each. Returns (data path, reference model_dir, its checkpoint's weights)."""
    root = tmp_path_factory.mktemp("bert")
    data_path = _sentences(root / "train.tfrecord")
    model_dir = root / "one_step_loops"
    run_experiment(
        bert_task(data_path), str(model_dir), train_steps=BERT_STEPS, steps_per_loop=1,
        **BERT_RUN,
    )  # fmt: skip
    return data_path, model_dir, checkpoint_weights(bert_task(data_path), model_dir)


@pytest.mark.slow
def test_bert_dropout_draws_the_same_masks_whatever_the_loop_lengths(bert, tmp_path, capsys):
    """Loops of 5 steps cut by checkpoints every 3 steps (loops of 3, 3, 3, 1) train the
    weights of loops of one step, bit for bit; the dropout generators are in the checkpoint
    and the step holds no stateful random op to warn about."""
    data_path, _, expected = bert
    run_experiment(
        bert_task(data_path), str(tmp_path), train_steps=BERT_STEPS, steps_per_loop=5,
        loop_seconds=None, checkpoint_interval=3, **BERT_RUN,
    )  # fmt: skip
    _assert_same(expected, checkpoint_weights(bert_task(data_path), tmp_path))
    assert DRAWS not in capsys.readouterr().out
    saved = [name for name, _ in tf.train.list_variables(tf.train.latest_checkpoint(tmp_path))]
    generators = [name for name in saved if name.startswith("random_state/")]
    assert len(generators) >= 3, saved  # embedding, attention and output dropout at least


def _stop_and_resume(data_path, model_dir, attention_dropout: float = 0.1) -> str:
    """Stops at step 4 (loops of one step), resumes to BERT_STEPS with the default loop
    settings. Returns the checkpoint's weights."""
    task = bert_task(data_path, attention_dropout)
    run_experiment(task, str(model_dir), train_steps=4, steps_per_loop=1, **BERT_RUN)
    task = bert_task(data_path, attention_dropout)
    run_experiment(task, str(model_dir), train_steps=BERT_STEPS, **BERT_RUN)
    return checkpoint_weights(bert_task(data_path, attention_dropout), model_dir)


@pytest.mark.slow
def test_bert_without_attention_dropout_resumes_bit_for_bit(tmp_path, capsys):
    """Dropout 0.1 on the embeddings, the attention output, the feed-forward output and the
    classifier's input (attention probabilities not dropped): stopped at step 4 and resumed
    with the default loop settings, the weights are the uninterrupted run's, bit for bit; the
    input position (the loader's seeded shuffle) is restored."""
    data_path = _sentences(tmp_path / "train.tfrecord")
    whole = tmp_path / "whole"
    run_experiment(
        bert_task(data_path, 0.0), str(whole), train_steps=BERT_STEPS, steps_per_loop=1,
        **BERT_RUN,
    )  # fmt: skip
    resumed = _stop_and_resume(data_path, tmp_path / "halves", attention_dropout=0.0)
    _assert_same(checkpoint_weights(bert_task(data_path, 0.0), whole), resumed)
    out = capsys.readouterr().out
    assert "resumed from" in out and "(step 4)" in out
    assert RESTARTS not in out
    assert DRAWS not in out  # the step holds no stateful random op


@pytest.mark.slow
def test_bert_stopped_and_resumed_equals_the_uninterrupted_run(bert, tmp_path, capsys):
    """With BERT's attention dropout as well (0.1): the generator of the Dropout inside the
    MultiHeadAttention of the TransformerEncoderBlock (nine levels down) is saved too."""
    data_path, _, expected = bert
    resumed = _stop_and_resume(data_path, tmp_path)
    assert RESTARTS not in capsys.readouterr().out
    _assert_same(expected, resumed)


class StartRecorded(ModelGardenTask):
    """Keeps the model's weights as training starts (`on_train_begin`)."""

    def on_train_begin(self, ctx):
        self.start = weights(ctx.model)


class BuildRecorded(sentence_prediction.SentencePredictionTask):
    """Model Garden's task, keeping the weights of the model it builds."""

    def build_model(self):
        model = super().build_model()
        self.initial = weights(model)
        return model


def _model_garden_train_lib(experiment, task, model_dir, steps: int):
    """Model Garden's `train_lib.run_experiment`, unchanged, seeded as orbitask's `seed=0`
    seeds, in device loops of one step (its default tf.while_loop). Returns its model and task."""
    experiment.override(
        {"trainer": {"train_steps": steps, "steps_per_loop": 1, "summary_interval": 1,
                     "checkpoint_interval": steps, "validation_interval": steps}}
    )  # fmt: skip
    make_deterministic(0)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        task = task(experiment.task)
    model, _ = train_lib.run_experiment(
        strategy, task, "train", experiment, str(model_dir), save_summary=False
    )
    return model, task


@pytest.mark.slow
def test_bert_against_model_gardens_unchanged_train_lib(bert, tmp_path, capsys):
    """Model Garden's `train_lib.run_experiment`, run unchanged, against orbitask
    (`use_tf_while_loop=False`, one-step loops), same ExperimentConfig and seed.

    orbitask starts from Model Garden's initial weights bit for bit. Its six dropout layers
    draw from generators its checkpoints save (exact resume), not as tf_keras' unsaved stateful
    ops draw in Model Garden, so the trained weights differ; the start line says so and names
    the binding, with which orbitask trains Model Garden's weights bit for bit."""
    data_path, _, _ = bert
    model, mg_task = _model_garden_train_lib(
        bert_experiment(data_path), BuildRecorded, tmp_path / "mg", BERT_STEPS
    )
    model_garden = weights(model)
    trained = {}
    for saved in (True, False):
        task = bert_task(data_path)
        task = StartRecorded(task.task, experiment=task.experiment, save_layer_draws=saved)
        model_dir = tmp_path / f"orbitask_{saved}"
        run_experiment(
            task, str(model_dir), train_steps=BERT_STEPS, steps_per_loop=1,
            use_tf_while_loop=False, **BERT_RUN,
        )  # fmt: skip
        _assert_same(mg_task.initial, task.start)
        trained[saved] = checkpoint_weights(bert_task(data_path), model_dir)
    out = capsys.readouterr().out
    assert out.count("tf_keras layer(s) draw their masks") == 1, out
    assert "6 tf_keras layer(s) draw their masks from generators the checkpoint saves" in out
    assert "orbitask.Task.save_layer_draws = False draws as it does" in out
    assert any(not np.array_equal(a, b) for a, b in zip(model_garden, trained[True], strict=True))
    _assert_same(model_garden, trained[False])


# ---------------------------------------------------- image classification (ResNet, augmented)

IMAGE_STEPS = 8


def _flat_images(path) -> str:
    """16 JPEGs of 40x48 pixels, each one flat colour, labelled 0 and 1 in turn.

    A crop, a flip or a bilinear resize of a flat image is the same flat image, so the
    parser's augmentation draws random numbers but changes no pixel: a resumed run then
    trains the uninterrupted run's weights exactly when it reads the same batches."""
    rng = np.random.RandomState(0)
    examples = []
    for i in range(16):
        colour = rng.randint(0, 256, size=3).astype(np.uint8)
        jpeg = tf.io.encode_jpeg(np.broadcast_to(colour, (40, 48, 3)).copy()).numpy()
        examples.append(
            {
                "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
                "image/class/label": _int64([i % 2]),
            }
        )
    return _write(path, examples)


def resnet_task(data_path: str) -> ModelGardenTask:
    """`resnet_imagenet` shrunk: ResNet-10 at a quarter of its width, 32x32 inputs, 2 classes,
    batches of 4, a seeded shuffle, a constant rate; its augmentation left as registered."""
    experiment = exp_factory.get_exp_config("resnet_imagenet")
    experiment.override(
        {
            "task": {
                "model": {
                    "num_classes": 2,
                    "input_size": [32, 32, 3],
                    "backbone": {"resnet": {"model_id": 10, "depth_multiplier": 0.25}},
                },
                "train_data": {
                    "input_path": data_path, "global_batch_size": 4, "seed": 1,
                    "shuffle_buffer_size": 16, "cycle_length": 1,
                },
                "validation_data": {"input_path": data_path, "global_batch_size": 4},
            },
            "trainer": {
                "optimizer_config": {
                    "learning_rate": {"type": "constant", "constant": {"learning_rate": 0.1}},
                    "warmup": {"type": None},
                }
            },
            "runtime": {"enable_xla": False},
        }
    )  # fmt: skip
    train_data = experiment.task.train_data
    assert train_data.aug_rand_hflip and train_data.aug_crop and train_data.decode_jpeg_only
    task = image_classification.ImageClassificationTask(experiment.task)
    return ModelGardenTask(task, experiment=experiment)


RESNET_RUN = dict(mode="train", global_batch_size=4, seed=0, progress=False)
WARNING = re.compile(rf"^orbitask: warning: .*build_inputs\(training=True\) {DRAWS} \((.*?)\)")


def _warned_ops(out: str) -> list[str]:
    """The op lists of the warning lines in `out`, one per line."""
    return [m.group(1) for line in out.splitlines() if (m := WARNING.match(line))]


@pytest.mark.slow
def test_resnet_with_its_default_augmentation_runs_warns_and_resumes_its_input(tmp_path, capsys):
    """The pipeline's stateful ops (the parser's random crop and flip) are named in one line
    and the run goes on; stopped at step 3 (mid-epoch: 4 batches an epoch) and resumed, the
    input goes on from its saved position and the weights are the uninterrupted run's. A
    resume without the saved position restarts the input and trains other weights."""
    data_path = _flat_images(tmp_path / "train.tfrecord")
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    run_experiment(resnet_task(data_path), str(whole), train_steps=IMAGE_STEPS, **RESNET_RUN)
    run_experiment(resnet_task(data_path), str(halves), train_steps=3, **RESNET_RUN)
    lost = tmp_path / "lost_position"
    shutil.copytree(halves, lost)
    run_experiment(resnet_task(data_path), str(halves), train_steps=IMAGE_STEPS, **RESNET_RUN)
    out = capsys.readouterr().out

    ops = "RandomUniform in parse, SampleDistortedBoundingBoxV2 in parse"
    assert _warned_ops(out) == [ops] * 3  # one line a run, naming the parser's ops
    assert out.count(DRAWS) == 3  # none for the step: ResNet draws nothing
    assert out.count(f"ImageClassificationTask.build_inputs(training=True) {DRAWS}") == 3
    assert "resumed from" in out and "(step 3)" in out
    assert RESTARTS not in out
    expected = checkpoint_weights(resnet_task(data_path), whole)
    _assert_same(expected, checkpoint_weights(resnet_task(data_path), halves))

    shutil.rmtree(lost / "input")  # the position saved at step 3 is gone
    run_experiment(resnet_task(data_path), str(lost), train_steps=IMAGE_STEPS, **RESNET_RUN)
    assert f"the training input {RESTARTS} at step 3" in capsys.readouterr().out
    restarted = checkpoint_weights(resnet_task(data_path), lost)
    assert any(not np.array_equal(a, b) for a, b in zip(expected, restarted, strict=True))


@pytest.mark.slow
def test_resnet_trains_model_gardens_unchanged_train_lib_weights(tmp_path):
    """ResNet draws nothing in its step (its head's Dropout(0.0) draws no mask): Model
    Garden's unchanged `train_lib.run_experiment` and orbitask train the same weights bit for
    bit, from the same batches (flat images: its random crop and flip change no pixel)."""
    data_path = _flat_images(tmp_path / "train.tfrecord")
    task = resnet_task(data_path)
    model, _ = _model_garden_train_lib(
        task.experiment, image_classification.ImageClassificationTask, tmp_path / "mg", IMAGE_STEPS
    )
    orbitask_dir = tmp_path / "orbitask"
    run_experiment(
        resnet_task(data_path), str(orbitask_dir), train_steps=IMAGE_STEPS, steps_per_loop=1,
        use_tf_while_loop=False, **RESNET_RUN,
    )  # fmt: skip
    _assert_same(weights(model), checkpoint_weights(resnet_task(data_path), orbitask_dir))
