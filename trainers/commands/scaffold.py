"""`orbitask new NAME`: writes a Task file and an experiment .gin file that train at once.

    orbitask new my_task [--dir=.]     # writes my_task.py and my_task.gin
    orbitask --gin_file=my_task.gin --model_dir=runs/my_task

The Task trains a small MLP on scikit-learn's bundled digits (no download), so the pair runs as
written; replace its data and model with yours. Runs eagerly; it never starts TensorFlow work.
"""

from __future__ import annotations

import importlib.util
import keyword
import os
import re
import string
import sys

from absl import flags

FLAGS = flags.FlagValues()
flags.DEFINE_string("dir", ".", "Folder to write NAME.py and NAME.gin into.", flag_values=FLAGS)

TASK_TEMPLATE = string.Template('''\
"""$name: a Task written by `orbitask new $name`. Replace the data and the model with yours.

    orbitask --gin_file=$gin_path --model_dir=runs/$name
"""

import gin
import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

from orbitask import IndexedInput, Task


@gin.configurable
class $cls(Task):
    """Classifies scikit-learn's 8x8 digits with an MLP. Every builder runs eagerly, once."""

    def __init__(self, hidden_units=64, validation_size=300):
        super().__init__()
        self.hidden_units = hidden_units
        digits = load_digits()  # your data: arrays, files, or a tf.data pipeline
        x = (digits.data / 16.0).astype(np.float32)
        y = digits.target.astype(np.int32)
        self.train = x[validation_size:], y[validation_size:]
        self.validation = x[:validation_size], y[:validation_size]

    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        """Returns the (inputs, labels) examples. Training reads them by index in a global
        shuffle (IndexedInput.from_files for one file per example, or any `read(index)`): the
        saved position is a few bytes and resumes on any number of workers. Validation is one
        input pipeline's batches."""
        if training:
            return IndexedInput.from_tensors(self.train, per_replica_batch_size, seed=0)
        ds = tf.data.Dataset.from_tensor_slices(self.validation)
        if input_context and input_context.num_input_pipelines > 1:  # several workers
            ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return ds.batch(per_replica_batch_size)

    def build_model(self):
        """Returns the Keras model (built inside the strategy's scope)."""
        return keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(self.hidden_units, activation="relu"),
                keras.layers.Dense(10),
            ]
        )

    def build_losses(self):
        """Returns loss_fn((logits, labels)) -> the SUM over the batch (traced by tf.function)."""

        def loss_fn(loss_input):
            logits, labels = loss_input
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
            return tf.reduce_sum(per_example)

        return loss_fn

    def build_metrics(self, training=True):
        """Returns Keras metrics updated every step and every evaluation."""
        return [keras.metrics.SparseCategoricalAccuracy("accuracy")]
''')

GIN_TEMPLATE = string.Template("""\
# $name.gin -- written by `orbitask new $name`; $name.py holds the Task.
#   orbitask --gin_file=$gin_path --model_dir=runs/$name
include 'configs/defaults.gin'
import $name

TASK = @$cls()
TRAIN_STEPS = 300

$cls.hidden_units = 64
orbitask.run_experiment.eval_interval = 100
""")


class ScaffoldError(ValueError):
    """A NAME or folder `orbitask new` cannot use."""


def class_name(name: str) -> str:
    """`my_task` -> `MyTask`, `flowers` -> `FlowersTask`."""
    camel = "".join(part[:1].upper() + part[1:] for part in name.split("_") if part)
    return camel if camel.endswith("Task") else camel + "Task"


def check_name(name: str, folder: str) -> None:
    """Raises ScaffoldError unless `name` is a new module name that imports as itself. Eager."""
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise ScaffoldError(
            "NAME must be a lowercase Python module name (letters, digits, _), e.g. my_task; "
            f"received {name!r}."
        )
    for path in (os.path.join(folder, f"{name}.py"), os.path.join(folder, f"{name}.gin")):
        if os.path.exists(path):
            raise ScaffoldError(f"{path} already exists; choose another NAME or move it away.")
    if name in sys.builtin_module_names or importlib.util.find_spec(name) is not None:
        raise ScaffoldError(
            f"{name!r} is already an importable module, so `import {name}` in the .gin file "
            "would load that one; choose another NAME."
        )


def scaffold(name: str, folder: str = ".") -> tuple[str, str]:
    """Writes `folder/NAME.py` and `folder/NAME.gin`; returns their paths. Eager.

    Raises:
      ScaffoldError: for a bad NAME, an existing file or a folder that cannot be written.
    """
    check_name(name, folder)
    task_path = os.path.join(folder, f"{name}.py")
    gin_path = os.path.join(folder, f"{name}.gin")
    values = dict(name=name, cls=class_name(name), gin_path=os.path.normpath(gin_path))
    try:
        os.makedirs(folder, exist_ok=True)
        with open(task_path, "x") as f:
            f.write(TASK_TEMPLATE.substitute(values))
        with open(gin_path, "x") as f:
            f.write(GIN_TEMPLATE.substitute(values))
    except OSError as e:
        raise ScaffoldError(f"cannot write into --dir {folder!r}: {e.strerror or e}.") from e
    return task_path, gin_path


def main(argv: list[str]) -> int:
    """`orbitask new` on `argv`; prints what it wrote and the command to run; returns the status."""
    FLAGS.unparse_flags()
    if {"-h", "--help", "--helpfull"} & set(argv):
        print(f"usage: orbitask new NAME [--dir=FOLDER]\n\n{FLAGS.get_help().strip()}")
        return 0
    try:
        names = FLAGS(["orbitask new", *argv])[1:]
        if len(names) != 1:
            raise ScaffoldError(
                f"expected one NAME, e.g. `orbitask new my_task`; received {len(names)}."
            )
        task_path, gin_path = scaffold(names[0], FLAGS.dir)
    except (ScaffoldError, flags.Error) as e:
        print(f"orbitask: error: {e}", file=sys.stderr)
        return 2
    task_path, gin_path = os.path.normpath(task_path), os.path.normpath(gin_path)
    print(f"wrote {task_path} (the Task) and {gin_path} (the experiment). Train it:")
    print(f"  orbitask --gin_file={gin_path} --model_dir=runs/{names[0]}")
    return 0
