"""`orbitask verify`: the digits experiment trains alike on one device and on 2 replicas, as does
a correct port with synchronized BatchNorm; ports that differ are flagged with the cause their
differences fit (a loss averaged per replica, under the default Nadam; a Keras loss
object added to a plain mean, as TensorFlow's Pix2Pix tutorial does; a halved `d_loss` log).
Each log is compared by name, each variable against a tolerance measured on the run itself."""

from pathlib import Path

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

from orbitask import Task
from orbitask.trainers.commands import cli, verify
from orbitask.trainers.commands import verify_compare as compare
from orbitask.trainers.commands import verify_runs as runs

ROOT = Path(__file__).resolve().parents[1]
DIGITS = str(ROOT / "experiments" / "digits.gin")


class Small(Task):
    """8 features to 4 targets; Adam, or the seed's Nadam; optional BatchNorm."""

    norm = None  # "plain" or "synchronized" BatchNormalization after the first layer
    seed_optimizer = False

    def __init__(self):
        super().__init__()
        rng = np.random.RandomState(0)
        self.x = rng.normal(size=(64, 8)).astype(np.float32)
        self.y = (self.x[:, :4] * 0.5 + rng.normal(size=(64, 4)) * 0.1).astype(np.float32)

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        data = tf.data.Dataset.from_tensor_slices((self.x, self.y)).repeat()
        return data.batch(per_replica_batch_size, drop_remainder=True)

    def build_model(self):
        init = keras.initializers.GlorotUniform
        layers = [keras.Input((8,)), keras.layers.Dense(16, kernel_initializer=init(1))]
        if self.norm:
            layers.append(keras.layers.BatchNormalization(synchronized=self.norm != "plain"))
        layers += [
            keras.layers.Activation("tanh"),
            keras.layers.Dense(4, kernel_initializer=init(2)),
        ]
        return keras.Sequential(layers)

    def build_optimizer(self, learning_rate):
        if self.seed_optimizer:
            return super().build_optimizer(learning_rate)
        return keras.optimizers.Adam(1e-2, beta_1=0.5)

    def update(self, tape, loss, model, optimizer):
        """Applies the gradients of `loss`, as a hand-written loop does. Traced, per replica."""
        variables = model.trainable_variables
        gradients = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(gradients, variables, strict=True))


@gin.configurable("Pix2PixMix", module="verify_test")
class Pix2PixMix(Small):
    """TensorFlow's Pix2Pix generator loss: a Keras loss object (divided by the replicas under a
    strategy) plus LAMBDA times a plain mean of |target - output| (not divided); its loss-object
    logs declared "sum", as the start-up warning advises."""

    replica_logs = {"gen_gan_loss": "sum", "gen_total_loss": "sum"}

    def train_step(self, batch, model, optimizer, metrics=None, *, loss_fn, lr, global_batch_size):
        x, y = batch
        with tf.GradientTape() as tape:
            out = model(x, training=True)
            gan = keras.losses.MeanSquaredError()(y, out)
            l1 = tf.reduce_mean(tf.abs(y - out))
            total = gan + 100.0 * l1
        self.update(tape, total, model, optimizer)
        return {"gen_total_loss": total, "gen_gan_loss": gan, "gen_l1_loss": l1}


@gin.configurable("GlobalMean", module="verify_test")
class GlobalMean(Small):
    """A correct port: its loss a share of the global batch's mean, logged as `d_loss`, which it
    does not declare "sum": the replicas' shares are averaged, so the log is halved."""

    def train_step(self, batch, model, optimizer, metrics=None, *, loss_fn, lr, global_batch_size):
        x, y = batch
        with tf.GradientTape() as tape:
            per_example = tf.reduce_sum(tf.square(y - model(x, training=True)), axis=-1)
            d_loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch_size)
        self.update(tape, d_loss, model, optimizer)
        return {"d_loss": d_loss}


@gin.configurable("SynchronizedNorm", module="verify_test")
class SynchronizedNorm(GlobalMean):
    """The correct port, its log declared, with BatchNormalization(synchronized=True)."""

    norm = "synchronized"
    replica_logs = "sum"


@gin.configurable("ReplicaMean", module="verify_test")
class ReplicaMean(Small):
    """A loop written for one device: the loss is the mean over this replica's batch."""

    def train_step(self, batch, model, optimizer, metrics=None, *, loss_fn, lr, global_batch_size):
        x, y = batch
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.reduce_sum(tf.square(y - model(x, training=True)), axis=-1))
        self.update(tape, loss, model, optimizer)
        return {"loss": loss}


