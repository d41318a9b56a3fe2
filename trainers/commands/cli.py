"""The `orbitask` console script: a small table of subcommands; no subcommand means `train`.

    orbitask [train] --gin_file=... --model_dir=...   # the training binary (commands.train)
    orbitask report --model_dir=...                   # plot + summary of a run (commands.report)
    orbitask new NAME                                 # a Task file + gin file (commands.scaffold)
    orbitask launch --workers N -- TRAIN_FLAGS        # a local cluster (commands.launch)
    orbitask sweep --gin_file=... --param ...         # an Optuna search (commands.sweep)
    orbitask ray --workers N -- TRAIN_FLAGS           # on Ray Train (commands.on_ray)
    orbitask export --model_dir=...                   # a SavedModel of a run (commands.export)
    orbitask verify --gin_file=...                    # 1 device == N replicas? (commands.verify)

Each subcommand is a module with `main(argv) -> exit status`, imported only when used.
"""

from __future__ import annotations

import importlib
import os
import sys

from orbitask.trainers.commands.exits import interruptible

# name -> (module, one-line help). Add a subcommand by adding a row.
COMMANDS = {
    "train": (
        "orbitask.trainers.commands.train",
        "train and/or evaluate an experiment (the default)",
    ),
    "report": (
        "orbitask.trainers.commands.report",
        "plot a run's summaries and print the best metric",
    ),
    "new": (
        "orbitask.trainers.commands.scaffold",
        "write a Task file and an experiment .gin file to start from",
    ),
    "launch": (
        "orbitask.trainers.commands.launch",
        "run a job as a cluster of local processes (multi-worker, PS)",
    ),
    "sweep": (
        "orbitask.trainers.commands.sweep",
        "search hyperparameters with Optuna, each trial a run (pip install 'orbitask[sweep]')",
    ),
    "ray": (
        "orbitask.trainers.commands.on_ray",
        "run a job on Ray Train's workers, local or a cluster (pip install 'orbitask[ray]')",
    ),
    "export": (
        "orbitask.trainers.commands.export",
        "write a run's model as a SavedModel under MODEL_DIR/export/<step>/",
    ),
    "verify": (
        "orbitask.trainers.commands.verify",
        "check that an experiment trains alike on one device and on N replicas",
    ),
}


def main(argv: list[str]) -> int:
    """Dispatches `argv` (without the program name) to a subcommand. Eager; returns its status."""
    if argv and argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name = "train"
    if argv and not argv[0].startswith("-") and "=" not in argv[0]:  # NAME=VALUE: a binding
        name, argv = argv[0], argv[1:]
    if name not in COMMANDS:
        print(
            f"orbitask: error: unknown command {name!r}; commands: {', '.join(COMMANDS)} "
            "(no command means train). See `orbitask --help`.",
            file=sys.stderr,
        )
        return 2
    if name == "report":  # it reads event files: no cause for TensorFlow's start-up lines
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    module = importlib.import_module(COMMANDS[name][0])
    return module.main(argv)


def usage() -> str:
    """The `orbitask --help` text: one line per subcommand."""
    rows = [f"  {name:<8} {text}" for name, (_, text) in COMMANDS.items()]
    return (
        "usage: orbitask [COMMAND] [FLAGS]\n\ncommands:\n"
        + "\n".join(rows)
        + ("\n\n`orbitask COMMAND --help` lists a command's flags.")
    )


def run() -> None:
    """Entry point of the `orbitask` command."""
    sys.exit(interruptible(main, sys.argv[1:]))


if __name__ == "__main__":
    run()
