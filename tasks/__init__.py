"""orbitask tasks: the `Task` base class, the seed-style `CallbackTask` and built-in tasks."""

import importlib

_WHERE = {  # public name -> the module defining it, imported on first use
    "CallbackContext": "orbitask.tasks.callbacks",
    "CallbackTask": "orbitask.tasks.callback_task",
    "deferred": "orbitask.tasks.callbacks",
    "DigitsClassification": "orbitask.tasks.digits",
    "DigitsCNN": "orbitask.tasks.digits_cnn",
    "DigitsGAN": "orbitask.tasks.digits_gan",
    "DigitsParity": "orbitask.tasks.digits_parity",
    "MultiTask": "orbitask.tasks.multi_task",
    "print_loss": "orbitask.tasks.callbacks",
    "print_step": "orbitask.tasks.callbacks",
    "Task": "orbitask.tasks.base",
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
