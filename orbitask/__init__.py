"""orbitask: TensorFlow 2 custom training loops. Subclass one `Task`, call `run_experiment`.

    from orbitask import Task, run_experiment

The package's parts live in `orbitask.tasks` (the Task contract, the seed-style adapter, built-in
tasks) and `orbitask.trainers` (the Orbit trainer, the experiment runner, the binary). Importing
the package registers its gin configurables and changes nothing else.
"""

from orbitask.tasks import *  # noqa: F403
from orbitask.tasks import __all__ as _tasks_all
from orbitask.trainers import *  # noqa: F403
from orbitask.trainers import __all__ as _trainers_all

__all__ = [*_tasks_all, *_trainers_all]
