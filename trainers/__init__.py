"""orbitask trainers: the Orbit trainer/evaluator, strategies and the experiment runner."""

import importlib

_WHERE = {  # public name -> the module defining it, imported on first use
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
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    """Imports the module behind a public name on first use (nothing heavy on import)."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
