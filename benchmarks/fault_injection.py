"""Fault injection: kill the digits run at random moments and check nothing is lost.

    python benchmarks/fault_injection.py --trials 10 [--replicas 1 2] [--signal KILL TERM]

Each trial: an uninterrupted reference run, then the same command killed at a random moment
(SIGKILL or SIGTERM) 1-3 times, restarted each time, and its final weights, optimizer slots and
step compared bit for bit with the reference. Prints one line per trial and a summary.
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import faults  # noqa: E402


def trial(workdir: Path, replicas: int, sig: signal.Signals, rng: random.Random) -> str:
    steps = 600
    reference = workdir / "reference"
    if not reference.exists():
        assert faults.run(faults.command(reference, replicas, steps)).returncode == 0
    model_dir = workdir / f"trial-{rng.random():.9f}"
    cmd = faults.command(model_dir, replicas, steps)
    kills = rng.randint(1, 3)
    for _ in range(kills):
        proc = faults.start(cmd)
        try:
            faults.wait_for_checkpoint(model_dir, proc)
        except AssertionError:
            break  # finished before the kill: fine, the comparison still runs
        import time

        time.sleep(rng.uniform(0.0, 0.4))
        proc.send_signal(sig)
        proc.wait(timeout=120)
    done = faults.run(cmd)
    if done.returncode != 0:
        return f"FAILED restart rc={done.returncode}"
    try:
        faults.assert_identical(faults.final_state(reference), faults.final_state(model_dir))
    except AssertionError as e:
        return f"DIFFERENT {str(e).splitlines()[0]}"
    return f"identical after {kills} kill(s)"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--signal", nargs="+", default=["KILL", "TERM"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    total = survived = 0
    with tempfile.TemporaryDirectory() as tmp:
        for replicas in args.replicas:
            workdir = Path(tmp) / f"r{replicas}"
            workdir.mkdir()
            for name in args.signal:
                sig = getattr(signal, f"SIG{name}")
                for i in range(args.trials):
                    result = trial(workdir, replicas, sig, rng)
                    total += 1
                    survived += result.startswith("identical")
                    print(f"replicas={replicas} SIG{name} trial {i + 1}: {result}", flush=True)
    print(f"{survived}/{total} runs killed at random moments ended bit-identical to the reference")


if __name__ == "__main__":
    main()
