"""The private Orbit, Keras, tf.data and gin behaviour orbitask relies on, in one place.

Each function here names what it reaches into; tests/test_compat.py fails loudly when a new
version of a library changes it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import orbit.controller
from absl import logging


@contextlib.contextmanager
def orbit_messages_to_absl() -> Iterator[None]:
    """While open, Orbit's controller messages go to the absl log instead of stdout. Eager.

    `orbit.controller._log` prints a line after every evaluation and restore; the progress
    display replaces it. Yields nothing; restores Orbit's function on exit.
    """
    original = orbit.controller._log  # noqa: SLF001
    orbit.controller._log = logging.info  # noqa: SLF001
    try:
        yield
    finally:
        orbit.controller._log = original  # noqa: SLF001
