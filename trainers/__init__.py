"""orbitask trainers: the Orbit trainer/evaluator, strategies and the experiment runner."""

from orbitask.lazy import exports

__all__, __getattr__, __dir__ = exports(
    __name__,
    {  # public name -> the module defining it, imported on first use
        "build_strategy": "orbitask.trainers.distribution.strategies",
        "ConfigError": "orbitask.trainers.errors",
        "ExponentialMovingAverage": "orbitask.trainers.features.ema",
        "learning_rate_schedule": "orbitask.trainers.features.learning_rate",
        "logical_cpus": "orbitask.trainers.distribution.strategies",
        "NanGuard": "orbitask.trainers.features.nan_guard",
        "NonFiniteLossError": "orbitask.trainers.errors",
        "Preempted": "orbitask.trainers.errors",
        "run_experiment": "orbitask.trainers.run.experiment",
        "TaskTrainer": "orbitask.trainers.engine.trainer",
        "ValidationControl": "orbitask.trainers.features.validation_control",
        "WarmStart": "orbitask.trainers.features.warm_start",
    },
)
