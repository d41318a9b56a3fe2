"""TensorBoard writing by value shape: scalars, images and histograms, nested dicts as subdirs.

`write` is the `summary_fn` of the train and eval `orbit.utils.SummaryManager`s, which already
turn nested dicts into sub-directories (Model Garden's behaviour); `histograms` is the callback
behind `run_experiment(histogram_interval=M)` (nabu's histograms of trainable variables).
"""

from __future__ import annotations

from typing import Any

import numpy as np
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
