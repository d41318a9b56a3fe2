"""What the check of the training pipeline for stateful random ops costs as in-memory data grows.

    .venv/bin/python benchmarks/input_checks.py [--sizes_mib 64,512,2400]

Before step 1 a run names the stateful random ops of its training pipeline
(`trainers/state/random_state.unsaved_input_draws`). For a `from_tensor_slices` source of each
size (float32 zeros, rows of 4 KiB) mapped by a function drawing with `tf.random.uniform`, it
times that check, which reads the pipeline's traced functions, and a serialization of the
pipeline's graph (`trainers/data_compat.dataset_graph_def`, which holds the source's data), and
reads how far each raised the process's peak resident memory (VmHWM, reset before each through
`/proc/self/clear_refs`). Linux only.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _memory_mib(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def measured(check, dataset) -> tuple[float, float, object]:
    """`(seconds, peak MiB above the resident memory before, result)` of `check(dataset)`."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # VmHWM := VmRSS
    before = _memory_mib("VmRSS")
    start = time.perf_counter()
    result = check(dataset)
    return time.perf_counter() - start, _memory_mib("VmHWM") - before, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes_mib", default="64,512,2400")
    args = parser.parse_args(argv)
    import numpy as np
    import tensorflow as tf

    from orbitask.trainers import data_compat
    from orbitask.trainers.state import random_state

    def jitter(x):
        return x + tf.random.uniform([])

    def serialized_ops(dataset):
        graph_def = data_compat.dataset_graph_def(dataset)
        return sorted(
            {n.op for f in graph_def.library.function for n in f.node_def} & {"RandomUniform"}
        )

    print(
        "| source MiB | check s | check peak MiB | check names | serialize s "
        "| serialize peak MiB | serialized graph holds |"
    )
    print("|---|---|---|---|---|---|---|")
    for mib in (int(s) for s in args.sizes_mib.split(",")):
        data = np.zeros((mib * 256, 1024), np.float32)
        dataset = tf.data.Dataset.from_tensor_slices(data).map(jitter).batch(32)
        check = measured(random_state.unsaved_input_draws, dataset)
        whole = measured(serialized_ops, dataset)
        print(
            f"| {mib} | {check[0]:.3f} | {check[1]:.0f} | {', '.join(check[2]) or 'nothing'} "
            f"| {whole[0]:.3f} | {whole[1]:.0f} | {', '.join(whole[2]) or 'nothing'} |",
            flush=True,
        )
        del dataset, data
    return 0


if __name__ == "__main__":
    sys.exit(main())
