"""orbitask: TensorFlow 2 custom training loops. Subclass one `Task`, call `run_experiment`.

    from orbitask import Task, run_experiment

The package's parts live in `orbitask.tasks` (the Task contract, the seed-style adapter, built-in
tasks) and `orbitask.trainers` (the Orbit trainer, the experiment runner, the binary). Importing
the package changes nothing and imports little: each public name loads its module on first use.
"""

import importlib
from typing import TYPE_CHECKING

from orbitask import tasks as _tasks
from orbitask import trainers as _trainers

if TYPE_CHECKING:  # what editors and type checkers read; at runtime each name loads on first use
    from orbitask.tasks.base import Task as Task
    from orbitask.tasks.callbacks import CallbackContext as CallbackContext
    from orbitask.tasks.callbacks import deferred as deferred
    from orbitask.tasks.callbacks import print_loss as print_loss
    from orbitask.tasks.callbacks import print_step as print_step
    from orbitask.tasks.examples.digits import DigitsClassification as DigitsClassification
    from orbitask.tasks.examples.digits_cnn import DigitsCNN as DigitsCNN
    from orbitask.tasks.examples.digits_gan import DigitsGAN as DigitsGAN
    from orbitask.tasks.examples.digits_parity import DigitsParity as DigitsParity
    from orbitask.tasks.function_task import CallbackTask as CallbackTask
    from orbitask.tasks.indexed_input import IndexedInput as IndexedInput
    from orbitask.tasks.model_garden import ModelGardenTask as ModelGardenTask
    from orbitask.tasks.multi_task import MultiTask as MultiTask
    from orbitask.tasks.step_tensors import with_step_tensors as with_step_tensors
    from orbitask.trainers.commands.ray_train import run_on_ray as run_on_ray
    from orbitask.trainers.distribution.strategies import build_strategy as build_strategy
    from orbitask.trainers.distribution.strategies import logical_cpus as logical_cpus
    from orbitask.trainers.engine.task_trainer import TaskTrainer as TaskTrainer
    from orbitask.trainers.errors import ConfigError as ConfigError
    from orbitask.trainers.errors import Interrupted as Interrupted
    from orbitask.trainers.errors import NonFiniteLossError as NonFiniteLossError
    from orbitask.trainers.errors import Preempted as Preempted
    from orbitask.trainers.features.ema import ExponentialMovingAverage as ExponentialMovingAverage
    from orbitask.trainers.features.learning_rate import (
        learning_rate_schedule as learning_rate_schedule,
    )
    from orbitask.trainers.features.nan_guard import NanGuard as NanGuard
    from orbitask.trainers.features.validation_control import ValidationControl as ValidationControl
    from orbitask.trainers.features.warm_start import WarmStart as WarmStart
    from orbitask.trainers.run.experiment import run_experiment as run_experiment
    from orbitask.trainers.state.loggers import Logger as Logger
    from orbitask.trainers.state.predictions import read_predictions as read_predictions

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