@gin.configurable("ReplicaMeanNadam", module="verify_test")
class ReplicaMeanNadam(ReplicaMean):
    seed_optimizer = True  # Nadam(epsilon=1e-3), the seed's


def _verify(tmp_path, task, *params, steps=3):
    """`orbitask verify` of `task` (a gin reference) at a global batch of 16; its exit status."""
    gin_file = tmp_path / "experiment.gin"
    gin_file.write_text(
        f"include '{ROOT / 'configs' / 'defaults.gin'}'\nTASK = {task}\nTRAIN_STEPS = 10\n"
        "orbitask.run_experiment.global_batch_size = 16\n"
    )
    flags = ["verify", f"--gin_file={gin_file}", f"--steps={steps}"]
    return cli.main(flags + [f"--gin_params={p}" for p in params])


@pytest.mark.slow  # three short trainings
def test_the_digits_experiment_trains_alike_on_one_device_and_two_replicas(capsys):
    flags = ["verify", f"--gin_file={DIGITS}", "--steps=2"]
    assert cli.main(flags + ["--gin_params=orbitask.run_experiment.global_batch_size = 32"]) == 0
    out = capsys.readouterr().out
    assert "orbitask verify: OK: 2 replicas train as one device" in out, out
    assert "orbitask verify: tolerance: 10x the differences one device's run shows" in out, out
    assert "orbitask-verify-" not in out, out  # no line names the folders it deletes
    assert not list(Path.cwd().glob("ckpt-*"))


@pytest.mark.slow  # three short trainings
def test_a_correct_port_with_synchronized_batchnorm_passes(tmp_path, capsys):
    assert _verify(tmp_path, "@verify_test.SynchronizedNorm()") == 0, capsys.readouterr().out


@pytest.mark.slow  # four short trainings
def test_a_per_replica_mean_loss_is_flagged_with_its_cause_under_nadam(tmp_path, capsys):
    assert _verify(tmp_path, "@verify_test.ReplicaMeanNadam()") == 1
    out = capsys.readouterr().out
    assert "orbitask verify: FAILED: 2 replicas do not train as one device" in out, out
    assert "moves as on one device with its gradients times 2: the loss is its replica's" in out


@pytest.mark.slow  # four short trainings
def test_a_loss_object_plus_a_plain_mean_is_flagged(tmp_path, capsys):
    assert _verify(tmp_path, "@verify_test.Pix2PixMix()") == 1
    out = capsys.readouterr().out
    assert "orbitask verify: FAILED" in out, out
    assert "`gen_total_loss` differs at step 1" in out, out
    assert "a Keras 3 loss object's result (divided by the 2 replicas) and a plain" in out, out


@pytest.mark.slow  # three short trainings
def test_a_halved_log_is_flagged_by_name(tmp_path, capsys):
    assert _verify(tmp_path, "@verify_test.GlobalMean()") == 1
    out = capsys.readouterr().out
    assert "orbitask verify: logs that differ: d_loss\n" in out, out
    assert "likely cause: `d_loss` is 1/2 of one device's from step 1" in out, out
    assert "{'d_loss': 'sum'}" in out, out


def _trained(last: dict, logs: dict | None = None, **layers) -> runs.Trained:
    first = {k: np.zeros_like(v) for k, v in BASE.items()}
    return runs.Trained(first, {**BASE, **last}, logs or {"loss": [1.0, 0.9]}, **layers)


BASE = {
    "0:dense/kernel": np.full((4, 3), 1.0, np.float32),
    "1:dense/bias": np.full(3, 0.01, np.float32),
    "2:dense_1/kernel": np.full((3, 2), 1.0, np.float32),
}


