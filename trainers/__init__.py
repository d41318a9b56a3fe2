"""orbitask trainers: the Orbit trainer/evaluator, strategies and the experiment runner."""

from typing import TYPE_CHECKING

from orbitask.lazy import exports

if TYPE_CHECKING:  # what editors and type checkers read; at runtime each name loads on first use
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

__all__, __getattr__, __dir__ = exports(
    __name__,
    {  # public name -> the module defining it, imported on first use
        "build_strategy": "orbitask.trainers.distribution.strategies",
        "ConfigError": "orbitask.trainers.errors",
        "ExponentialMovingAverage": "orbitask.trainers.features.ema",
        "Interrupted": "orbitask.trainers.errors",
        "learning_rate_schedule": "orbitask.trainers.features.learning_rate",
        "Logger": "orbitask.trainers.state.loggers",
        "logical_cpus": "orbitask.trainers.distribution.strategies",
        "NanGuard": "orbitask.trainers.features.nan_guard",
        "NonFiniteLossError": "orbitask.trainers.errors",
        "Preempted": "orbitask.trainers.errors",
        "read_predictions": "orbitask.trainers.state.predictions",
        "run_experiment": "orbitask.trainers.run.experiment",
        "run_on_ray": "orbitask.trainers.commands.ray_train",
        "TaskTrainer": "orbitask.trainers.engine.task_trainer",
        "ValidationControl": "orbitask.trainers.features.validation_control",
        "WarmStart": "orbitask.trainers.features.warm_start",
    },
)
