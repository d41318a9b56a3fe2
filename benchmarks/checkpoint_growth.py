"""How big orbitask's checkpoints get over a run, for an autotuned vs a fixed prefetch buffer.

    .venv/bin/python benchmarks/checkpoint_growth.py [--workload input] [--steps 1500]

A checkpoint comes with the input position, the saved `tf.data` iterator (buffers included, under
`input/`; the script keeps one with every checkpoint). An
autotuned `prefetch(tf.data.AUTOTUNE)` doubles its buffer whenever the training loop finds it
empty (most often when input-bound), up to tf.data's RAM budget, and every checkpoint saves the
whole buffer (tf.data's symbolic checkpointing leaves it out but slows the pipeline 5x, see
trainers/engine/inputs.py). orbitask replaces a final `prefetch(tf.data.AUTOTUNE)` by
`prefetch(run_experiment.train_prefetch)` (4 steps' elements, at least 1 MiB of small ones);
`train_prefetch=None` keeps the autotuned buffer.
Prints the size of every kept checkpoint for: the autotuned buffer kept, the same pipeline with
orbitask's default, and a pipeline written with `prefetch(2)` (default configuration but a
checkpoint every 100 steps, callbacks off so the output stays short).

    .venv/bin/python benchmarks/checkpoint_growth.py --big_batches

instead saves the input position alone for batches of 32 and 128 random 224x224x3 float32
images (18.4 and 73.5 MiB) ending in `prefetch(AUTOTUNE)`: with orbitask's default (4 steps, at
most `run_experiment.train_prefetch_bytes` = 64 MiB of them, at least one) and without the
byte bound.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def sizes_kib(model_dir: str) -> list[int]:
    """Sizes of the kept checkpoints with their input positions (`input/ckpt-N/`), oldest
    first, in KiB."""
    import tensorflow as tf

    state = tf.train.get_checkpoint_state(model_dir)
    paths = state.all_model_checkpoint_paths if state else []
    sizes = []
    for path in paths:
        position = os.path.join(model_dir, "input", os.path.basename(path), "*")
        files = tf.io.gfile.glob(path + ".*") + tf.io.gfile.glob(position)
        sizes.append(int(sum(tf.io.gfile.stat(f).length for f in files) / 1024))
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="input", choices=["mlp", "cnn", "input"])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--big_batches", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.big_batches:
        return big_batches()
    import tensorflow as tf

    from benchmarks import workloads
    from benchmarks.bench_task import BenchTask
    from orbitask.trainers import run_experiment

    batch = workloads.WORKLOADS[args.workload].global_batch
    settings = (
        ("prefetch(AUTOTUNE), train_prefetch=None", tf.data.AUTOTUNE, {"train_prefetch": None}),
        ("prefetch(AUTOTUNE), default train_prefetch", tf.data.AUTOTUNE, {}),
        ("prefetch(2)", 2, {}),
    )
    for label, prefetch, run_kwargs in settings:
        task = BenchTask(args.workload, lambda: None, [], callbacks=False, prefetch=prefetch)
        with tempfile.TemporaryDirectory() as model_dir:
            started = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                run_experiment(
                    task=task,
                    model_dir=model_dir,
                    mode="train",
                    train_steps=args.steps,
                    global_batch_size=batch,
                    checkpoint_interval=100,
                    keep_input_positions=args.steps // 100,
                    progress=False,
                    **run_kwargs,
                )
            seconds = time.perf_counter() - started
            sizes = sizes_kib(model_dir)
        print(
            f"{args.workload}, {label}: {args.steps} steps in {seconds:.0f} s; checkpoint KiB "
            f"every 100 steps: {' '.join(map(str, sizes))}",
            flush=True,
        )
    return 0


def big_batches() -> int:
    """Prints the saved input position's size for big batches, with and without the byte bound.
    Eager."""
    import tensorflow as tf

    from orbitask.tasks import Task
    from orbitask.trainers.engine import inputs
    from orbitask.trainers.engine.prefetch import Prefetch

    class Images(Task):
        def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
            def image(i):
                return tf.random.stateless_uniform([224, 224, 3], seed=tf.stack([i, i]))

            images = tf.data.Dataset.range(10**6).map(image, num_parallel_calls=2)
            return images.batch(per_replica_batch_size).prefetch(tf.data.AUTOTUNE)

    settings = (("default (64 MiB)", 64 * 2**20), ("train_prefetch_bytes=None", None))
    for batch in (32, 128):
        for label, limit in settings:
            strategy = tf.distribute.get_strategy()
            bound = Prefetch(max_bytes=limit)
            iterator = inputs.train_iterator(Images(), strategy, batch, prefetch=bound)
            next(iterator)
            time.sleep(5)  # the prefetch thread fills its buffer
            with tempfile.TemporaryDirectory() as directory:
                started = time.perf_counter()
                path = tf.train.Checkpoint(iterator=iterator).write(os.path.join(directory, "c"))
                seconds = time.perf_counter() - started
                files = tf.io.gfile.glob(path + "*")
                mib = sum(tf.io.gfile.stat(f).length for f in files) / 2**20
            print(
                f"batches of {batch * 224 * 224 * 3 * 4 / 2**20:.1f} MiB, {label}: "
                f"input position {mib:.0f} MiB, saved in {seconds:.2f} s",
                flush=True,
            )
            del iterator
    return 0


if __name__ == "__main__":
    sys.exit(main())
