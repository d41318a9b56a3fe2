"""How long training stops for a checkpoint save, synchronous against async.

    .venv/bin/python benchmarks/checkpoint_stall.py [--rounds 2] [--quick]

The digits MLP with hidden layers of 5000 and 5000 units (25.4 M parameters: 102 MB of weights,
305 MB a checkpoint with Nadam's two slots) trains 100 steps of batch 64 with a checkpoint
every 20 steps (the last at step 100), once with `async_checkpoints=False` and once with
`True`, alternating, `--rounds` times each. The stall of a save is the wall time of the
runner's `manager.save` call on the training thread: the whole write when synchronous; the copy
to host memory (and any wait for the previous write) when async. The final wait for the last
async write is timed apart. `--quick`: hidden layers of 256 units, 40 steps, a save every 10.
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


def timed_run(model_dir: str, hidden: tuple, steps: int, every: int, asynchronous: bool):
    """Trains once; returns (save stalls in s, final wait in s, wall s, checkpoint MB)."""
    import tensorflow as tf

    from orbitask import DigitsClassification
    from orbitask.trainers.run import settings as run_settings
    from orbitask.trainers.run.runner import ExperimentRunner

    stalls, waits = [], []

    class Timed(ExperimentRunner):
        def build(self):
            super().build()
            manager = self.checkpointing.manager
            save, sync = manager.save, manager.sync

            def timed_save(*args, **kwargs):
                start = time.perf_counter()
                path = save(*args, **kwargs)
                stalls.append(time.perf_counter() - start)
                return path

            def timed_sync():
                start = time.perf_counter()
                sync()
                waits.append(time.perf_counter() - start)

            manager.save, manager.sync = timed_save, timed_sync

    settings = run_settings.Settings(
        loop=run_settings.LoopSettings(
            train_steps=steps, global_batch_size=64, steps_per_loop=every, loop_seconds=None,
            progress=False,
        ),
        checkpoints=run_settings.CheckpointSettings(
            checkpoint_interval=every, checkpoint_seconds=None, max_to_keep=2,
            async_checkpoints=asynchronous,
        ),
        evaluation=run_settings.EvalSettings(eval_interval=None),
        distribution=run_settings.DistributionSettings(strategy="one_device"),
    )  # fmt: skip
    task = DigitsClassification(hidden_units=hidden)
    start = time.perf_counter()
    Timed(task, model_dir, "train", settings).run()
    wall = time.perf_counter() - start
    latest = tf.train.latest_checkpoint(model_dir)
    assert latest and latest.endswith(f"-{steps}"), latest
    size = sum(os.path.getsize(p) for p in tf.io.gfile.glob(latest + ".*")) / 1e6
    return stalls, sum(waits), wall, size


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    hidden, steps, every = ((256, 256), 40, 10) if args.quick else ((5000, 5000), 100, 20)
    rounds = 1 if args.quick else args.rounds
    results: dict[bool, list] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as root:
        for r in range(rounds):
            for asynchronous in (False, True):
                folder = os.path.join(root, f"{r}-{'async' if asynchronous else 'sync'}")
                results[asynchronous].append(timed_run(folder, hidden, steps, every, asynchronous))
    size = results[False][0][3]
    flag = " --quick" if args.quick else f" --rounds {rounds}"
    print(f"checkpoint of {size:.1f} MB, a save every {every} of {steps} steps, {rounds} round(s)")
    print("| saves | stall per save, ms: median | max | final wait, ms | run wall, s |")
    print("|---|---|---|---|---|")
    for asynchronous, name in ((False, "sync"), (True, "async")):
        runs = results[asynchronous]
        stalls = [s * 1e3 for run in runs for s in run[0]]
        wait = statistics.median(run[1] * 1e3 for run in runs)
        wall = statistics.median(run[2] for run in runs)
        row = f"{statistics.median(stalls):.0f} | {max(stalls):.0f} | {wait:.0f} | {wall:.1f}"
        print(f"| {name} | {row} |")
    print(f"Command: `.venv/bin/python benchmarks/checkpoint_stall.py{flag}`")


if __name__ == "__main__":
    main()
