"""Tells the user's code from the framework's in an exception's traceback.

An exception raised in the user's own code (a Task's `__init__`, builders, stages, steps,
callbacks, a module a gin `import` line loads) keeps its type and traceback; a mistake the
framework finds (a binding, a setting, a batch that does not fit) is one line. The frames of
orbitask, gin, TensorFlow, Keras, NumPy, Orbit, Model Garden, absl and the standard library are
the framework's; any other frame is the user's. `eagerly` runs the user's stages as Python, to
debug them (`run_eagerly`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from types import FrameType

FRAMEWORK = frozenset(
    {"orbitask", "gin", "tensorflow", "keras", "tf_keras", "numpy", "orbit", "official", "absl"}
)


def _is_users(frame: FrameType) -> bool:
    # `__spec__` names a module run with `python -m` (whose `__name__` is "__main__").
    spec = frame.f_globals.get("__spec__")
    name = getattr(spec, "name", None) or frame.f_globals.get("__name__") or ""
    top = name.partition(".")[0]
    return top not in FRAMEWORK and top not in sys.stdlib_module_names


def _frames(error: BaseException) -> list[FrameType]:
    frames, tb = [], error.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def passed_through_users_code(error: BaseException) -> bool:
    """Returns whether any frame of `error`'s traceback is the user's code. Eager."""
    return any(_is_users(frame) for frame in _frames(error))


def raised_by_users_code(error: BaseException) -> bool:
    """Returns whether `error` was raised by a line of the user's code (its innermost frame);
    False for an error raised inside the framework's code that the user's code called. Eager."""
    frames = _frames(error)
    return bool(frames) and _is_users(frames[-1])


@contextlib.contextmanager
def eagerly(on: bool) -> Iterator[None]:
    """While open with `on`, every `tf.function` runs as Python (`run_eagerly`), said in one line;
    the previous setting comes back after. Eager; yields nothing."""
    if not on:
        yield
        return
    print(
        "orbitask: run_eagerly: the step and its stages run eagerly (print and breakpoint() work "
        "in them), many times slower than traced; for debugging",
        flush=True,
    )
    import tensorflow as tf

    before = tf.config.functions_run_eagerly()
    tf.config.run_functions_eagerly(True)
    try:
        yield
    finally:
        tf.config.run_functions_eagerly(before)
