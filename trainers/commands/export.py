"""`orbitask export`: a run's trained model as a SavedModel, under `<model_dir>/export/<step>/`
(or `--output_dir`'s `<step>/`, so that a read-only model directory exports too).

    orbitask export --model_dir=runs/digits            # the latest checkpoint's weights
    orbitask export --model_dir=runs/digits --best     # the best checkpoint (ValidationControl)
    orbitask export --model_dir=runs/digits --ema      # the EMA averages of the latest one

The task and model come from the gin files the run was trained with: by default the model
directory's `operative_config.gin` (written when training starts), else `--gin_file` /
`--gin_params` as for `orbitask train`. No code is imported from the model directory: the
modules a gin `import` line names come from installed packages or the working directory (unless
it is inside the model directory), as in training. The SavedModel's layout and signature are
`trainers.run.saved_model`'s: one `serving_default` signature over the model's inputs,
loadable with `tf.saved_model.load` and no orbitask; a dict of models gives one SavedModel per
model. A mistake (no checkpoint, no gin config, no best or EMA weights) is one line on stderr,
exit 2; a full disk is one line, exit 4, and leaves no part of the export; a folder it cannot write
is one line, exit 2; SIGTERM removes the half-written export and exits 75 with one line. An
export killed with kill -9 leaves its temporary folder, which the next export removes.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from typing import Any

from absl import flags

from orbitask.trainers.commands.exits import fail, run_reported

FLAGS = flags.FlagValues()
flags.DEFINE_string(
    "model_dir", None, "The run's directory (what training wrote).", flag_values=FLAGS
)
flags.DEFINE_multi_string(
    "gin_file",
    [],
    "Gin file(s) of the run; default: MODEL_DIR/operative_config.gin.",
    flag_values=FLAGS,
)
flags.DEFINE_multi_string(
    "gin_params", [], "Gin bindings applied after the files.", flag_values=FLAGS
)
flags.DEFINE_boolean(
    "best",
    False,
    "Export the best checkpoint (MODEL_DIR/best/) instead of the latest.",
    flag_values=FLAGS,
)
flags.DEFINE_string(
    "output_dir",
    None,
    "Where the SavedModel's <step>/ folder goes; default: MODEL_DIR/export (MODEL_DIR may then "
    "be read-only).",
    flag_values=FLAGS,
)
flags.DEFINE_boolean(
    "ema",
    False,
    "Export the EMA averages the checkpoint holds instead of the raw weights.",
    flag_values=FLAGS,
)


def checkpoint_to_export(model_dir: str, best: bool) -> str:
    """The path of the latest (or best) checkpoint of `model_dir`. Eager; returns it.

    Raises:
      ConfigError: when there is none.
    """
    import tensorflow as tf

    from orbitask.trainers.errors import ConfigError

    if not tf.io.gfile.isdir(model_dir):
        raise ConfigError(f"--model_dir {model_dir!r} does not exist; pass the run's directory.")
    if best:
        path = tf.train.latest_checkpoint(os.path.join(model_dir, "best"))
        if path is None:
            raise ConfigError(
                f"--best: {model_dir!r} has no best checkpoint under best/; train with "
                "orbitask.run_experiment.validation_control = @orbitask.ValidationControl(), "
                "or drop --best."
            )
        return path
    path = tf.train.latest_checkpoint(model_dir)
    if path is None:
        raise ConfigError(
            f"no checkpoint in {model_dir!r} to export; pass the --model_dir you trained into."
        )
    return path


def gin_files(model_dir: str, given: list[str]) -> list[str]:
    """The gin files to parse: `given`, else the defaults and the run's operative config.

    Raises:
      ConfigError: when none is given and the run has no operative config.
    """
    import tensorflow as tf

    from orbitask.trainers.commands.train import config_root
    from orbitask.trainers.errors import ConfigError

    if given:
        return list(given)
    operative = os.path.join(model_dir, "operative_config.gin")
    if not tf.io.gfile.exists(operative):
        raise ConfigError(
            f"--gin_file is required: {model_dir!r} has no operative_config.gin; pass the "
            "run's gin files, e.g. --gin_file=experiments/digits.gin."
        )
    # The operative config holds the values used, not the runner's `task = %TASK` binding.
    return [os.path.join(config_root(), "configs", "defaults.gin"), operative]


def export(
    task: Any, model_dir: str, path: str, ema: bool = False, output_dir: str | None = None
) -> str:
    """Writes the model of checkpoint `path` as a SavedModel under `<output_dir>/<step>/`
    (default `output_dir`: `model_dir/export`).

    Eager. The run's `mixed_precision` and `global_batch_size` are read from gin.

    Returns:
      The path of the step's folder.

    Raises:
      ConfigError: as `saved_model.restored_model` and `saved_model.write`.
    """
    from orbitask.trainers.run import saved_model

    batch = _bound("global_batch_size", 64)
    precision = _bound("mixed_precision", None)
    model, step = saved_model.restored_model(task, path, ema, precision, batch)
    root = output_dir or os.path.join(model_dir, "export")
    return saved_model.write(task, model, root, step, batch)


def _bound(name: str, default: Any) -> Any:
    import gin

    try:
        return gin.query_parameter(f"orbitask.run_experiment.{name}")
    except ValueError:
        return default


@contextlib.contextmanager
def _sigterm_stops(what: str) -> Iterator[None]:
    """While open, SIGTERM raises `Preempted` (exit 75), so that the work's `finally` clauses
    remove what it had half written. Eager; the main thread only."""
    from orbitask.trainers.errors import Preempted

    def stop(signum, frame):
        del frame
        signal.signal(signum, signal.SIG_IGN)  # a repeated SIGTERM keeps exit 75
        raise Preempted(f"SIGTERM received during {what}: nothing of it was kept; run the same "
                        "command again.")  # fmt: skip

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is stop:
            signal.signal(signal.SIGTERM, previous)


def main(argv: list[str]) -> int:
    """`orbitask export` on `argv` (flags only). Eager; returns the exit status."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's C++ INFO lines
    FLAGS.unparse_flags()
    if {"-h", "--help", "--helpfull"} & set(argv):
        print(f"usage: orbitask export --model_dir=DIR [FLAGS]\n\n{FLAGS.get_help().strip()}")
        return 0
    try:
        rest = FLAGS(["orbitask export", *argv])[1:]
    except flags.Error as e:
        return fail(f"{e}. See `orbitask export --help`.")
    if rest:
        return fail(f"unexpected argument(s) {' '.join(rest)}; use --model_dir=DIR.")
    if not FLAGS.model_dir:
        return fail("--model_dir is required: the directory of the run to export.")

    from orbitask.common.files import check_scheme
    from orbitask.trainers.commands import train

    train.expand_home(FLAGS, "model_dir", "output_dir")

    def export_checkpoint() -> None:
        check_scheme(FLAGS.model_dir, "--model_dir")  # before any work
        check_scheme(FLAGS.output_dir, "--output_dir")
        path = checkpoint_to_export(FLAGS.model_dir, FLAGS.best)
        files = gin_files(FLAGS.model_dir, FLAGS.gin_file)
        train.parse_gin(files, FLAGS.gin_params, untrusted=FLAGS.model_dir)
        task, folder = train.build_task(), FLAGS.output_dir
        with _sigterm_stops("the export"):
            written = export(task, FLAGS.model_dir, path, ema=FLAGS.ema, output_dir=folder)
        weights = "the EMA averages of " if FLAGS.ema else ""
        print(f"orbitask: exported {weights}{os.path.basename(path)} to {written}")

    return run_reported(export_checkpoint)
