"""The `orbitask` console script: `orbitask [train flags]` runs the training binary."""

from __future__ import annotations

import sys

from trainers import train


def run() -> None:
    """Entry point of the `orbitask` command; same as `python -m trainers.train`."""
    sys.exit(train.main(sys.argv[1:]))
