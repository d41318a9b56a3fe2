"""`orbitask sweep`: hyperparameter search with Optuna, each trial a run (docs/sweeps.md)."""
