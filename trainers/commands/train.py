"""The orbitask binary: parse flags, parse gin, call the runner.

    orbitask --gin_file=experiments/digits.gin --model_dir=/tmp/digits [--mode=train_and_eval]
    python -m orbitask.trainers.commands.train ...   # the same binary

Bare `NAME=VALUE` arguments are gin bindings (`commands.bindings`). Where a platform's variables
are set (Vertex AI, Kubernetes, SageMaker, SLURM: `distribution.platforms`), one line names it,
and without `--model_dir` its folder is the model directory; its TensorBoard folder gets the
summaries and its model folder the final SavedModel.

A user mistake (bad flag, gin typo, bad setting) prints one line on stderr and exits with 2
(`commands.exits` lists every status). An exception raised in the user's own code (a module a
gin `import` line loads, the task's `__init__`, builders, stages, steps, callbacks) propagates
with its traceback (exit 1).
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import tokenize

from absl import flags

from orbitask.trainers.commands.exits import fail, interruptible, run_reported

FLAGS = flags.FlagValues()
flags.DEFINE_multi_string("gin_file", [], "Gin config file(s), in order.", flag_values=FLAGS)
flags.DEFINE_multi_string(
    "gin_params", [], "Gin bindings, e.g. 'TRAIN_STEPS = 100'.", flag_values=FLAGS
)
flags.DEFINE_string("model_dir", None, "Checkpoints and summaries go here.", flag_values=FLAGS)
flags.DEFINE_enum(
    "mode",
    "train_and_eval",
    ["train", "eval", "train_and_eval", "continuous_eval", "eval_all", "predict"],
    "What to run (eval_all: every checkpoint of --model_dir, oldest first; predict: the model "
    "over the Task's prediction input into --model_dir/predictions/).",
    flag_values=FLAGS,
)
flags.DEFINE_string(
    "checkpoint",
    None,
    "With --mode=eval or predict: the checkpoint to use (a ckpt-N prefix); default: the newest.",
    flag_values=FLAGS,
)
flags.DEFINE_string(
    "output_dir",
    None,
    "Evaluation modes: eval/ summaries go here (predict: predictions/), and --model_dir is only "
    "read (it may be read-only); default: --model_dir.",
    flag_values=FLAGS,
)


def config_root() -> str:
    """The folder holding `configs/` and `experiments/`: the repository in a source checkout or
    an editable install, the installed `orbitask` package otherwise (both are the parent of this
    module's package folder). Eager."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _resolved(path: str, root: str) -> str:
    """`path` of a --gin_file: relative to the working directory, else to the repository; a
    path with a scheme (a model directory's `gs://.../operative_config.gin`) as it is."""
    from orbitask.common import files
    from orbitask.trainers.errors import ConfigError

    if files.scheme(path):
        if not files.exists(path):
            raise ConfigError(f"--gin_file {path!r} does not exist.")
        _gin_reads_gfile()
        return path
    if os.path.isfile(path):
        return path
    if not os.path.isfile(os.path.join(root, path)):
        raise ConfigError(f"--gin_file {path!r} does not exist.")
    return os.path.join(root, path)


_gfile_reader: list[bool] = []  # registered with gin once


def _gin_reads_gfile() -> None:
    """Lets gin read .gin files with a scheme through `tf.io.gfile` (what `gin.tf` does)."""
    import gin
    import tensorflow as tf

    if not _gfile_reader:
        gin.config.register_file_reader(tf.io.gfile.GFile, tf.io.gfile.exists)
        _gfile_reader.append(True)


def parse_gin(gin_files: list[str], gin_params: list[str], untrusted: str | None = None) -> None:
    """Parses gin files and bindings with `config_root()` on gin's search path.

    A gin `import` finds modules installed, in the working directory or next to a .gin file;
    with `untrusted` (a model directory), never in that folder or below it.

    Raises:
      ConfigError: naming the binding or file that is wrong.
    """
    import gin

    import orbitask

    orbitask.load_all()  # registers the configurables

    # The working directory, then the repository, ahead of gin's own '' prefix: with '' first,
    # an include such as 'configs/defaults.gin' that is not under the working directory goes to
    # gin's Python-path reader, which crashes on a namespace package (a folder without
    # __init__.py, e.g. configs/ when the repository is on PYTHONPATH).
    from orbitask.trainers import compat
    from orbitask.trainers.engine import user_code
    from orbitask.trainers.errors import ConfigError

    root = config_root()
    compat.gin_search_first([os.getcwd(), root])
    gin_files = [_resolved(path, root) for path in gin_files]
    # A gin `import my_task` finds my_task.py in the working directory or next to the .gin file.
    local = [p for p in gin_files if "://" not in p]  # a module beside a .gin file on a disk
    for folder in (os.getcwd(), *(os.path.dirname(os.path.abspath(p)) for p in local)):
        if untrusted is not None and _inside(folder, untrusted):
            continue
        if folder not in sys.path:
            sys.path.append(folder)
    kept = list(sys.path)
    if untrusted is not None:  # also an entry already there ('' is the working directory)
        sys.path[:] = [p for p in kept if not _inside(p or os.getcwd(), untrusted)]
    try:
        with compat.quiet_gin_path_probes():
            gin.parse_config_files_and_bindings(gin_files, gin_params, finalize_config=False)
    except ImportError as e:  # named in a .gin file or by the user's module: not installed
        raise ConfigError(
            f"bad gin config: {_one_line(e)}. A module in a gin `import` line must be importable: "
            "put it next to the .gin file or in the working directory, or pip install it."
        ) from e
    except tokenize.TokenError as e:
        raise ConfigError(
            f"bad gin config: {e.args[0]}: an unclosed bracket or quote in --gin_params or a "
            ".gin file."
        ) from e
    except (ValueError, KeyError, TypeError, SyntaxError, OSError) as e:
        module_syntax = isinstance(e, SyntaxError) and str(e.filename).endswith(".py")
        if module_syntax or (
            user_code.passed_through_users_code(e) and not isinstance(e, ConfigError)
        ):
            raise  # the user's module, run by a gin `import` line, raised it
        raise ConfigError(f"bad gin config: {_one_line(e)}") from e
    finally:
        sys.path[:] = kept
    _check_macros(*compat.gin_macros())


def _check_macros(bound: set[str], used: set[str]) -> None:
    """A macro used but never bound would stop the run with gin's traceback where it is read; a
    macro that nothing references is a typo, or a setting that would be silently ignored.

    Raises:
      ConfigError: naming the first one, and the bound macro it is closest to.
    """
    import difflib

    from orbitask.trainers.errors import ConfigError

    undefined = sorted(used - bound)
    if undefined:
        name = undefined[0]
        raise ConfigError(
            f"bad gin config: macro %{name} is used but not defined; bind it ({name} = ...) in "
            "your .gin file or with --gin_params."
        )
    unused = sorted(bound - used)
    if not unused:
        return
    name = unused[0]
    close = difflib.get_close_matches(name, sorted(bound - {name}), n=1)
    hint = f"; did you mean {close[0]}?" if close else "; remove it or use it as %" + name
    raise ConfigError(
        f"bad gin config: macro {name} is bound but nothing uses it (no %{name} anywhere), so "
        f"it would change nothing{hint}"
    )


def _inside(folder: str, root: str) -> bool:
    if "://" in root:
        return False  # no local folder is inside a bucket
    folder, root = os.path.realpath(folder), os.path.realpath(root)
    return os.path.commonpath([folder, root]) == root


def build_task():
    """Constructs the task bound to `run_experiment.task` (the TASK macro).

    Raises:
      ConfigError: when it is unbound or its constructor rejects a binding.
    """
    import gin

    from orbitask.trainers.engine import user_code
    from orbitask.trainers.errors import ConfigError

    try:
        ref = gin.query_parameter("orbitask.run_experiment.task")
    except ValueError as e:
        raise ConfigError("no task: set TASK = @YourTask() in your experiment's .gin file") from e
    try:
        task = ref.scoped_configurable_fn() if hasattr(ref, "scoped_configurable_fn") else ref
        while hasattr(task, "scoped_configurable_fn"):  # a macro naming a reference
            task = task.scoped_configurable_fn()
    except (ValueError, TypeError, RuntimeError) as e:
        if user_code.passed_through_users_code(e) and not isinstance(e, ConfigError):
            raise  # the task's own __init__ raised it
        undefined = re.search(r"configurable 'macro' .* in scope '([^']+)'", _one_line(e))
        if undefined:  # `%NAME` used but never bound
            name = undefined.group(1)
            raise ConfigError(
                f"bad gin config: macro %{name} is used but not defined; bind it "
                f"({name} = ...) in your .gin file or with --gin_params."
            ) from e
        raise ConfigError(f"bad gin config: {_one_line(e)}") from e
    if task is gin.REQUIRED:
        raise ConfigError("no task: set TASK = @YourTask() in your experiment's .gin file")
    from orbitask.tasks import Task
    from orbitask.tasks.model_garden import is_model_garden_task

    if not isinstance(task, Task) and not is_model_garden_task(task):
        raise ConfigError(
            f"TASK must be a tasks.Task instance (or a Model Garden base_task.Task), e.g. "
            f"TASK = @YourTask(); received {task!r} "
            f"of type {type(task).__name__}. Fix TASK in your experiment's .gin file."
        )
    return task


def expand_home(flag_values: flags.FlagValues, *names: str) -> None:
    """Expands a leading `~` of the path flags `names` (a shell leaves `--model_dir=~/run` as it
    is), so that the run writes where its lines say. Eager; returns None."""
    for name in names:
        if flag_values[name].value:
            flag_values[name].value = os.path.expanduser(flag_values[name].value)


def _one_line(error: BaseException) -> str:
    from orbitask.common.errors import one_line

    return one_line(error) or type(error).__name__


def main(argv: list[str]) -> int:
    """Runs the binary on `argv` (without the program name); returns the exit status."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's C++ INFO lines
    FLAGS.unparse_flags()  # a second main() in one process must not see the last call's flags
    if {"-h", "--help", "--helpfull"} & set(argv):
        flag_help = FLAGS.get_help(include_special_flags=False).strip()
        print(f"usage: orbitask [train] FLAGS\n\n{flag_help}")
        return 0
    from orbitask.trainers.commands import bindings

    argv, bound = bindings.split(argv, FLAGS)  # NAME=VALUE: gin bindings
    try:
        rest = FLAGS(["orbitask", *argv])[1:]
    except flags.Error as e:
        return fail(f"{e}. See `orbitask --help`.")
    if rest:
        return fail(f"unexpected argument {rest[0]!r}; a gin binding is NAME=VALUE.")
    if not FLAGS.gin_file:
        return fail("--gin_file is required, e.g. --gin_file=experiments/digits.gin")
    from orbitask.trainers.distribution import platforms

    try:
        placement = platforms.detect()  # Vertex AI, Kubernetes, SageMaker, SLURM, or None
    except ValueError as e:
        return fail(e)
    if placement is not None:
        FLAGS.model_dir = FLAGS.model_dir or placement.model_dir
        print(dataclasses.replace(placement, model_dir=FLAGS.model_dir).describe(), flush=True)
    if not FLAGS.model_dir:
        return fail("--model_dir is required: where checkpoints and summaries go.")
    expand_home(FLAGS, "model_dir", "output_dir")

    from orbitask.common.files import check_scheme
    from orbitask.trainers.run.experiment import run_experiment

    def train() -> None:
        check_scheme(FLAGS.model_dir, "--model_dir")  # before any work
        check_scheme(FLAGS.output_dir, "--output_dir")
        asked = placement.bindings() if placement is not None else []
        parse_gin(FLAGS.gin_file, [*asked, *FLAGS.gin_params, *bound])
        task = build_task()
        chosen = {"eval_checkpoint": FLAGS.checkpoint} if FLAGS.checkpoint else {}
        if FLAGS.output_dir:
            chosen["output_dir"] = FLAGS.output_dir
        if placement is not None and placement.summary_dir:  # Vertex AI's TensorBoard folder
            chosen["summary_dir"] = placement.summary_dir
        mode = FLAGS.mode
        if placement is not None and placement.evaluator:  # Vertex AI's evaluator pool
            os.environ.pop("TF_CONFIG", None)  # outside the training cluster: one machine
            mode = "continuous_eval"  # its eval/ summaries under the TensorBoard folder
            chosen["output_dir"] = FLAGS.output_dir or placement.summary_dir
        results = run_experiment(task=task, model_dir=FLAGS.model_dir, mode=mode, **chosen)
        platforms.deliver(placement, results)

    return run_reported(train)


def run() -> None:
    """Console-script entry point (`python -m orbitask.trainers.commands.train`)."""
    sys.exit(interruptible(main, sys.argv[1:]))


if __name__ == "__main__":
    run()
