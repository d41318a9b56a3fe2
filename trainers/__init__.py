"""orbitask trainers: the Orbit trainer/evaluator, strategies and the experiment runner."""

from orbitask.lazy import exports

__all__, __getattr__, __dir__ = exports(
    __name__,
    {  # public name -> the module defining it, imported on first use
        "build_strategy": "orbitask.trainers.strategies",
        "ConfigError": "orbitask.trainers.errors",
        "ExponentialMovingAverage": "orbitask.trainers.ema",
        "learning_rate_schedule": "orbitask.trainers.learning_rate",
        "logical_cpus": "orbitask.trainers.strategies",
        "NanGuard": "orbitask.trainers.nan_guard",
        "NonFiniteLossError": "orbitask.trainers.errors",
        "Preempted": "orbitask.trainers.errors",
        "run_experiment": "orbitask.trainers.experiment",
        "TaskTrainer": "orbitask.trainers.trainer",
        "ValidationControl": "orbitask.trainers.validation_control",
        "WarmStart": "orbitask.trainers.warm_start",
    },
)
