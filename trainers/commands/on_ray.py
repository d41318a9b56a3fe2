"""`orbitask ray`: runs one orbitask job on Ray Train's workers (`commands.ray_train`).

    pip install 'orbitask[ray]'
    orbitask ray --workers 2 -- --gin_file=experiments/digits.gin --model_dir=runs/digits
    orbitask ray --workers 8 --address=auto --max_failures 3 -- --gin_file=... --model_dir=gs://...

Without `--address`, a local Ray cluster on this machine's loopback only (in a network namespace
of its own, as `orbitask launch`'s job; `--allow_open_ports` runs it on this machine's network).
With `--address`, the Ray cluster there (`auto`: the one this machine belongs to). Each worker
runs the usual binary with the flags after `--` under `multi_worker_mirrored`; each row the run
logs is reported to Ray (the `'ray'` logger); `--max_failures N` lets Ray start the workers again
N times after a failure, each time resuming from the model directory.

Exit status: 0 when the run finished (the last line says where Ray keeps its records); 1 when
it failed more than `--max_failures` times; 2 for a mistake in the flags, or Ray not installed.
"""

from __future__ import annotations

import argparse
import sys

from orbitask.trainers.commands.exits import EXIT_USAGE


class UsageError(Exception):
    """A bad flag of `orbitask ray`."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="orbitask ray", add_help=True)
    p.add_argument("--workers", type=int, required=True, help="Ray workers (N >= 1)")
    p.add_argument("--address", default=None, help="a Ray cluster (default: a local one)")
    p.add_argument("--max_failures", type=int, default=0, help="restarts after a failure")
    p.add_argument("--storage_path", default=None, help="where Ray keeps its run records")
    p.add_argument("--temp_dir", default=None, help="the local cluster's temporary folder")
    p.add_argument(
        "--allow_open_ports",
        action="store_true",
        help="a local cluster on this machine's network, when no loopback-only network "
        "namespace can be made",
    )
    return p


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    split = argv.index("--") if "--" in argv else len(argv)
    args, unknown = _parser().parse_known_args(argv[:split])
    train_argv = unknown + argv[split + 1 :]
    for name, low in (("workers", 1), ("max_failures", 0)):
        if getattr(args, name) < low:
            raise UsageError(f"--{name} must be >= {low}; received {getattr(args, name)}")
    if not train_argv:
        raise UsageError("give the training flags after --, e.g. -- --gin_file=... ")
    return args, train_argv


def main(argv: list[str]) -> int:
    """Runs `orbitask ray` on `argv` (without the program name); returns the exit status."""
    try:
        args, train_argv = _parse(argv)
    except UsageError as e:
        print(f"orbitask ray: error: {e}. See `orbitask ray --help`.", file=sys.stderr)
        return EXIT_USAGE
    from orbitask.common.errors import one_line
    from orbitask.trainers.commands import ray_train
    from orbitask.trainers.errors import ConfigError

    try:
        result = ray_train.run_on_ray(
            train_argv,
            args.workers,
            address=args.address,
            max_failures=args.max_failures,
            storage_path=args.storage_path,
            allow_open_ports=args.allow_open_ports,
            temp_dir=args.temp_dir,
        )
    except ConfigError as e:
        print(f"orbitask ray: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:
        if type(e).__module__.startswith("ray."):  # Ray's TrainingFailedError and its kin
            print(f"orbitask ray: the run failed: {one_line(e, 300)}", file=sys.stderr)
            return 1
        raise
    print(f"orbitask ray: the run finished; Ray's records of it: {result.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
