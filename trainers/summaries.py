"""TensorBoard writing by value shape: scalars, images and histograms, nested dicts as subdirs.

`write` is the `summary_fn` of the train and eval `orbit.utils.SummaryManager`s, which already
turn nested dicts into sub-directories (Model Garden's behaviour); `histograms` is the callback
behind `run_experiment(histogram_interval=M)` (nabu's histograms of trainable variables).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orbit
import tensorflow as tf


def write(name: str, value: Any, step: Any = None) -> None:
    """Writes one summary, eagerly: rank 0 -> scalar, images -> image, else histogram.

    Images are `[N, H, W, C]` (or `[H, W, C]`) with C in 1, 3, 4.
    """
    array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    if array.ndim == 0:
        tf.summary.scalar(name, array, step=step)
    elif array.ndim in (3, 4) and array.shape[-1] in (1, 3, 4):
        images = array if array.ndim == 4 else array[None]
        if images.dtype != np.uint8:
            images = np.clip(images.astype(np.float32), 0.0, 1.0)
        tf.summary.image(name, images, step=step, max_outputs=8)
    else:
        tf.summary.histogram(name, array, step=step)


def histograms(task: Any, ctx: Any) -> None:
    """Callback (eager, on the host): a histogram of every trainable variable of the model(s)."""
    del task
    models = ctx.model.values() if isinstance(ctx.model, dict) else [ctx.model]
    for model in models:
        for variable in model.trainable_variables:
            name = getattr(variable, "path", None) or variable.name.split(":")[0]
            tf.summary.histogram(f"weights/{name}", variable, step=ctx.step)


class LoopSummaryManager(orbit.utils.SummaryManager):
    """The train `SummaryManager`: writes a device loop's output once per `interval` steps.

    The Controller writes every loop's output, and callbacks end loops early (`print_loss`
    every 10 steps by default); each eager scalar costs about a millisecond, so on a small model
    writing every loop cost more host time than the steps themselves (benchmarks/RESULTS.md).
    A loop's output is written when the loop reaches a new multiple of `interval` (and after
    the first loop); callbacks still write their own points, e.g. `print_loss`'s loss.
    """

    def __init__(self, summary_dir, summary_fn, global_step, interval: int):
        super().__init__(summary_dir, summary_fn, global_step)
        self.interval = interval
        self._written_block = None

    def write_summaries(self, summary_dict) -> None:
        block = int(self._global_step.numpy()) // self.interval
        if block != self._written_block:
            self._written_block = block
            super().write_summaries(summary_dict)
