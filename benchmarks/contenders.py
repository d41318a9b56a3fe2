"""The contenders: one function per way of training a workload, each paced by a `Gate`.

Each `run_*` builds its model and input from `benchmarks.workloads`, trains `window` steps of
warm-up (tracing and compilation happen there), then `windows` timed windows of `window` steps,
calling `gate()` at every window boundary. `gate()` blocks until the harness lets this process
run its next window, so contenders in separate processes take turns (interleaved rounds) and a
window's time never includes another process's work. Each returns a dict of extra figures.

- `reference`: a hand-written `tf.function` running `steps_per_call` steps of `strategy.run` in a
  `tf.while_loop` (`for _ in tf.range(n)`), the update written out as orbitask's default step
  computes it (all-reduced gradient, NaN -> 0 when the global norm is NaN, global-norm clip,
  Nadam); it returns the last step's loss. One replica reads a plain `tf.data` iterator;
  several read `distribute_datasets_from_function`.
- `orbitask`: `run_experiment` with `configs/defaults.gin` (mode "train"); only the task, the
  global batch and, for several replicas, `strategy = 'mirrored'` are bound. Options turn the
  default callbacks and progress display off, periodic checkpoints off, XLA on, or keep the
  workload's `prefetch(AUTOTUNE)` (`train_prefetch = None`).
- `keras_fit`: `model.fit` of Keras 3 or tf_keras with `steps_per_execution`, `verbose=0`,
  `jit_compile=False`, Nadam with `global_clipnorm=10`.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable

import tensorflow as tf

from benchmarks import workloads

Gate = Callable[[], None]
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mirrored_or_one_device(replicas: int) -> tf.distribute.Strategy:
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    if replicas == 1:
        return tf.distribute.OneDeviceStrategy(cpus[0])
    return tf.distribute.MirroredStrategy(
        cpus[:replicas], cross_device_ops=tf.distribute.ReductionToOneDevice()
    )


def reference_loop(
    workload: workloads.Workload,
    replicas: int,
    built: tuple | None = None,
    prefetch: int | None = None,
) -> tuple[Callable, object]:
    """Builds the hand-written loop; returns `(train_loop, iterator)`. Eager.

    `train_loop(iterator, num_steps)` is a `tf.function` running `num_steps` steps and
    returning the last step's loss summed over replicas. `built`: `(strategy, model,
    optimizer)` built elsewhere (an orbitask run's) for the loop to train, else its own.
    `prefetch`: the batches its dataset prefetches (`workloads.dataset`; None: the workload's).
    """
    global_batch = workload.global_batch
    if built is not None:
        strategy, model, optimizer = built
    else:
        strategy = _mirrored_or_one_device(replicas)
        with strategy.scope():
            model = workloads.build_model(workload.name)
            optimizer = workloads.build_optimizer()
            optimizer.build(model.trainable_variables)
    if replicas == 1:
        # One device takes the batch as it is: a plain iterator skips the distributed
        # iterator's per-step work (~0.16 ms/step on the MLP), the fastest loop we know.
        iterator = iter(workloads.dataset(workload.name, global_batch, prefetch=prefetch))
    else:
        iterator = iter(
            strategy.distribute_datasets_from_function(
                lambda ctx: workloads.dataset(
                    workload.name, global_batch // replicas, ctx, prefetch=prefetch
                )
            )
        )

    def replica_step(batch):
        x, y = batch
        with tf.GradientTape() as tape:
            loss = workloads.sum_cross_entropy(y, model(x, training=True)) / global_batch
        grads = tape.gradient(loss, model.trainable_variables)
        context = tf.distribute.get_replica_context()
        if replicas > 1:
            grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        # NaN -> 0, written as orbitask's default does it: only when the norm says there is one.
        norm = tf.linalg.global_norm(grads)

        def zero_nans():
            fixed = [tf.where(tf.math.is_nan(g), tf.zeros_like(g), g) for g in grads]
            return fixed, tf.linalg.global_norm(fixed)

        grads, norm = tf.cond(tf.math.is_nan(norm), zero_nans, lambda: (grads, norm))
        grads, _ = tf.clip_by_global_norm(grads, workloads.CLIP_NORM, use_norm=norm)
        if replicas > 1:  # Keras 3 optimizers sum over replicas once more.
            grads = [g / replicas for g in grads]
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    def step(iterator):
        return strategy.run(replica_step, args=(next(iterator),))

    @tf.function
    def train_loop(iterator, num_steps):
        per_replica = step(iterator)
        for _ in tf.range(num_steps - 1):
            per_replica = step(iterator)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return train_loop, iterator


def orbitask_depth(workload: workloads.Workload, replicas: int) -> int:
    """The depth of the fixed prefetch orbitask's default bound gives the workload's training
    pipeline (`trainers/engine/prefetch.py`), in elements of one replica's batch. Eager."""
    from orbitask.trainers.engine import prefetch

    spec = workloads.dataset(workload.name, workload.global_batch // replicas).element_spec
    size = prefetch.element_bytes(spec, workload.global_batch // replicas)
    bound = prefetch.DEFAULT_PREFETCH
    wanted = prefetch.wanted_elements(size, replicas, bound)
    return prefetch.prefetch_depth(size, wanted, replicas, bound.max_bytes)


def run_reference(
    workload: workloads.Workload,
    replicas: int,
    gate: Gate,
    windows: int,
    steps_per_call: int,
    prefetch: int | None = None,
) -> dict:
    """The hand-written loop: `steps_per_call` steps per `tf.function` call. Eager driver."""
    train_loop, iterator = reference_loop(workload, replicas, prefetch=prefetch)
    calls = workload.window // steps_per_call
    num_steps = tf.constant(steps_per_call)
    for _ in range(windows + 1):
        for _ in range(calls):
            loss = float(train_loop(iterator, num_steps))  # a real loop looks at its loss
        gate()
    return {"final_loss": loss}


def run_orbitask(
    workload: workloads.Workload,
    replicas: int,
    gate: Gate,
    windows: int,
    callbacks: bool = True,
    jit_compile: bool = False,
    checkpoints: bool = True,
    keep_autotune: bool = False,
    fixed_loops: bool = False,
) -> dict:
    """`run_experiment` with `configs/defaults.gin`; returns checkpoint sizes. Eager.

    `fixed_loops`: loops stay at `steps_per_loop` (`loop_seconds = None`)."""
    import gin

    from benchmarks.bench_task import BenchTask
    from orbitask.trainers import run_experiment
    from orbitask.trainers.commands.train import parse_gin

    bindings = [
        f"TRAIN_STEPS = {workload.window * (windows + 1)}",
        f"orbitask.run_experiment.global_batch_size = {workload.global_batch}",
    ]
    if replicas > 1:
        bindings.append("orbitask.run_experiment.strategy = 'mirrored'")
    if not callbacks:
        bindings.append("orbitask.run_experiment.progress = False")
    if jit_compile:
        bindings.append("orbitask.run_experiment.jit_compile = True")
    if not checkpoints:  # saved once, at the end
        bindings.append("orbitask.run_experiment.checkpoint_seconds = None")
    if keep_autotune:  # the workload's prefetch(AUTOTUNE) stays
        bindings.append("orbitask.run_experiment.train_prefetch = None")
    if fixed_loops:
        bindings.append("orbitask.run_experiment.loop_seconds = None")
    parse_gin([os.path.join(REPO_ROOT, "configs", "defaults.gin")], bindings)
    boundaries = [workload.window * (k + 1) for k in range(windows + 1)]
    task = BenchTask(workload.name, gate, boundaries, callbacks=callbacks)
    saves = _time_checkpoint_saves()
    with tempfile.TemporaryDirectory(prefix="orbitask-bench-") as model_dir:
        logs = run_experiment(task=task, model_dir=model_dir, mode="train")
        sizes = _checkpoint_sizes(model_dir)
    gin.clear_config()
    timed = [seconds for start, seconds in saves if gate.in_window(start)]
    return {
        "final_loss": float(logs["train"]["loss"]),
        "ckpt_first_kb": sizes[0] if sizes else None,
        "ckpt_last_kb": sizes[-1] if sizes else None,
        "ckpts_kept": len(sizes),
        "ckpt_save_ms": 1000 * statistics.median(timed) if timed else None,
        "ckpt_share": sum(timed) / gate.timed_seconds() if timed else 0.0,
    }


def _time_checkpoint_saves() -> list[tuple[float, float]]:
    """Makes every `CheckpointManager.save` in this process record `(start, seconds)`."""
    records: list[tuple[float, float]] = []
    save = tf.train.CheckpointManager.save

    def timed_save(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return save(self, *args, **kwargs)
        finally:
            records.append((start, time.perf_counter() - start))

    tf.train.CheckpointManager.save = timed_save
    return records


def _checkpoint_sizes(model_dir: str) -> list[float]:
    """Sizes (KiB) of the kept checkpoints, oldest first."""
    manager_state = tf.train.get_checkpoint_state(model_dir)
    paths = list(manager_state.all_model_checkpoint_paths) if manager_state else []
    sizes = []
    for prefix in paths:
        files = tf.io.gfile.glob(prefix + ".*")
        sizes.append(sum(tf.io.gfile.stat(f).length for f in files) / 1024)
    return sizes


def run_keras_fit(
    workload: workloads.Workload,
    replicas: int,
    gate: Gate,
    windows: int,
    flavour: str,
    steps_per_execution: int,
) -> dict:
    """`model.fit` with one epoch per window; the gate runs at each epoch end. Eager."""
    if flavour == "tf_keras":
        import tf_keras as k
    else:
        import keras as k

    strategy = _mirrored_or_one_device(replicas) if replicas > 1 else tf.distribute.get_strategy()
    with strategy.scope():
        model = workloads.build_model(workload.name, flavour)
        model.compile(
            optimizer=workloads.build_optimizer(flavour, global_clipnorm=workloads.CLIP_NORM),
            loss=k.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=steps_per_execution,
            jit_compile=False,
        )

    class GateCallback(k.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            gate()

    history = model.fit(
        workloads.dataset(workload.name, workload.global_batch),
        epochs=windows + 1,
        steps_per_epoch=workload.window,
        callbacks=[GateCallback()],
        verbose=0,
    )
    return {"final_loss": float(history.history["loss"][-1])}
