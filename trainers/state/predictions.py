"""A prediction's files: `<model_dir>/predictions/`, written so that a rerun after a kill at any
moment gives every example once.

    manifest.json                    the checkpoint, its step, the workers, the global batch and
                                     the outputs' structure; a rerun must match it
    worker-<w>-from-<step>.npz       worker w's outputs of steps [step, step + n): one array
                                     per output, the steps' examples in input order, and n
    worker-<w>-done.json             worker w predicted every batch of its input

A shard is written whole (`files.write_text`: locally to a temporary name renamed into place;
on object storage in one upload), so a shard that is there is whole. A rerun goes
on after the steps every worker's shards cover from step 0 (`steps_done`): it skips those
batches and writes the rest again (a shard written twice holds the same examples).
`read_predictions` joins the shards in step order, worker after worker.
"""

from __future__ import annotations

import io
import json
import os
from typing import Any

import numpy as np

from orbitask.common import files
from orbitask.trainers.errors import ConfigError
from orbitask.trainers.state.full_disk import write_text

FOLDER = "predictions"
MANIFEST = "manifest.json"


def folder_of(model_dir: str) -> str:
    """The predictions folder of `model_dir` (or `model_dir` itself, when it is one)."""
    if files.exists(os.path.join(model_dir, MANIFEST)):
        return model_dir
    return os.path.join(model_dir, FOLDER)


def _shard_path(folder: str, worker: int, step: int) -> str:
    return os.path.join(folder, f"worker-{worker:03d}-from-{step:09d}.npz")


def _done_path(folder: str, worker: int) -> str:
    return os.path.join(folder, f"worker-{worker:03d}-done.json")


def check_manifest(folder: str, facts: dict) -> dict | None:
    """The manifest of an earlier prediction into `folder` (None: none yet), checked against
    this run's `facts` (checkpoint, step, workers, global batch size). Eager.

    Raises:
      ConfigError: when the earlier prediction used other facts; it names the folder to remove.
    """
    manifest = files.read_json(os.path.join(folder, MANIFEST))
    if manifest is None:
        return None
    differ = [f"{k} {manifest.get(k)!r} -> {v!r}" for k, v in facts.items() if manifest.get(k) != v]
    if differ:
        raise ConfigError(
            f"{folder} holds a prediction made with other settings ({'; '.join(differ)}); "
            f"remove {folder} to predict again, or pass --output_dir for a new folder."
        )
    return manifest


def write_manifest(folder: str, facts: dict, structure: Any) -> None:
    """Writes `manifest.json`: `facts` and the outputs' nest (`_template`). Eager; the chief."""
    text = json.dumps({**facts, "structure": _template(structure)}, indent=1)
    write_text(os.path.join(folder, MANIFEST), text + "\n")


def remove_partial(folder: str, worker: int) -> None:
    """Removes worker `worker`'s half-written shards (a kill between write and rename)."""
    for name in files.listdir(folder):
        if name.startswith(f"worker-{worker:03d}-") and ".tmp" in name:
            files.remove(os.path.join(folder, name))


def _chain(folder: str, worker: int) -> list[tuple[str, int]]:
    """Worker `worker`'s whole shards from step 0 on, in order: `(path, steps)` each."""
    chain, step = [], 0
    while files.exists(path := _shard_path(folder, worker, step)):
        with _load(path) as shard:
            steps = int(shard["__steps__"])
        chain.append((path, steps))
        step += steps
    return chain


def steps_done(folder: str, workers: int) -> int:
    """The steps every worker's shards cover from step 0: where a rerun goes on. Eager."""
    return min(sum(s for _, s in _chain(folder, w)) for w in range(workers))


def write_shard(folder: str, worker: int, step: int, steps: int, leaves: list) -> None:
    """Worker `worker`'s outputs of `steps` steps from `step` (`leaves`: one array per output,
    joined over the steps), written whole or not at all. Eager."""
    arrays = {f"leaf_{i}": leaf for i, leaf in enumerate(leaves)}
    data = io.BytesIO()
    np.savez(data, __steps__=np.int64(steps), **arrays)
    files.write_text(_shard_path(folder, worker, step), data.getvalue())


def _load(path: str) -> Any:
    """The arrays of shard `path` (`np.load` of its bytes, read through gfile)."""
    return np.load(io.BytesIO(files.read_bytes(path)))


def write_done(folder: str, worker: int, steps: int) -> None:
    """Marks worker `worker`'s prediction complete after `steps` steps. Eager."""
    write_text(_done_path(folder, worker), json.dumps({"steps": steps}))


def read_predictions(model_dir: str) -> Any:
    """Returns every example's outputs of a complete prediction into `model_dir` (or its
    `--output_dir`), once each, in input order (with several workers: worker 0's examples, then
    worker 1's, ...), as the nest `predict_step` returns, of NumPy arrays. Eager.

    Raises:
      ConfigError: when there is no prediction there, or it is not complete.
    """
    folder = folder_of(model_dir)
    manifest = files.read_json(os.path.join(folder, MANIFEST))
    if manifest is None:
        raise ConfigError(
            f"no prediction in {folder}; run the experiment with --mode=predict first."
        )
    parts: list[list[np.ndarray]] = []
    for worker in range(manifest["workers"]):
        done = files.read_json(_done_path(folder, worker))
        if done is None:
            raise ConfigError(
                f"the prediction in {folder} is not complete (worker {worker} has not finished); "
                "run the same --mode=predict command again to complete it."
            )
        wanted = done["steps"]
        covered = 0
        for shard_path, steps in _chain(folder, worker):
            if covered >= wanted:
                break
            with _load(shard_path) as shard:
                parts.append([shard[f"leaf_{i}"] for i in range(len(shard.files) - 1)])
            covered += steps
    leaves = [np.concatenate(column) for column in zip(*parts, strict=True)]
    return _pack(manifest["structure"], leaves)


def _template(structure: Any) -> Any:
    """The nest `structure` as JSON: `{"dict": {key: ...}}`, `{"tuple": [...]}`,
    `{"list": [...]}`, and null for a tensor."""
    if isinstance(structure, dict):
        return {"dict": {str(k): _template(v) for k, v in structure.items()}}
    if isinstance(structure, (tuple, list)):
        return {type(structure).__name__: [_template(v) for v in structure]}
    return None


def _pack(template: Any, leaves: list) -> Any:
    """The nest `_template` describes, its tensors `leaves` in `tf.nest`'s order (sorted keys)."""
    order = iter(leaves)

    def build(node: Any) -> Any:
        if node is None:
            return next(order)
        if "dict" in node:
            built = {k: build(node["dict"][k]) for k in sorted(node["dict"])}
            return {k: built[k] for k in node["dict"]}
        kind = tuple if "tuple" in node else list
        return kind(build(v) for v in node.get("tuple", node.get("list")))

    return build(template)
