"""`orbitask sweep`: a hyperparameter search with Optuna, each trial a run (docs/sweeps.md).

    orbitask sweep --gin_file=experiments/digits.gin --model_dir=runs/sweep --trials=20 \\
      --param "orbitask.run_experiment.learning_rate=loguniform(1e-4, 1e-1)" \\
      --objective=eval/accuracy [--direction=maximize] [--pruner=median] [--processes=2]

Trials run one after another in this process (`--processes=N`: N such processes, started
here, share the study), each in `<model_dir>/trial-<n>/` (`sweeps.trial`). The study is in
`<model_dir>/study.db`, or `--storage`, a URL that sweeps on other machines join. Killed, the
same command goes on: `sweeps.study` gives the trial that was running back to its host, resumed.
SIGTERM and Ctrl-C stop the running trial as they stop a run (saved, exit 75 or 130).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from absl import flags

from orbitask.trainers.commands.exits import fail, interruptible, run_reported

FLAGS = flags.FlagValues()
flags.DEFINE_multi_string(
    "gin_file", [], "The experiment's gin file(s), in order.", flag_values=FLAGS
)
flags.DEFINE_multi_string("gin_params", [], "Gin bindings every trial gets.", flag_values=FLAGS)
flags.DEFINE_string(
    "model_dir", None, "The sweep's folder: trial-<n>/ runs, study.db.", flag_values=FLAGS
)
flags.DEFINE_integer("trials", 20, "How many trials the study runs in all.", flag_values=FLAGS)
flags.DEFINE_multi_string(
    "param", [], 'A swept binding: "NAME=KIND(ARGS)", KIND uniform, loguniform, int or choice.',
    flag_values=FLAGS,
)  # fmt: skip
flags.DEFINE_string(
    "objective", None,
    "The eval log to optimize (eval/accuracy, eval/valid/loss); default: ValidationControl's.",
    flag_values=FLAGS,
)  # fmt: skip
flags.DEFINE_enum(
    "direction", None, ["maximize", "minimize"],
    "Default: ValidationControl's, else minimize for names with loss or error.", flag_values=FLAGS,
)  # fmt: skip
flags.DEFINE_enum(
    "pruner", "median", ["median", "hyperband", "none"], "Optuna's pruner.", flag_values=FLAGS
)
flags.DEFINE_string(
    "storage", None, "The study's database URL (default: sqlite in MODEL_DIR/study.db).",
    flag_values=FLAGS,
)  # fmt: skip
flags.DEFINE_string("study_name", None, "Default: MODEL_DIR's last part.", flag_values=FLAGS)
flags.DEFINE_integer("processes", 1, "Sweep processes on this machine.", flag_values=FLAGS)


def _check_flags() -> str | None:
    """The first wrong flag, as its one-line message, or None."""
    if not FLAGS.gin_file:
        return "--gin_file is required, e.g. --gin_file=experiments/digits.gin"
    if not FLAGS.model_dir:
        return "--model_dir is required: the sweep's folder (trial-<n>/ runs, study.db)."
    if "://" in FLAGS.model_dir:
        return f"--model_dir {FLAGS.model_dir!r}: a sweep's folder must be on a local or NFS path."
    if FLAGS.trials < 1 or FLAGS.processes < 1:
        return "--trials and --processes must be positive integers."
    import importlib.util

    if importlib.util.find_spec("optuna") is None:
        return "orbitask sweep needs Optuna: pip install 'orbitask[sweep]'."
    return None


def main(argv: list[str]) -> int:
    """`orbitask sweep` on `argv`; returns the exit status."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    FLAGS.unparse_flags()
    if {"-h", "--help", "--helpfull"} & set(argv):
        print(f"usage: orbitask sweep FLAGS\n\n{FLAGS.get_help().strip()}")
        return 0
    try:
        rest = FLAGS(["orbitask sweep", *argv])[1:]
    except flags.Error as e:
        return fail(f"{e}. See `orbitask sweep --help`.")
    if rest:
        return fail(f"unexpected argument(s) {' '.join(rest)}; see `orbitask sweep --help`.")
    wrong = _check_flags()
    if wrong:
        return fail(wrong)
    folder = os.path.expanduser(FLAGS.model_dir)
    if FLAGS.processes > 1:
        return _processes(argv, FLAGS.processes, folder)
    from orbitask.trainers.commands.sweeps import sweeping

    def work() -> None:
        sweep = sweeping.Sweep(
            gin_files=FLAGS.gin_file, gin_params=FLAGS.gin_params, folder=folder,
            trials=FLAGS.trials, params=FLAGS.param, objective=FLAGS.objective,
            direction=FLAGS.direction, pruner=FLAGS.pruner, storage=FLAGS.storage,
            study_name=FLAGS.study_name,
        )  # fmt: skip
        sweep.run()

    return run_reported(work)


def _processes(argv: list[str], count: int, folder: str) -> int:
    """Runs `count` sweep processes of `argv` (with --processes=1) side by side; SIGTERM is
    passed on to them. Returns the first non-zero status, else 0."""
    one = [a for a in argv if not a.startswith("--processes")] + ["--processes=1"]
    command = [sys.executable, "-m", "orbitask.trainers.commands.cli", "sweep", *one]
    os.makedirs(folder, exist_ok=True)
    children = [subprocess.Popen(command) for _ in range(count)]

    def relay(signum, _frame) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    # A terminal's Ctrl-C reaches every process of the group already: here it only waits.
    handlers = {signal.SIGTERM: relay, signal.SIGINT: lambda *_: None}
    previous = {s: signal.signal(s, handler) for s, handler in handlers.items()}
    try:
        statuses = [child.wait() for child in children]
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return next((s for s in statuses if s != 0), 0)


def run() -> None:
    """Console-script entry point (`python -m orbitask.trainers.commands.sweep`)."""
    sys.exit(interruptible(main, sys.argv[1:]))


if __name__ == "__main__":
    run()
