"""What a run is and what it cost: its models' sizes, `model_summary.txt` and `run.json`.

At start, the chief of a training run prints one line per model with its parameter count
(trainable and not) and writes the models' summaries to `<model_dir>/model_summary.txt`.
`<model_dir>/run.json` holds one entry per start: the versions (Python, orbitask, TensorFlow,
both Keras flavours, tf-models-official), the command line, the gin files and bindings (`set`:
those the gin files and flags bind; `bindings`: the operative config, defaults included), the
hosts, replicas, global batch, mode, the step it started and ended at, its start and end times,
how it ended, and its examples per second and peak memory. At the end one line says the
examples per second (global), the peak host memory and, on a GPU, its peak device memory.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import resource
import socket
import sys
import time
from importlib import metadata
from typing import Any

import gin
import numpy as np
import tensorflow as tf

from orbitask.common import files
from orbitask.trainers.state.full_disk import write_text

RUN_JSON, SUMMARY = "run.json", "model_summary.txt"
PACKAGES = ("orbitask", "tensorflow", "keras", "tf-keras", "tf-models-official", "gin-config")


def _models(model: Any) -> dict[str, Any]:
    return dict(model) if isinstance(model, dict) else {"model": model}


def parameter_lines(model: Any) -> list[str]:
    """One line per model (a dict: each by its key): its parameter count, trainable and not."""
    lines = []
    for name, one in _models(model).items():
        trainable = sum(int(np.prod(v.shape)) for v in one.trainable_variables)
        total = sum(int(np.prod(v.shape)) for v in one.variables)
        lines.append(
            f"{name} {type(one).__name__}: {total:,} parameters ({trainable:,} trainable, "
            f"{total - trainable:,} not)"
        )
    return lines


def summary_text(model: Any) -> str:
    """The models' Keras summaries (a `tf.Module`: its variables), one after the other."""
    parts = []
    for name, one in _models(model).items():
        lines: list[str] = []
        if hasattr(one, "summary") and getattr(one, "built", True):
            one.summary(print_fn=lambda text, into=lines, **_: into.append(str(text)))
        else:
            lines = [f"{v.name} {list(v.shape)} {v.dtype.name}" for v in one.variables]
        parts.append(f"# {name}\n" + "\n".join(lines))
    return "\n\n".join(parts) + "\n"


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


class RunFacts:
    """`run.json`'s entry of this start, begun by `start` and ended by `end`. Eager; the chief.

    Args:
      model_dir: the run's model directory.
    """

    def __init__(self, model_dir: str):
        self.path = os.path.join(model_dir, RUN_JSON)
        self._began: tuple[float, int] | None = None
        self._batch = 0
        self._summary: str | None = None  # model_summary.txt as written
        self._written: list[dict] = []  # run.json as last written

    def start(self, model: Any, strategy: Any, global_batch_size: int, mode: str, step: int):
        """Writes the models' summary and this start's entry; returns the parameter lines."""
        self._summary = summary_text(model)
        write_text(os.path.join(os.path.dirname(self.path), SUMMARY), self._summary)
        self._began, self._batch = (time.perf_counter(), step), global_batch_size
        cluster = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}").get("cluster", {})
        entry = {
            "start": _now(),
            "end": None,
            "ended": None,
            "command": sys.argv,
            "versions": versions(),
            "gin_files": [a.split("=", 1)[1] for a in sys.argv if a.startswith("--gin_file=")],
            "bindings": gin.operative_config_str(),
            "set": gin.config_str(),
            "hosts": sorted({h.rsplit(":", 1)[0] for hs in cluster.values() for h in hs})
            or [socket.gethostname()],
            "replicas": strategy.num_replicas_in_sync,
            "global_batch_size": global_batch_size,
            "mode": mode,
            "start_step": step,
            "end_step": None,
        }
        self._write(self._entries() + [entry])
        return parameter_lines(model)

    def end(self, step: int, ended: str) -> str | None:
        """Completes this start's entry at `step` (`ended`: "finished", or the exception's
        name); returns the line of examples/s and peak memory (None before any step)."""
        if self._began is None:
            return None
        seconds, steps = time.perf_counter() - self._began[0], step - self._began[1]
        rate = steps * self._batch / seconds if seconds > 0 and steps > 0 else None
        host = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        device = _peak_device_mib()
        entries = self._entries()
        if entries:
            entries[-1].update(
                end=_now(), ended=ended, end_step=step, examples_per_second=rate,
                peak_host_mib=round(host, 1), peak_device_mib=device,
            )  # fmt: skip
            self._write(entries)
        if rate is None:
            return None
        line = f"{rate:,.0f} examples/s (global, {steps} steps in {seconds:.1f} s)"
        line += f"; peak host memory {host:,.0f} MiB"
        if device:
            line += "; peak device memory " + ", ".join(
                f"{k} {v:,.0f} MiB" for k, v in device.items()
            )
        return line

    def _entries(self) -> list[dict]:
        entries = files.read_json(self.path, [])
        return entries if isinstance(entries, list) else []

    def write_again(self) -> None:
        """Writes `model_summary.txt` and `run.json` again as they were last written, into a
        model directory made again after it was deleted. Eager; returns None."""
        if self._summary is not None:
            write_text(os.path.join(os.path.dirname(self.path), SUMMARY), self._summary)
        if self._written:
            self._write(self._written)

    def _write(self, entries: list[dict]) -> None:
        write_text(self.path, json.dumps(entries, indent=1) + "\n")
        self._written = entries


def _peak_device_mib() -> dict[str, float] | None:
    """`{GPU:i: peak MiB}` of this process's GPUs (`tf.config.experimental.get_memory_info`)."""
    peaks = {}
    for i, _ in enumerate(tf.config.list_logical_devices("GPU")):
        try:
            peaks[f"GPU:{i}"] = tf.config.experimental.get_memory_info(f"GPU:{i}")["peak"] / 2**20
        except (ValueError, tf.errors.OpError):
            continue
    return peaks or None
