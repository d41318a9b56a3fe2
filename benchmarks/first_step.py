"""Time to the first training step on a real Model Garden task: orbitask against Model Garden's
own `train_lib.run_experiment`, run unchanged.

    .venv/bin/python benchmarks/first_step.py [--rounds 3] [--model_id 18] [--size 64]

The task is Model Garden's registered `resnet_imagenet` experiment (ResNet-`model_id`, inputs of
`size` x `size`, 2 classes, batches of 8, a constant rate, its augmentation as registered) over
32 synthetic JPEGs. Each round runs each contender once, in an order shuffled by round, each in a
fresh process (imports done before the clock starts), training one step in mode `train` with a
checkpoint at its end: Model Garden's `train_lib.run_experiment` on `OneDeviceStrategy`, and
orbitask's `run_experiment` on the same task wrapped as it is (`ModelGardenTask`, every default,
`strategy = 'one_device'`, progress off). A figure is the wall time from the call to its return
(building, tracing, pre-flight checks, the step, the final checkpoint), the median over rounds, and
the number of function graphs traced (`FuncGraph`s created, counted in the benchmark only), with
the names of the distinct ones on `--graphs`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTENDERS = ("model_garden", "orbitask")


def _images(path: str, size: int) -> None:
    """32 JPEGs of `size + 8` pixels, labelled 0 and 1 in turn, as one TFRecord file."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.RandomState(0)
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(32):
            pixels = rng.randint(0, 256, size=(size + 8, size + 8, 3)).astype(np.uint8)
            feature = {
                "image/encoded": tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=[tf.io.encode_jpeg(pixels).numpy()])
                ),
                "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 2])),
            }
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writer.write(example.SerializeToString())


def _experiment(data: str, model_id: int, size: int):
    from official.core import exp_factory

    experiment = exp_factory.get_exp_config("resnet_imagenet")
    experiment.override(
        {
            "task": {
                "model": {
                    "num_classes": 2, "input_size": [size, size, 3],
                    "backbone": {"resnet": {"model_id": model_id}},
                },
                "train_data": {"input_path": data, "global_batch_size": 8,
                               "shuffle_buffer_size": 32, "cycle_length": 1},
                "validation_data": {"input_path": data, "global_batch_size": 8},
            },
            "trainer": {
                "train_steps": 1, "steps_per_loop": 1, "summary_interval": 1,
                "checkpoint_interval": 1, "validation_interval": 1,
                "optimizer_config": {
                    "learning_rate": {"type": "constant", "constant": {"learning_rate": 0.1}},
                    "warmup": {"type": None},
                },
            },
            "runtime": {"enable_xla": False},
        }
    )  # fmt: skip
    return experiment


def _one(contender: str, data: str, model_id: int, size: int, model_dir: str) -> dict:
    """In this process: one contender's one-step run. Returns its seconds and graphs."""
    import time

    import tensorflow as tf
    from official.core import train_lib
    from official.vision.tasks import image_classification
    from tensorflow.python.framework import func_graph

    from orbitask.tasks.model_garden import ModelGardenTask
    from orbitask.trainers import run_experiment

    names = []
    init = func_graph.FuncGraph.__init__

    def counted(self, name, *args, **kwargs):  # the benchmark's own count of traced graphs
        names.append(str(name))
        init(self, name, *args, **kwargs)

    func_graph.FuncGraph.__init__ = counted
    experiment = _experiment(data, model_id, size)
    start = time.perf_counter()
    if contender == "model_garden":
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
        with strategy.scope():
            task = image_classification.ImageClassificationTask(experiment.task)
        train_lib.run_experiment(strategy, task, "train", experiment, model_dir, save_summary=False)
    else:
        task = ModelGardenTask(image_classification.ImageClassificationTask(experiment.task),
                               experiment=experiment)  # fmt: skip
        run_experiment(task, model_dir, mode="train", train_steps=1, global_batch_size=8,
                       strategy="one_device", progress=False)  # fmt: skip
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "graphs": len(names), "names": names}


def _run(contender: str, data: str, args, folder: str) -> dict:
    model_dir = tempfile.mkdtemp(dir=folder)
    proc = subprocess.run(
        [sys.executable, __file__, "--one", contender, "--data", data,
         "--model_id", str(args.model_id), "--size", str(args.size), "--model_dir", model_dir],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if proc.returncode:
        raise SystemExit(f"{contender} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model_id", type=int, default=18)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--graphs", action="store_true", help="print the traced graphs' names")
    parser.add_argument("--one", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--model_dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.one:
        result = _one(args.one, args.data, args.model_id, args.size, args.model_dir)
        print(json.dumps(result))
        return
    with tempfile.TemporaryDirectory(prefix="first-step-") as folder:
        data = os.path.join(folder, "train.tfrecord")
        _images(data, args.size)
        results = {c: [] for c in CONTENDERS}
        for _ in range(args.rounds):
            for contender in random.sample(CONTENDERS, len(CONTENDERS)):
                results[contender].append(_run(contender, data, args, folder))
    seconds = {c: statistics.median(r["seconds"] for r in results[c]) for c in CONTENDERS}
    print(f"ResNet-{args.model_id}, {args.size}x{args.size}, batch 8, {args.rounds} rounds")
    print("| contender | seconds to the first step (median) | min-max | graphs traced |")
    print("|---|---|---|---|")
    for c in CONTENDERS:
        runs = [r["seconds"] for r in results[c]]
        graphs = results[c][-1]["graphs"]
        print(f"| {c} | {seconds[c]:.2f} | {min(runs):.2f}-{max(runs):.2f} | {graphs} |")
    print(f"orbitask / model_garden: {seconds['orbitask'] / seconds['model_garden']:.2f}")
    if args.graphs:
        for c in CONTENDERS:
            print(f"{c}: {sorted(results[c][-1]['names'])}")


if __name__ == "__main__":
    main()
