"""`python -m orbitask.trainers.train`: the orbitask binary, `orbitask.trainers.commands.train`."""

from orbitask.trainers.commands.train import main, run

__all__ = ["main", "run"]

if __name__ == "__main__":
    run()
