"""orbitask trainers: the Orbit trainer/evaluator, strategies and the experiment runner."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # hide TensorFlow's C++ INFO lines

from trainers.ema import ExponentialMovingAverage  # noqa: E402
from trainers.errors import ConfigError, NonFiniteLossError, Preempted  # noqa: E402
from trainers.learning_rate import learning_rate_schedule  # noqa: E402
from trainers.nan_guard import NanGuard  # noqa: E402
from trainers.runner import run_experiment  # noqa: E402
from trainers.strategies import build_strategy, logical_cpus  # noqa: E402
from trainers.trainer import TaskTrainer  # noqa: E402
from trainers.validation_control import ValidationControl  # noqa: E402
from trainers.warm_start import WarmStart  # noqa: E402

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
