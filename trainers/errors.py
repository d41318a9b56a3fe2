"""`ConfigError`: a user mistake found before any work, shown by the binary as one line."""


class ConfigError(ValueError):
    """A bad setting (gin binding, flag, dataset shape, ...), detected before the first step."""


class NonFiniteLossError(RuntimeError):
    """Training stopped because the loss stayed non-finite after the allowed rollbacks."""


class Preempted(RuntimeError):
    """The run received SIGTERM, saved a checkpoint and stopped; rerun to resume."""


class EarlyStop(Exception):
    """Raised by the validation control to end training early; the runner handles it."""
