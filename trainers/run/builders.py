"""Builders of a run's objects: each returns what it builds, whole, and sets nothing else.

`runner.ExperimentRunner` calls them in its build order (inside the strategy's scope where a
docstring says so). Objects built together come back as one small frozen record.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import Any

import orbit
import tensorflow as tf

from orbitask.common import keras_compat
from orbitask.trainers.actions import summaries
from orbitask.trainers.distribution import cluster, strategies
from orbitask.trainers.engine import eval_inputs, inputs
from orbitask.trainers.engine.determinism import make_deterministic
from orbitask.trainers.engine.kept_step import KeptStep
from orbitask.trainers.engine.prefetch import Prefetch
from orbitask.trainers.engine.ps_trainer import ParameterServerTrainer
from orbitask.trainers.engine.steps import RunObjects, TrainStep
from orbitask.trainers.engine.task_trainer import TaskTrainer
from orbitask.trainers.errors import ConfigError
from orbitask.trainers.features.learning_rate import LearningRate
from orbitask.trainers.features.precision import DynamicLossScale, precision_policy
from orbitask.trainers.run import folders, loss_share, messages, preflight
from orbitask.trainers.run.settings import (
    Settings,
    check_cpu_devices,
    check_nan_guard_step,
    check_replicas,
    flat,
)
from orbitask.trainers.state import loggers


@dataclasses.dataclass(frozen=True)
class SummaryManagers:
    """The run's summary managers: `train/` (kept scalars) and `eval/` (`build_summaries`)."""

    train: summaries.LoopSummaryManager
    eval: orbit.utils.SummaryManager


def build_strategy(settings: Settings) -> tf.distribute.Strategy:
    """The run's strategy. Seeds and logical CPU devices first (they must precede TensorFlow's
    start). Eager; returns the strategy.

    Raises:
      ConfigError: when the replicas do not fit `cpu_devices`, the batch or `jit_compile`.
    """
    loop, distribution = settings.loop, settings.distribution
    if loop.seed is not None:
        make_deterministic(loop.seed)
    name = distribution.strategy
    if distribution.cpu_devices:
        wanted = distribution.cpu_devices
        check_cpu_devices(wanted, len(strategies.logical_cpus(wanted)))
        if name == "auto" and not tf.config.list_logical_devices("GPU"):
            name = "mirrored"  # the replicas cpu_devices asks for
    strategy = strategies.build_strategy(name)
    replicas = strategy.num_replicas_in_sync
    check_replicas(replicas, loop.global_batch_size, loop.jit_compile)
    return strategy


def build_objects(
    task: Any, strategy: Any, settings: Settings, training: bool, evaluating: bool
) -> RunObjects:
    """The task's model, loss, optimizer and metrics, the global step and the learning rate,
    the NaN guard and the loss scale. Eager, in the strategy's scope. The chief of a training
    run names the tf_keras layers whose draws are saved."""
    features, loop = settings.features, settings.loop
    with precision_policy(features.mixed_precision):
        model = task.build_model()
    if getattr(task, "save_layer_draws", True):
        drawing = keras_compat.save_layer_draws(model, loop.seed)
        if drawing and training and cluster.is_chief(tf.distribute.get_strategy()):
            messages.layer_draws(drawing)
    preflight.check_model(task, model)
    flavour = task.keras_flavour or keras_compat.model_flavour(model) or keras_compat.KERAS3
    needed = preflight.needs_losses(task, training, evaluating)
    loss_fn = task.build_losses() if needed else None
    global_step = orbit.utils.create_global_step()
    learning_rate = LearningRate.create(loop.learning_rate)
    with _flavour(task, flavour):  # the built model's, for build_optimizer
        optimizer = task.build_optimizer(float(learning_rate.lr.numpy()))
    learning_rate.decide_owner(optimizer)
    keras_compat.check_matching(model, optimizer)
    train_metrics = task.build_metrics(training=True) if training else []
    eval_metrics = task.build_metrics(training=False) if evaluating else []
    # The run's own copies: the settings' objects stay as given, reusable by another run.
    nan_guard = copy.copy(features.nan_guard) if training else None
    if nan_guard is not None:
        check_nan_guard_step(task)
        nan_guard.build()
    float16 = features.mixed_precision == "mixed_float16" and training
    return RunObjects(
        task=task,
        strategy=strategy,
        model=model,
        loss_fn=loss_fn,
        global_step=global_step,
        learning_rate=learning_rate,
        optimizer=optimizer,
        train_metrics=train_metrics,
        eval_metrics=eval_metrics,
        nan_guard=nan_guard,
        loss_scale=DynamicLossScale() if float16 else None,
        ema=copy.copy(features.ema),
        global_batch_size=loop.global_batch_size,
    )


@contextlib.contextmanager
def _flavour(task: Any, flavour: str) -> Iterator[None]:
    """While open, `task.keras_flavour` is `flavour`; then what it was (a Task's own setting).
    Eager."""
    given = task.keras_flavour
    task.keras_flavour = flavour
    try:
        yield
    finally:
        task.keras_flavour = given


