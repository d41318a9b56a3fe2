"""The steps a W&B run's offline files hold: what a resumed run's `'wandb'` logger replays.

W&B writes each process of a run (`WANDB_MODE=offline`) into its own
`<dir>/wandb/offline-run-<time>-<id>/run-<id>.wandb`, a LevelDB-style log of `Record`
protocol buffers (W&B's transaction log, which `wandb sync` uploads). A process killed with
kill -9 leaves there only what W&B's service had written, often the header alone. `history_steps`
reads those files back, so that the resumed run logs again the rows of `metrics.jsonl` none of
them holds. Eager, on the host.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from typing import Any

from orbitask.common import files
from orbitask.trainers.state import metrics_file

_FILE_HEADER = struct.Struct("<4sHB")  # ":W&B", magic 0xBEE1, version
_RECORD_HEADER = struct.Struct("<IHB")  # crc32 of type and data, data length, type
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def records(path: str) -> Iterator[bytes]:
    """The serialized records of one `.wandb` file, in order; a record cut short, or one whose
    checksum fails (the end of a killed process's file), ends them."""
    data = files.read_bytes(path)
    if len(data) < _FILE_HEADER.size or _FILE_HEADER.unpack_from(data)[0] != b":W&B":
        return
    position, parts = _FILE_HEADER.size, []
    while position + _RECORD_HEADER.size <= len(data):
        left_in_block = _BLOCK - position % _BLOCK
        if left_in_block < _RECORD_HEADER.size:  # the block's tail is padding
            position += left_in_block
            continue
        crc, length, kind = _RECORD_HEADER.unpack_from(data, position)
        start = position + _RECORD_HEADER.size
        chunk = data[start : start + length]
        if len(chunk) < length or zlib.crc32(chunk, zlib.crc32(bytes([kind]))) != crc:
            return
        position = start + length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            parts = [chunk]
        elif kind == _MIDDLE:
            parts.append(chunk)
        elif kind == _LAST:
            yield b"".join([*parts, chunk])
            parts = []
        else:
            return


def history(path: str) -> Iterator[dict]:
    """The history rows (`run.log` calls) of one `.wandb` file: `{key: value}` with `_step`."""
    import json

    from wandb.proto import wandb_internal_pb2

    for data in records(path):
        record = wandb_internal_pb2.Record.FromString(data)
        if record.WhichOneof("record_type") == "history":
            row = {}
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json) if item.value_json else None
            yield row


def run_files(folder: str, run_id: str) -> list[str]:
    """The `.wandb` files of run `run_id` under `folder/wandb`, oldest first."""
    pattern = f"{folder.rstrip('/')}/wandb/*run-*-{run_id}/run-{run_id}.wandb"
    return sorted(files.glob(pattern))


def history_steps(folder: str, run_id: str) -> set[int]:
    """The steps of every history row the offline files of `run_id` under `folder` hold."""
    steps = set()
    for path in run_files(folder, run_id):
        for row in history(path):
            if isinstance(row.get("_step"), int):
                steps.add(row["_step"])
    return steps


def missing(
    folder: str, run_id: str, kept: tuple[int, int], last: Any = None, root: str | None = None
) -> Iterator:
    """The rows of `folder/metrics.jsonl` a resumed W&B run `run_id` logs again, as
    `(step, split, scalars)`: those up to the checkpoint's steps (`kept`: train, eval) at a
    step that neither the run's offline files (under `root/wandb`, `root` default `folder`)
    hold nor its server (`last`: the run's last `_step` there, or None)."""
    held = history_steps(root or folder, run_id)
    for row in metrics_file.read(f"{folder.rstrip('/')}/{metrics_file.NAME}"):
        step, split = int(row["step"]), str(row["split"])
        if step in held or (isinstance(last, int) and step <= last):
            continue
        if step <= (kept[0] if split == "train" else kept[1]):
            yield step, split, {k: v for k, v in row.items() if k not in ("step", "split")}
