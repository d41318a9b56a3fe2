"""orbitask tasks: the `Task` base class, the seed-style `CallbackTask` and built-in tasks."""

from tasks.base import Task
from tasks.callback_task import CallbackTask
from tasks.callbacks import CallbackContext, deferred, print_loss, print_step
from tasks.digits import DigitsClassification
from tasks.digits_cnn import DigitsCNN
from tasks.digits_gan import DigitsGAN
from tasks.digits_parity import DigitsParity
from tasks.multi_task import MultiTask

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
