"""How big orbitask's checkpoints get over a run, for an autotuned vs a fixed prefetch buffer.

    .venv/bin/python benchmarks/checkpoint_growth.py [--workload input] [--steps 1500]

The checkpoint holds the input position as the saved `tf.data` iterator, buffers included. An
autotuned `prefetch(tf.data.AUTOTUNE)` doubles its buffer whenever the training loop finds it
empty (most often when input-bound), up to tf.data's RAM budget, and every checkpoint saves the
whole buffer (tf.data's symbolic checkpointing leaves it out but slows the pipeline 5x, see
trainers/inputs.py). orbitask replaces a final `prefetch(tf.data.AUTOTUNE)` by
`prefetch(Task.train_prefetch)` (4); `train_prefetch=None` keeps the autotuned buffer. Prints
the size of every kept checkpoint for: the autotuned buffer kept, the same pipeline with
orbitask's default, and a pipeline written with `prefetch(2)` (default configuration but a
checkpoint every 100 steps, callbacks off so the output stays short).
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
    """Sizes of the kept checkpoints, oldest first, in KiB."""
    import tensorflow as tf

    state = tf.train.get_checkpoint_state(model_dir)
    paths = state.all_model_checkpoint_paths if state else []
    return [
        int(sum(tf.io.gfile.stat(f).length for f in tf.io.gfile.glob(p + ".*")) / 1024)
        for p in paths
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="input", choices=["mlp", "cnn", "input"])
    parser.add_argument("--steps", type=int, default=1500)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from benchmarks import workloads
    from benchmarks.bench_task import BenchTask
    from trainers import run_experiment

    batch = workloads.WORKLOADS[args.workload].global_batch
    settings = (
        ("prefetch(AUTOTUNE), train_prefetch=None", tf.data.AUTOTUNE, {"train_prefetch": None}),
        ("prefetch(AUTOTUNE), default train_prefetch", tf.data.AUTOTUNE, {}),
        ("prefetch(2)", 2, {}),
    )
    for label, prefetch, task_kwargs in settings:
        task = BenchTask(
            args.workload,
            lambda: None,
            [],
            callbacks=False,
            prefetch=prefetch,
            **task_kwargs,
        )
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
                    progress=False,
                )
            seconds = time.perf_counter() - started
            sizes = sizes_kib(model_dir)
        print(
            f"{args.workload}, {label}: {args.steps} steps in {seconds:.0f} s; checkpoint KiB "
            f"every 100 steps: {' '.join(map(str, sizes))}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
