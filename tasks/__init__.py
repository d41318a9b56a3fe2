"""orbitask tasks: the `Task` base class, the seed-style `CallbackTask` and built-in tasks."""

from orbitask.lazy import exports

__all__, __getattr__, __dir__ = exports(
    __name__,
    {  # public name -> the module defining it, imported on first use
        "CallbackContext": "orbitask.tasks.callbacks",
        "CallbackTask": "orbitask.tasks.callback_task",
        "deferred": "orbitask.tasks.callbacks",
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
