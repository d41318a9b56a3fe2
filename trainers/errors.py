"""The exceptions a run raises on purpose: a configuration mistake, a lost loss, preemption."""

from orbitask.common.errors import ConfigError

__all__ = [
    "ConfigError",
    "EarlyStop",
    "Interrupted",
    "NoSpaceError",
    "NonFiniteLossError",
    "Preempted",
]


class NoSpaceError(ConfigError):
    """A checkpoint could not be written for lack of space; the previous one is intact."""


class NonFiniteLossError(RuntimeError):
    """Training stopped: the loss or its gradient stayed non-finite after the allowed rollbacks."""


class Preempted(RuntimeError):
    """The run received SIGTERM, saved a checkpoint and stopped; rerun to resume."""


class Interrupted(Preempted):
    """The run received SIGINT (Ctrl-C), saved a checkpoint and stopped; rerun to resume."""


class EarlyStop(Exception):
    """Raised by the validation control to end training early; the runner handles it."""
