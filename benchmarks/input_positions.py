"""What saving the input position costs, by input style, for a Model-Garden-style image pipeline.

    .venv/bin/python benchmarks/input_positions.py [--records 2000] [--quick]

It writes N JPEG records of ~30 KiB (160x160 noise around one image) as a TFRecord and as one
file per example, then measures:

- `tf.data` shuffle input (TFRecord, `repeat().shuffle(S)`, parse, decode, resize to 128x128,
  batch 32, `prefetch(2)`), for S in 100, 1000, 10000: the bytes and the save time of its
  iterator (what orbitask writes per worker under `input/`; the shuffle buffer filled first),
  and the restore time; medians of 3 saves;
- `orbitask.IndexedInput.from_files` over the same images: the bytes of its saved record (the
  checkpoint's `input_position` string) and the time `serialize` takes;
- the input work of one worker of 2 against one process feeding both replicas: process CPU
  seconds to produce the same number of steps of an `IndexedInput` pipeline (worker 0 of 2
  reads its replica's batches; one process reads both).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BATCH, SIZE, OUT = 32, 160, 128


def write_images(folder: str, count: int) -> tuple[str, list[str], list[int], float]:
    """Writes `count` JPEGs as a TFRecord and as files; returns (record file, paths, labels,
    mean record KiB)."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.RandomState(0)
    base = rng.randint(0, 255, (SIZE, SIZE, 3)).astype(np.int64)
    record_file, paths, labels, sizes = os.path.join(folder, "data.tfrecord"), [], [], []
    with tf.io.TFRecordWriter(record_file) as writer:
        for i in range(count):
            image = np.clip(base + rng.randint(-40, 40, base.shape), 0, 255).astype(np.uint8)
            data = tf.io.encode_jpeg(image, quality=95).numpy()
            label = int(rng.randint(10))
            feature = {
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            }
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writer.write(example.SerializeToString())
            path = os.path.join(folder, f"{i}.jpg")
            with open(path, "wb") as f:
                f.write(data)
            paths.append(path)
            labels.append(label)
            sizes.append(len(data))
    return record_file, paths, labels, statistics.mean(sizes) / 1024


def decode(image, label):
    import tensorflow as tf

    return tf.image.resize(tf.io.decode_jpeg(image, channels=3), [OUT, OUT]) / 255.0, label


def shuffle_pipeline(record_file: str, buffer: int):
    import tensorflow as tf

    features = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(serialized):
        parsed = tf.io.parse_single_example(serialized, features)
        return decode(parsed["image"], parsed["label"])

    ds = tf.data.TFRecordDataset(record_file).repeat().shuffle(buffer, seed=1)
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(BATCH, drop_remainder=True).prefetch(2)


def position_cost(iterator, folder: str) -> tuple[int, float, float]:
    """(bytes, median save seconds, median restore seconds) of `iterator`'s saved state."""
    import tensorflow as tf

    saves, restores, size = [], [], 0
    for i in range(3):
        prefix = os.path.join(folder, f"position-{i}")
        start = time.perf_counter()
        tf.train.Checkpoint(iterator=iterator).write(prefix)
        saves.append(time.perf_counter() - start)
        size = sum(tf.io.gfile.stat(p).length for p in tf.io.gfile.glob(prefix + "*"))
        start = time.perf_counter()
        tf.train.Checkpoint(iterator=iterator).read(prefix).assert_consumed()
        restores.append(time.perf_counter() - start)
        for p in tf.io.gfile.glob(prefix + "*"):
            tf.io.gfile.remove(p)
    return size, statistics.median(saves), statistics.median(restores)


def indexed_record(paths, labels) -> tuple[int, float]:
    """(bytes, seconds) of an IndexedInput's saved record at step 100000."""
    import tensorflow as tf

    from orbitask import IndexedInput
    from orbitask.trainers.state.input_position import IndexedTrainInput

    source = IndexedInput.from_files(paths, labels, BATCH, map_fn=lambda x: decode(*x), seed=1)
    step = tf.Variable(100_000, dtype=tf.int64)
    position = IndexedTrainInput(step, BATCH, lambda start: None, source)
    start = time.perf_counter()
    text = position.serialize()
    return len(text.encode()), time.perf_counter() - start


def worker_cpu(paths, labels, steps: int) -> tuple[float, float]:
    """Process CPU seconds for `steps` steps of 2 replicas: one process, then worker 0 of 2."""
    from orbitask import IndexedInput

    source = IndexedInput.from_files(paths, labels, BATCH, map_fn=lambda x: decode(*x), seed=1)
    seconds = []
    for pipelines, local in ((1, 2), (2, 1)):
        iterator = iter(source.training_dataset(0, 0, pipelines, local))
        for _ in range(5):
            next(iterator)
        start = time.process_time()
        for _ in range(steps * local):
            next(iterator)
        seconds.append(time.process_time() - start)
    return seconds[0], seconds[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--buffers", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--quick", action="store_true", help="300 records, buffers 100 and 200")
    args = parser.parse_args(argv)
    if args.quick:
        args.records, args.buffers = 300, [100, 200]

    with tempfile.TemporaryDirectory() as folder:
        record_file, paths, labels, kib = write_images(folder, args.records)
        print(f"{args.records} JPEG records of {kib:.1f} KiB on average, batches of {BATCH}")
        print("| input | saved position | save s | restore s |")
        print("|---|---|---|---|")
        for buffer in args.buffers:
            iterator = iter(shuffle_pipeline(record_file, buffer))
            for _ in range(buffer // BATCH + 4):  # fills the shuffle buffer
                next(iterator)
            size, save, restore = position_cost(iterator, folder)
            print(
                f"| tf.data shuffle({buffer}) | {size / 2**20:.1f} MiB | {save:.3f} | "
                f"{restore:.3f} |",
                flush=True,
            )
        size, seconds = indexed_record(paths, labels)
        print(f"| IndexedInput | {size} bytes | {seconds:.6f} | (rebuilds the pipeline) |")
        steps = 20 if args.quick else 100
        one, worker = worker_cpu(paths, labels, steps)
        print(
            f"input CPU for {steps} steps of 2 replicas: one process {one:.2f} s, worker 0 of 2 "
            f"{worker:.2f} s ({worker / one:.2f} of it)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
