"""The folders a run writes: `--model_dir` when it trains; an evaluation's `eval/` under
`--output_dir` where one is given (then `--model_dir` is only read, and may be read-only);
TensorBoard's `train/` and `eval/` under a platform's TensorBoard folder where it gives one."""

from __future__ import annotations

import os
import uuid

import tensorflow as tf

from orbitask.common.errors import one_line
from orbitask.trainers.errors import ConfigError


def output_dir(model_dir: str, output_dir: str | None, mode: str) -> str:
    """Where the run's `eval/` goes: `output_dir`, which only an evaluation mode takes, or
    `model_dir`.

    Raises:
      ConfigError: for an `output_dir` in a training mode.
    """
    if output_dir is None or output_dir == model_dir:
        return model_dir
    if mode in ("train", "train_and_eval"):
        raise ConfigError(
            f"--output_dir is for the evaluation modes (eval, continuous_eval, eval_all); "
            f"--mode={mode} writes under --model_dir. Drop --output_dir."
        )
    return output_dir


def summary_dirs(model_dir: str, output_dir: str, summary_dir: str | None) -> tuple[str, str]:
    """TensorBoard's `train/` and `eval/` folders: under `summary_dir` where one is given (a
    platform's TensorBoard folder, Vertex AI's `AIP_TENSORBOARD_LOG_DIR`), else `model_dir/train`
    and `output_dir/eval`."""
    return os.path.join(summary_dir or model_dir, "train"), os.path.join(
        summary_dir or output_dir, "eval"
    )


def check_model_dir(
    model_dir: str, output_dir: str, training: bool, writes: str = "an evaluation writes eval/"
) -> None:
    """Creates the folder the run writes (`model_dir` when training, else `output_dir`) if
    needed and proves it is writable; an evaluation or a prediction only reads `model_dir`.
    `writes` says what a run that does not train writes there (the refusal's hint)."""
    folder = model_dir if training else output_dir
    probe = os.path.join(folder, f".orbitask-write-test-{uuid.uuid4().hex}")
    try:
        tf.io.gfile.makedirs(folder)
        with tf.io.gfile.GFile(probe, "w") as f:
            f.write("ok")
        tf.io.gfile.remove(probe)
    except (tf.errors.OpError, OSError) as e:
        reason = one_line(e, 200)
        if folder != model_dir:
            raise ConfigError(f"--output_dir {folder!r} is not writable ({reason}).") from e
        hint = "" if training else f" ({writes} there: pass --output_dir=DIR)"
        raise ConfigError(
            f"--model_dir {model_dir!r} is not writable ({reason}){hint}; pass a directory you "
            "can write to."
        ) from e
