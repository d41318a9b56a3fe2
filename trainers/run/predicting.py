"""`--mode=predict`: a checkpoint's model over the Task's prediction input, on every replica and
worker, its outputs written as they come (`state.predictions`), exactly once across kills.

Each worker builds `build_predict_inputs` for its input pipeline; each step runs `predict_step`
on every replica's batch (a replica past the input's end gets an empty one, so nothing is
padded), and the replicas' outputs join in replica order, the input's order. Every
`steps_per_loop` steps the worker writes them as one shard; a rerun skips the batches its
shards hold. `read_predictions` returns them.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np
import tensorflow as tf

from orbitask.common import files
from orbitask.trainers.actions.preemption import PreemptionWatcher, stop_signals
from orbitask.trainers.distribution import cluster
from orbitask.trainers.engine import user_code
from orbitask.trainers.engine.inputs import checked_source, evaluation_dataset
from orbitask.trainers.errors import ConfigError
from orbitask.trainers.run import builders, folders, messages
from orbitask.trainers.run.settings import Settings
from orbitask.trainers.state import predictions


def predict(
    task: Any,
    model_dir: str,
    settings: Settings,
    checkpoint: str | None = None,
    output_dir: str | None = None,
    fast: bool = False,
) -> dict:
    """Predicts with `checkpoint` (None: the newest of `model_dir`) into
    `<output_dir or model_dir>/predictions/`; `fast` runs one step and writes nothing. With
    `settings.features.ema` set, the model predicts with the checkpoint's EMA averages, as
    evaluation and export do. Eager.

    Returns `{"predict": {"checkpoint", "step", "examples", "folder"}}` (`fast`: no folder).

    Raises:
      ConfigError: no checkpoint or one that does not fit (or holds no EMA averages where `ema`
        is set), an infinite input, outputs without a leading example dimension, a folder
        holding a prediction made with other settings.
    """
    # SIGTERM, Ctrl-C (the stop signals): stop after the next shard
    watcher = PreemptionWatcher(lambda: 0, signals=stop_signals(settings.checkpoints.stop_signals))
    with watcher:
        strategy = _strategy(settings)
        watcher.take_back(agree=cluster.signal_agreement(strategy, len(watcher.codes)))
        return _predict(task, model_dir, settings, strategy, watcher, checkpoint, output_dir, fast)


def _predict(task, model_dir, settings, strategy, watcher, checkpoint, output_dir, fast) -> dict:
    """`predict` on `strategy`, `watcher` stopping it between shards. Eager."""
    from orbitask.trainers.run.saved_model import restored_model

    chief = cluster.is_chief(strategy)
    if chief:
        messages.say(cluster.describe(strategy))
    if not fast:  # a read-only model directory needs --output_dir
        folders.check_model_dir(
            model_dir, output_dir or model_dir, False, "predict writes predictions/"
        )
    path = checkpoint or _newest(model_dir)
    batch = settings.loop.global_batch_size
    per_replica = batch // strategy.num_replicas_in_sync
    ema = settings.features.ema is not None  # as evaluation and export: the averages
    with strategy.scope():
        model, step = restored_model(
            task, path, ema, settings.features.mixed_precision, per_replica,
            unset_ema="unset orbitask.run_experiment.ema",
        )  # fmt: skip
    worker, workers = _worker()
    folder = os.path.join(output_dir or model_dir, predictions.FOLDER)
    facts = dict(
        checkpoint=os.path.basename(path), step=step, workers=workers, global_batch_size=batch
    )
    done = 0
    if not fast:
        files.makedirs(folder)
        if predictions.check_manifest(folder, facts) is not None:
            predictions.remove_partial(folder, worker)
            done = predictions.steps_done(folder, workers)
    dataset = _dataset(task, strategy, per_replica, skip=done)
    run = _step(task, strategy, model)
    with user_code.eagerly(settings.loop.run_eagerly):
        if fast:
            examples = _one_step(task, strategy, dataset, run, path, model_dir)
            return {"predict": {"checkpoint": path, "step": step, "examples": examples}}
        watcher.stopped = functools.partial(_stopped, folder, done)
        loop = functools.partial(_loop, task, strategy, dataset, run, folder, facts)
        examples = loop((worker, done), settings, watcher)
    if chief:
        before = f" after the {done} batches a run before wrote" if done else ""
        mine = " (this worker's share)" if workers > 1 else ""
        messages.say(
            f"predicted {examples:,} examples{mine}{before} with {os.path.basename(path)} (step "
            f"{step}) into {folder}; orbitask.read_predictions({output_dir or model_dir!r}) "
            "reads them"
        )
    return {"predict": {"checkpoint": path, "step": step, "examples": examples, "folder": folder}}


def _strategy(settings: Settings) -> tf.distribute.Strategy:
    """The run's strategy; parameter servers refused in one line. Eager."""
    strategy = builders.build_strategy(settings)
    if cluster.is_parameter_server(strategy):
        raise ConfigError(
            "--mode=predict does not run under strategy='parameter_server'; use 'mirrored' or "
            "'multi_worker_mirrored' (the same checkpoint restores there)."
        )
    return strategy


