"""Errors raised by the train step, turned into what a user can act on.

A training dataset that ends before `train_steps` stops the run with one line naming the step and
the fix, after a checkpoint of the steps taken is saved. Any other TensorFlow error raised while a
device loop runs (a label out of range, a shape the model cannot take) keeps its traceback and
gains a note naming the global step it was raised at.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from orbitask.trainers.errors import ConfigError


@contextlib.contextmanager
def named_by_step(global_step: tf.Variable, manager: Any, train_steps: int) -> Iterator[None]:
    """While open, errors from the train and eval steps name the step. Eager; yields nothing.

    Raises:
      ConfigError: when the training dataset ended before `train_steps`; a checkpoint of the
        steps taken is saved first.
    """
    try:
        yield
    except tf.errors.OutOfRangeError as e:
        step = int(global_step.numpy())
        if manager is not None:
            manager.save(checkpoint_number=step, check_interval=False)
        raise ConfigError(
            f"the training dataset ended after step {step} of train_steps {train_steps}: "
            "build_inputs(training=True) must repeat forever (end it with .repeat()), or lower "
            f"train_steps. A checkpoint at step {step} was saved."
        ) from e
    except tf.errors.OpError as e:
        e.add_note(
            f"orbitask: raised while running the step after global step "
            f"{int(global_step.numpy())} ({type(e).__name__} from TensorFlow; the lines above "
            "name the op and its inputs)."
        )
        raise
