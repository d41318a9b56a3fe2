"""orbitask trainers: the Orbit trainer/evaluator, strategies and the experiment runner."""

from orbitask.trainers.ema import ExponentialMovingAverage
from orbitask.trainers.errors import ConfigError, NonFiniteLossError, Preempted
from orbitask.trainers.experiment import run_experiment
from orbitask.trainers.learning_rate import learning_rate_schedule
from orbitask.trainers.nan_guard import NanGuard
from orbitask.trainers.strategies import build_strategy, logical_cpus
from orbitask.trainers.trainer import TaskTrainer
from orbitask.trainers.validation_control import ValidationControl
from orbitask.trainers.warm_start import WarmStart

__all__ = [
    "ConfigError",
    "ExponentialMovingAverage",
    "NanGuard",
    "NonFiniteLossError",
    "Preempted",
    "TaskTrainer",
    "ValidationControl",
    "WarmStart",
    "build_strategy",
    "learning_rate_schedule",
    "logical_cpus",
    "run_experiment",
]
