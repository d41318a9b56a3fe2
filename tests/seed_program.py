"""A user program written for tf-custom-multi-gpu-training (the seed), unchanged.

The functions keep the seed's names and signatures, and the stages are copied from the seed's
README. `tests/test_callback_task.py` runs this module through `tasks.CallbackTask`. The
callbacks record what they receive in `CALLS` so the test can check it.
"""

import numpy as np
import tensorflow as tf

CALLS = {"every": [], "at": []}


def reset():
    for calls in CALLS.values():
        calls.clear()


def create_dataset(per_replica_batch_size):
    rng = np.random.RandomState(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = (x[:, 0] - x[:, 1] > 0).astype(np.int32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
    return dataset.batch(per_replica_batch_size, drop_remainder=True)


def create_model():
    train_model = tf.keras.Sequential(
        [
            tf.keras.Input((4,)),
            tf.keras.layers.Dense(
                8, activation="tanh", kernel_initializer=tf.keras.initializers.GlorotUniform(1)
            ),
            tf.keras.layers.Dense(2, kernel_initializer=tf.keras.initializers.GlorotUniform(2)),
        ]
    )
    return train_model


class SumCrossEntropy(tf.Module):
    """The loss "network": a trackable object, so the seed's create_ckpt can save it."""

    def __call__(self, inputs):
        output, gt = inputs
        per_example = tf.keras.losses.sparse_categorical_crossentropy(gt, output, from_logits=True)
        return tf.reduce_sum(per_example)


def create_loss():
    train_loss = SumCrossEntropy()
    return train_loss


def create_opt(lr):
    optimizer = tf.keras.optimizers.Nadam(learning_rate=lr, epsilon=0.001)
    return optimizer


def create_ckpt(ckpt_path, step, lr, optimizer, train_model, train_loss):
    nets = {
        "train_model": train_model,
        "train_loss": train_loss,
    }
    ckpt = tf.train.Checkpoint(step=step, lr=lr, optimizer=optimizer, **nets)
    manager = tf.train.CheckpointManager(ckpt, ckpt_path, max_to_keep=50)
    return ckpt, manager


def input_pre(batch, lr):
    inputs, gt = batch
    return inputs


def loss_pre(output, batch, train_model, lr):
    inputs, gt = batch
    return output, gt


def grad_pre(loss, output, batch, train_model, train_loss, lr):
    loss_per_batch = loss
    extra_loss_list = train_model.losses
    extra_loss = tf.reduce_sum(extra_loss_list)
    trainable_vars = train_model.trainable_variables
    return loss_per_batch, extra_loss, trainable_vars


def update_pre(gradients, loss, output, batch, train_model, train_loss, lr, optimizer):
    non_nan_gradients = [
        tf.where(tf.math.is_nan(grad), tf.zeros_like(grad), grad) for grad in gradients
    ]
    capped_gradients, norm = tf.clip_by_global_norm(non_nan_gradients, 10.0)
    update_gradients = capped_gradients
    display_gradients = non_nan_gradients
    return update_gradients, display_gradients


def log_loss(
    dev,
    step,
    update_gradients,
    loss,
    output,
    batch,
    train_model,
    train_loss,
    lr,
    optimizer,
    display_gradients,
    gradients,
    ckpt,
    manager,
):
    tf.print("seed step", step, "loss", loss)
    tf.summary.scalar("my_loss", loss)
    CALLS["every"].append(
        {
            "step": int(step),
            "loss": float(loss),
            "dev": dev,
            "train_model": train_model,
            "train_loss": train_loss,
            "lr": lr,
            "optimizer": optimizer,
            "ckpt": ckpt,
            "manager": manager,
            "step_tensors": (update_gradients, output, batch, display_gradients, gradients),
        }
    )


def mark(
    dev,
    step,
    update_gradients,
    loss,
    output,
    batch,
    train_model,
    train_loss,
    lr,
    optimizer,
    display_gradients,
    gradients,
    ckpt,
    manager,
):
    CALLS["at"].append(int(step))


every_steps = {5: log_loss}
at_step = {7: mark}
