"""orbitask trainers: the Orbit trainer/evaluator, strategies and the experiment runner."""

from trainers.runner import run_experiment
from trainers.strategies import build_strategy, logical_cpus
from trainers.trainer import TaskTrainer

__all__ = ["TaskTrainer", "build_strategy", "logical_cpus", "run_experiment"]