def test_the_worst_variable_named_is_the_one_furthest_past_its_tolerance():
    one = _trained({})
    nudged = _trained({"2:dense_1/kernel": BASE["2:dense_1/kernel"] + 1e-3})  # its rounding
    tol = compare.tolerance(one, nudged)
    assert tol.variable("2:dense_1/kernel") == pytest.approx(10 * 1e-3, rel=1e-4)
    assert tol.variable("0:dense/kernel") == compare.WEIGHTS_FLOOR
    many = _trained(
        {
            "0:dense/kernel": BASE["0:dense/kernel"] + 1e-3,  # the largest |diff|, 1e-3 moved
            "1:dense/bias": BASE["1:dense/bias"] + 1e-4,  # 1e-2 of its small change: the worst
            "2:dense_1/kernel": BASE["2:dense_1/kernel"] + 5e-3,  # 5e-3, within its tolerance
        }
    )
    agree, lines = verify.report(one, many, tol, None, 2, 3)
    assert not agree and tol.measured and "the floors" not in lines[1]
    assert "weights: largest difference 0.01 of training's change (1:dense/bias)" in lines[2]
    listed = lines[lines.index(next(x for x in lines if x.startswith("variables"))) + 1 :]
    assert [x.split()[0] for x in listed[:3]] == [
        "1:dense/bias",
        "0:dense/kernel",
        "2:dense_1/kernel",
    ]
    failing = compare.failing_variables(one, many, tol)
    assert [r.name for r in failing] == ["1:dense/bias", "0:dense/kernel"]


def test_every_log_is_compared_by_name_against_its_own_tolerance():
    logs = {"loss": [1.0, 0.5], "d_loss": [0.4, 0.3], "g_loss": [2.0, 1.0]}
    one = _trained({}, logs)
    nudged = _trained({}, {**logs, "g_loss": [2.0, 1.001]})  # g_loss: its rounding 5e-4
    many = _trained({}, {"loss": [1.0, 0.5], "d_loss": [0.2, 0.15], "g_loss": [2.0, 1.002]})
    tol = compare.tolerance(one, nudged)
    assert tol.log("g_loss") == pytest.approx(10 * 0.001 / 2.0)
    assert list(compare.failing_logs(one, many, tol)) == ["d_loss"]
    agree, lines = verify.report(one, many, tol, None, 2, 3)
    assert not agree and "logs that differ: d_loss" in lines
    assert any(x.startswith("likely cause: `d_loss` is 1/2 of one device's") for x in lines)
    assert "d_loss 0.5 (1e-05)" in lines[3] and "g_loss 0.001 (0.005)" in lines[3], lines[3]


def test_batchnorm_is_a_cause_only_when_not_synchronized_and_the_first_step_differs():
    def layers(norm):
        model = keras.Sequential([keras.Input((2,)), norm, keras.layers.Dropout(0.1)])
        return runs.per_replica_layers(runs._layers(model))

    assert layers(keras.layers.BatchNormalization(synchronized=True)) == ([], ["Dropout"])
    assert layers(keras.layers.BatchNormalization()) == (["BatchNormalization"], ["Dropout"])
    moved = {"0:dense/kernel": BASE["0:dense/kernel"] + 0.1}
    tol = compare.tolerance(_trained({}), _trained({}))
    first_differs = {"loss": [1.1, 0.9]}
    causes = compare.likely_causes(
        _trained({}, unsynchronized_norms=["BatchNormalization"]),
        _trained(moved, first_differs), None, tol, 2,
    )  # fmt: skip
    assert len(causes) == 1 and causes[0].startswith("per-replica batch statistics: `loss`")
    same_first = {"loss": [1.0, 0.8]}
    norm_only_later = compare.likely_causes(
        _trained({}, unsynchronized_norms=["BatchNormalization"]),
        _trained(moved, same_first), None, tol, 2,
    )  # fmt: skip
    assert norm_only_later == []
    synchronized = compare.likely_causes(_trained({}), _trained(moved, first_differs), None, tol, 2)
    assert len(synchronized) == 1 and "the loss adds terms scaled unlike" in synchronized[0]


def test_a_per_replica_mean_is_named_only_when_the_scaled_run_matches():
    tol = compare.tolerance(_trained({}), _trained({}))
    assert not tol.measured and tol.variable("0:dense/kernel") == compare.WEIGHTS_FLOOR
    assert (
        "no floating tf.data input): the floors"
        in verify.report(*[_trained({})] * 2, tol, None, 2, 3)[1][1]
    )
    many = _trained({"0:dense/kernel": BASE["0:dense/kernel"] + 0.1})
    like_many = _trained({"0:dense/kernel": BASE["0:dense/kernel"] + 0.1})
    unlike = _trained({"0:dense/kernel": BASE["0:dense/kernel"] + 0.3})
    cause = compare.likely_causes(_trained({}), many, like_many, tol, 2)
    assert len(cause) == 1 and "moves as on one device with its gradients times 2" in cause[0]
    assert compare.likely_causes(_trained({}), many, unlike, tol, 2) == []