def build_train_input(
    task: Any, strategy: Any, objects: RunObjects, settings: Settings, model_dir: str
) -> inputs.TrainInput:
    """The train input and its position, checked against the model and loss. Eager, in the
    strategy's scope."""
    loop, keep = settings.loop, settings.checkpoints.keep_input_positions
    batch = loop.global_batch_size
    train_input = inputs.train_input(
        task,
        strategy,
        batch,
        loop.gradient_accumulation_steps,
        objects.global_step,
        model_dir,
        keep,
        loop.train_steps is None,  # by epochs
        Prefetch(settings.checkpoints.train_prefetch, settings.checkpoints.train_prefetch_bytes),
    )
    return preflight.checked_train_input(task, strategy, train_input, objects)


def build_train_steps(settings: Settings, train_input: Any, strategy: Any, chief: bool) -> Any:
    """The step training stops at: `train_steps`, or else (`train_input` given) `train_epochs`
    (default one) epochs of the training input, the fewest of any worker's, said in one line by
    the chief. Eager; returns the step, or None.

    Raises:
      ConfigError: when the epochs come to no step.
    """
    loop = settings.loop
    if loop.train_steps is not None or train_input is None:
        return loop.train_steps
    epochs, length = loop.train_epochs or 1, train_input.epoch_length
    steps = cluster.smallest(strategy, length.steps_for(epochs))
    if steps < 1:
        raise ConfigError(
            f"train_epochs={epochs} of {float(length.steps):.3g} steps each is no step; "
            "raise orbitask.run_experiment.train_epochs or lower global_batch_size."
        )
    if chief:
        messages.epochs(epochs, length.steps, steps)
    return steps


def build_summaries(
    model_dir: str,
    output_dir: str,
    global_step: tf.Variable,
    settings: Settings,
    current_step: Callable[[], int],
    *,
    write_train: bool,
    write_eval: bool,
    summary_dir: str | None = None,
) -> SummaryManagers:
    """The train and eval summary managers, under `model_dir/train` and `output_dir/eval`, or
    `summary_dir/train` and `summary_dir/eval` where a platform gives its TensorBoard folder; one
    that does not write (`write_train` or `write_eval` False) has no directory. Those that
    write also send their scalars to the run's `loggers` (`loggers.Records`): in a training run
    all of them, under the model directory; in an evaluation mode the files under
    `output_dir/eval`. Eager.

    Raises:
      ConfigError: for a logger that cannot be built (`loggers.build`).
    """
    train_dir, eval_dir = folders.summary_dirs(model_dir, output_dir, summary_dir)
    train = summaries.LoopSummaryManager(
        train_dir if write_train else None,
        summaries.write,
        global_step,
        interval=10 * settings.loop.steps_per_loop,
        current_step=current_step,
    )
    evaluation = summaries.EvalSummaryManager(
        eval_dir if write_eval else None, summaries.write, global_step
    )
    # An evaluation mode writes only eval/ (a training run may be appending to its own files);
    # the loggers' files stay beside the checkpoints whatever folder TensorBoard's files go to.
    folder = model_dir if write_train else os.path.join(output_dir, "eval")
    params = {
        k: v if isinstance(v, (int, float, str)) else repr(v) for k, v in flat(settings).items()
    }
    if write_train or write_eval:
        built = loggers.build(settings.features.loggers, folder, training=write_train)
        records = loggers.Records(built, folder, params)
    train.metrics = records if write_train else None
    evaluation.metrics = records if write_eval else None
    return SummaryManagers(train=train, eval=evaluation)


def build_eval_input(task: Any, strategy: Any, global_batch_size: int, eval_steps: int | None):
    """The validation dataset, or a dict `{name: dataset}` of validation sets, each checked to
    end (or to have `eval_steps`) and to have a batch. Eager."""
    datasets = eval_inputs.eval_datasets(task, strategy, global_batch_size)
    if not isinstance(datasets, dict):
        preflight.check_finite_eval(task, datasets, eval_steps)
        return datasets
    for name, dataset in datasets.items():
        try:
            preflight.check_finite_eval(task, dataset, eval_steps)
        except ConfigError as e:
            raise ConfigError(f"validation set {name!r}: {e}") from None
    return datasets


def build_trainer(
    task: Any,
    strategy: Any,
    objects: RunObjects,
    settings: Settings,
    *,
    train_input: Any,
    eval_dataset: Any,
    callbacks: Any,
) -> TaskTrainer:
    """The step and the trainer (a `ParameterServerTrainer` under parameter_server) over
    `train_input` (None: no training) and `eval_dataset`; for the `callbacks` (a
    `CallbackAction`), it keeps each loop's logs for deferred ones and the due steps' tensors for
    those marked `with_step_tensors` (`kept_step`). Eager."""
    loop = settings.loop
    ps = cluster.is_parameter_server(strategy)
    per_replica = loop.global_batch_size // strategy.num_replicas_in_sync
    loss_fn = loss_share.for_steps(task, strategy, objects, train_input, eval_dataset, per_replica)
    stepping = dataclasses.replace(objects, loss_fn=loss_fn)  # the steps' loss
    step = TrainStep(stepping, loop.gradient_accumulation_steps, loop.jit_compile)
    trainer_cls = ParameterServerTrainer if ps else TaskTrainer
    record_history = callbacks.has_deferred
    trainer = trainer_cls(
        objects=stepping,
        step=step,
        train_iterator=train_input.iterator if train_input is not None else None,
        eval_dataset=eval_dataset,
        use_tf_while_loop=loop.use_tf_while_loop and not loop.run_eagerly,  # no graph at all
        record_history=record_history and not ps,
    )
    if callbacks.asks_step_tensors and not ps:
        trainer.kept = KeptStep(trainer, callbacks.tensors_due)
    return trainer
