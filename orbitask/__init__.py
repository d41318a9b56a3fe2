"""orbitask: TensorFlow 2 custom training loops. Subclass one `Task`, call `run_experiment`.

    from orbitask import Task, run_experiment

The package's parts live in `orbitask.tasks` (the Task contract, the seed-style adapter, built-in
tasks) and `orbitask.trainers` (the Orbit trainer, the experiment runner, the binary). Importing
the package changes nothing and imports little: each public name loads its module on first use.
"""

import importlib

from orbitask import tasks as _tasks
from orbitask import trainers as _trainers

__all__ = sorted([*_tasks.__all__, *_trainers.__all__])


def __getattr__(name: str):
    """Returns a public name of orbitask.tasks or orbitask.trainers, imported on first use."""
    for package in (_tasks, _trainers):
        if name in package.__all__:
            value = getattr(package, name)
            globals()[name] = value
            return value
    raise AttributeError(f"module 'orbitask' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def load_all() -> None:
    """Imports every public name's module, which registers their gin configurables. Eager."""
    for name in __all__:
        getattr(importlib.import_module("orbitask"), name)
