"""Three ways to shuffle an image dataset for training, by throughput and saved position.

    .venv/bin/python -m pip install grain   # only this benchmark needs it
    .venv/bin/python benchmarks/grain_comparison.py

2000 JPEG records of ~30 KiB (160x160, decoded and resized to 128x128, batches of 32):
- tf.data: a TFRecord, `repeat().shuffle(1000)`, parse, decode (its position is its buffer);
- `orbitask.IndexedInput.from_files`: one file per example, read by index in a global shuffle
  (its position is a count of examples);
- Grain: `grain.MapDataset.source(...).seed(1).shuffle().repeat()` fed to tf.data through
  `from_generator` (its position is Grain's iterator state), decoded by tf.data.
Batches/s after warm-up, 3 interleaved rounds; the ratio to tf.data is the median per round.
"""

import json
import os
import tempfile
import time

import grain
import numpy as np
import tensorflow as tf

from orbitask import IndexedInput

N, SIZE, BATCH, OUT = 2000, 160, 32, 128
rng = np.random.RandomState(0)
tmp = tempfile.mkdtemp()
records, paths, labels = [], [], rng.randint(0, 10, N).astype(np.int32)
base = rng.randint(0, 255, (SIZE, SIZE, 3)).astype(np.uint8)
for i in range(N):
    img = np.clip(base.astype(int) + rng.randint(-40, 40, base.shape), 0, 255).astype(np.uint8)
    data = tf.io.encode_jpeg(img, quality=95).numpy()
    records.append(data)
    p = os.path.join(tmp, f"{i}.jpg")
    open(p, "wb").write(data)
    paths.append(p)
print("mean record KiB", np.mean([len(r) for r in records]) / 1024)
with tf.io.TFRecordWriter(os.path.join(tmp, "data.tfrecord")) as w:
    for r, label in zip(records, labels, strict=True):
        ex = tf.train.Example(
            features=tf.train.Features(
                feature={
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[r])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
                }
            )
        )
        w.write(ex.SerializeToString())


def decode(image, label):
    x = tf.image.resize(tf.io.decode_jpeg(image, channels=3), [OUT, OUT]) / 255.0
    return x, label


def tfdata():
    def parse(s):
        f = tf.io.parse_single_example(
            s,
            {
                "image": tf.io.FixedLenFeature([], tf.string),
                "label": tf.io.FixedLenFeature([], tf.int64),
            },
        )
        return f["image"], tf.cast(f["label"], tf.int32)

    ds = tf.data.TFRecordDataset(os.path.join(tmp, "data.tfrecord")).repeat().shuffle(1000, seed=1)
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).map(
        decode, num_parallel_calls=tf.data.AUTOTUNE
    )
    return iter(ds.batch(BATCH, drop_remainder=True).prefetch(2))


def indexed():
    src = IndexedInput.from_files(paths, labels, BATCH, map_fn=lambda item: decode(*item), seed=1)
    return iter(src.training_dataset(0, 0, 1, 1))


class Source:
    def __len__(self):
        return N

    def __getitem__(self, i):
        return records[i], labels[i]


grain_iters = {}


def grained():
    ds = grain.MapDataset.source(Source()).seed(1).shuffle().repeat()
    it = iter(ds.to_iter_dataset())
    grain_iters["it"] = it
    gen = tf.data.Dataset.from_generator(
        lambda: it, output_signature=(tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.int32))
    )
    return iter(
        gen.map(decode, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(BATCH, drop_remainder=True)
        .prefetch(2)
    )


def rate(make, n=150):
    it = make()
    for _ in range(20):
        next(it)
    t = time.perf_counter()
    for _ in range(n):
        next(it)
    return n / (time.perf_counter() - t)


results = {k: [] for k in ("tf.data shuffle(1000)", "IndexedInput files", "Grain MapDataset")}
for _ in range(3):
    results["tf.data shuffle(1000)"].append(rate(tfdata))
    results["IndexedInput files"].append(rate(indexed))
    results["Grain MapDataset"].append(rate(grained))
for k, v in results.items():
    print(f"{k}: {np.median(v):.1f} batches/s ({', '.join(f'{x:.1f}' for x in v)})")
for k, v in results.items():
    ratios = [a / b for a, b in zip(v, results["tf.data shuffle(1000)"], strict=True)]
    print(f"{k} / tf.data: {np.median(ratios):.2f}")
state = grain_iters["it"].get_state()
print("grain state bytes", len(json.dumps(state, default=str)), state)
