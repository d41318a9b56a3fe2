"""orbitask tasks: the `Task` base class, the seed-style `CallbackTask` and built-in tasks."""

from orbitask.tasks.base import Task
from orbitask.tasks.callback_task import CallbackTask
from orbitask.tasks.callbacks import CallbackContext, deferred, print_loss, print_step
from orbitask.tasks.digits import DigitsClassification
from orbitask.tasks.digits_cnn import DigitsCNN
from orbitask.tasks.digits_gan import DigitsGAN
from orbitask.tasks.digits_parity import DigitsParity
from orbitask.tasks.multi_task import MultiTask

__all__ = [
    "CallbackContext",
    "CallbackTask",
    "DigitsCNN",
    "DigitsClassification",
    "DigitsGAN",
    "DigitsParity",
    "MultiTask",
    "Task",
    "deferred",
    "print_loss",
    "print_step",
]
