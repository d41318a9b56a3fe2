"""orbitask tasks: the `Task` base class, the seed-style `CallbackTask` and built-in tasks."""

from tasks.base import Task
from tasks.callback_task import CallbackTask
from tasks.callbacks import CallbackContext, print_loss, print_step
from tasks.digits import DigitsClassification

__all__ = [
    "CallbackContext",
    "CallbackTask",
    "DigitsClassification",
    "Task",
    "print_loss",
    "print_step",
]