def _one_step(task, strategy, dataset, run, path: str, model_dir: str) -> int:
    """`fast_dev_run`: one prediction step, said in one line, nothing written; returns its
    examples. Eager."""
    outputs = _outputs(task, strategy, run(next(iter(dataset))))
    shapes = ", ".join(str(list(x.shape)) for x in tf.nest.flatten(outputs))
    messages.say(
        f"fast_dev_run: one prediction step ran with {os.path.basename(path)} (outputs "
        f"{shapes}); nothing was written to {model_dir}"
    )
    return len(_first(outputs))


def _loop(task, strategy, dataset, run, folder, facts, place, settings, watcher) -> int:
    """Runs every batch after the first `place[1]` steps, writing a shard each `steps_per_loop`
    steps, then asking `watcher` (every worker at the same step: a signal received anywhere
    stops them all there), and the worker's done mark at the end; returns this run's
    examples. Eager."""
    worker, step = place
    chief = cluster.is_chief(strategy)
    every, pending, start, examples = settings.loop.steps_per_loop, [], step, 0
    watcher.current_step = lambda: start  # the batches the shards hold
    for batch in dataset:
        outputs = _outputs(task, strategy, run(batch))
        if step == 0 and chief and not pending:
            predictions.write_manifest(folder, facts, outputs)
        pending.append(tf.nest.flatten(outputs))
        examples += len(_first(outputs))
        step += 1
        if step - start == every:
            _flush(folder, worker, start, pending)
            start, pending = step, []
            if settings.loop.progress and chief:
                messages.say(f"predicted {step} batches")
            watcher()
    if step == 0:
        raise ConfigError(
            f"{type(task).__name__}.build_predict_inputs gave no batch; return a dataset with "
            "at least one batch to predict."
        )
    if pending:
        _flush(folder, worker, start, pending)
    predictions.write_done(folder, worker, step)
    return examples


def _stopped(folder: str, before: int, name: str, written: int) -> str:
    """The line said when a signal stopped a prediction (`PreemptionWatcher.stopped`)."""
    return (
        f"{name} received: stopped with the predictions of {written} batches written "
        f"({written - before} by this run) into {folder}; run the same command again to "
        "predict the rest."
    )


def _flush(folder: str, worker: int, start: int, pending: list) -> None:
    leaves = [np.concatenate(column) for column in zip(*pending, strict=True)]
    predictions.write_shard(folder, worker, start, len(pending), leaves)


def _step(task: Any, strategy: tf.distribute.Strategy, model: Any):
    """The traced prediction step: `predict_step` on each replica's batch."""

    @tf.function(reduce_retracing=True)
    def run(batch):
        return strategy.run(task.predict_step, args=(batch, model))

    return run


def _outputs(task: Any, strategy: tf.distribute.Strategy, result: Any) -> Any:
    """The replicas' outputs of one step as one nest of NumPy arrays, joined in replica order.

    Raises:
      ConfigError: for an output without a leading example dimension shared by all outputs.
    """
    local = [
        tf.nest.map_structure(np.asarray, r) for r in strategy.experimental_local_results(result)
    ]
    for one in local:
        sizes = {x.shape[0] if x.ndim else None for x in tf.nest.flatten(one)}
        if len(sizes) != 1 or None in sizes:
            shapes = tf.nest.map_structure(lambda x: list(x.shape), one)
            raise ConfigError(
                f"{type(task).__name__}.predict_step returned {shapes}; return tensors whose "
                "first dimension is the batch's examples (one row each)."
            )
    return tf.nest.map_structure(lambda *xs: np.concatenate(xs), *local)


def _first(outputs: Any) -> np.ndarray:
    return tf.nest.flatten(outputs)[0]


def _dataset(task: Any, strategy: tf.distribute.Strategy, per_replica: int, skip: int):
    """The prediction input after its first `skip` steps: a dataset on one replica, else
    distributed (each worker's pipeline). Eager.

    Raises:
      ConfigError: for an infinite input.
    """

    def make(context: tf.distribute.InputContext) -> tf.data.Dataset:
        value = task.build_predict_inputs(per_replica, context)
        dataset = evaluation_dataset(checked_source(task, value, per_replica), context)
        if dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
            raise ConfigError(
                f"{type(task).__name__}.build_predict_inputs returned an infinite dataset; "
                "prediction runs over its input once: return a finite one (no .repeat())."
            )
        local = context.num_replicas_in_sync // context.num_input_pipelines
        return dataset.skip(skip * local)

    if strategy.num_replicas_in_sync == 1:
        with tf.device("/cpu:0"):
            return make(tf.distribute.InputContext(1, 0, 1))
    options = tf.distribute.InputOptions(experimental_fetch_to_device=True)
    return strategy.distribute_datasets_from_function(make, options)


def _worker() -> tuple[int, int]:
    """`(this worker's input pipeline, workers)`: the chief first, then the workers."""
    spec = cluster.tf_config()
    jobs = spec.get("cluster", {})
    chiefs, workers = len(jobs.get("chief", [])), len(jobs.get("worker", []))
    if not chiefs + workers:
        return 0, 1
    task = spec.get("task", {})
    index = int(task.get("index", 0)) + (chiefs if task.get("type") == "worker" else 0)
    return index, chiefs + workers


def _newest(model_dir: str) -> str:
    path = tf.train.latest_checkpoint(model_dir) if tf.io.gfile.isdir(model_dir) else None
    if path is None:
        raise ConfigError(
            f"no checkpoint in {model_dir!r} to predict with; train first, or pass the "
            "--model_dir you trained into (or --checkpoint)."
        )
    return path
