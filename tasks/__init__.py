"""orbitask tasks: the `Task` base class, the seed-style `CallbackTask` and built-in tasks."""

from typing import TYPE_CHECKING

from orbitask.lazy import exports

if TYPE_CHECKING:  # what editors and type checkers read; at runtime each name loads on first use
    from orbitask.tasks.base import Task as Task
    from orbitask.tasks.callbacks import CallbackContext as CallbackContext
    from orbitask.tasks.callbacks import deferred as deferred
    from orbitask.tasks.callbacks import print_loss as print_loss
    from orbitask.tasks.callbacks import print_step as print_step
    from orbitask.tasks.examples.digits import DigitsClassification as DigitsClassification
    from orbitask.tasks.examples.digits_cnn import DigitsCNN as DigitsCNN
    from orbitask.tasks.examples.digits_gan import DigitsGAN as DigitsGAN
    from orbitask.tasks.examples.digits_parity import DigitsParity as DigitsParity
    from orbitask.tasks.function_task import CallbackTask as CallbackTask
    from orbitask.tasks.indexed_input import IndexedInput as IndexedInput
    from orbitask.tasks.model_garden import ModelGardenTask as ModelGardenTask
    from orbitask.tasks.multi_task import MultiTask as MultiTask
    from orbitask.tasks.step_tensors import with_step_tensors as with_step_tensors

__all__, __getattr__, __dir__ = exports(
    __name__,
    {  # public name -> the module defining it, imported on first use
        "CallbackContext": "orbitask.tasks.callbacks",
        "CallbackTask": "orbitask.tasks.function_task",
        "deferred": "orbitask.tasks.callbacks",
        "with_step_tensors": "orbitask.tasks.step_tensors",
        "DigitsClassification": "orbitask.tasks.examples.digits",
        "DigitsCNN": "orbitask.tasks.examples.digits_cnn",
        "DigitsGAN": "orbitask.tasks.examples.digits_gan",
        "DigitsParity": "orbitask.tasks.examples.digits_parity",
        "IndexedInput": "orbitask.tasks.indexed_input",
        "ModelGardenTask": "orbitask.tasks.model_garden",
        "MultiTask": "orbitask.tasks.multi_task",
        "print_loss": "orbitask.tasks.callbacks",
        "print_step": "orbitask.tasks.callbacks",
        "Task": "orbitask.tasks.base",
    },
)
