"""Where the default step's cost over the hand-written loop sits: its parts, one process.

    .venv/bin/python benchmarks/step_parts.py [--workload mlp] [--rounds 300]

One process builds the hand-written loop (`contenders.reference_loop`) and a default orbitask
run with its callbacks and progress off (`overhead.build_orbitask`), and times, on ONE iterator
that all of them read, `--steps_per_call` steps a call of:

- the hand-written loop (the reference);
- the same loop training the orbitask run's own model and optimizer objects;
- the Task's own step alone: `strategy.run` of the default `train_step` (`task_train_step`) in a
  `tf.range` loop written as the reference's;
- orbitask's `TrainStep` (the batches handed to the replicas, the step, the replica mean of the
  logs, the step counter) in the same loop;
- orbitask's device-loop function, as a run calls it;

and then, each on an iterator of its own, the input's part: the device-loop function on the
run's own training iterator (its final prefetch bounded, its shuffle seeds kept) and
the hand-written loop on the workload's pipeline with that bound's fixed prefetch.

Each round calls every variant once, in a shuffled order; a figure is the median over rounds of
reference time / its time, with a 95% bootstrap interval. Each part's cost is the difference
between neighbouring lines.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def variants(workload, steps_per_call: int, model_dir: str) -> dict:
    """The timed calls by name, the reference first. Eager."""
    import tensorflow as tf

    from benchmarks import contenders, overhead, workloads
    from orbitask.trainers.engine import steps

    num_steps = tf.constant(steps_per_call)
    reference, shared = contenders.reference_loop(workload, replicas=1)
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
        controller = overhead.build_orbitask(workload, steps_per_call, model_dir, quiet=True)
    trainer = controller.trainer
    own = trainer._iterator  # noqa: SLF001
    depth = contenders.orbitask_depth(workload, replicas=1)
    bounded = iter(workloads.dataset(workload.name, workload.global_batch, prefetch=depth))
    trainer.set_train_iterator(shared)
    loop_fn = trainer._loop_fn  # noqa: SLF001
    objects, step = trainer.objects, trainer.step
    replica_step = steps.task_train_step(objects)

    def looped(one_step):
        @tf.function
        def loop(iterator, num):
            logs = one_step(iterator)
            for _ in tf.range(num - 1):
                logs = one_step(iterator)
            return logs["loss"]

        return loop

    task_loop = looped(lambda it: objects.strategy.run(replica_step, args=(next(it),)))
    step_loop = looped(step)
    built = (objects.strategy, objects.model, objects.optimizer)
    same_objects, _ = contenders.reference_loop(workload, replicas=1, built=built)
    return {
        "hand-written loop (reference)": lambda: float(reference(shared, num_steps)),
        "its step on orbitask's model and optimizer": lambda: float(
            same_objects(shared, num_steps)
        ),
        "the Task's train_step under strategy.run": lambda: float(task_loop(shared, num_steps)),
        "+ TrainStep (batches, replica mean, step)": lambda: float(step_loop(shared, num_steps)),
        "+ the device-loop function": lambda: float(loop_fn(shared, num_steps)["logs"]["loss"]),
        "the device-loop function, its own iterator": lambda: float(
            loop_fn(own, num_steps)["logs"]["loss"]
        ),
        "hand-written loop, orbitask's prefetch bound": lambda: float(
            reference(bounded, num_steps)
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="mlp", choices=["mlp", "cnn"])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--steps_per_call", type=int, default=100)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from benchmarks import overhead, workloads

    workload = workloads.WORKLOADS[args.workload]
    with tempfile.TemporaryDirectory() as model_dir:
        calls = variants(workload, args.steps_per_call, model_dir)
        times = overhead.measure(calls, args.rounds)
    k = args.steps_per_call
    print(
        f"{args.workload}: {args.rounds} rounds of {k} steps per variant, one shared iterator "
        "(the last two: their own)"
    )
    print(f"{'variant':40s} {'median':>13s}  ratio (95% interval)  cost")
    print("\n".join(overhead.report(times, k)))
    base = statistics.median(times[next(iter(times))])
    print(f"reference: {base / k * 1e6:.1f} us/step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
