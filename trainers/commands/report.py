"""`orbitask report`: a PNG of a run's curves and a short text summary, from its event files.

    orbitask report --model_dir=runs/digits [--output=report.png] [--metric=accuracy]

Several `--model_dir`, or a folder of runs, compare the runs instead (`several_runs`); a sweep's
folder first says its best trial (`sweeps.study.report_lines`). For one run, it
reads the TensorBoard event files the runner writes under `model_dir/train` and `model_dir/eval`
and draws loss (train and eval), eval metrics, learning rate and steps/s over steps; prints the
best eval metric and its step, the last checkpoint and the run time. Runs eagerly, on the host;
it never builds the task.
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
import sys

import numpy as np
from absl import flags

from orbitask.common import files
from orbitask.common.errors import ConfigError
from orbitask.trainers.state import metrics_file

FLAGS = flags.FlagValues()
flags.DEFINE_multi_string(
    "model_dir",
    None,
    "The run's --model_dir; repeated, or a folder of runs, compares the runs.",
    flag_values=FLAGS,
)
flags.DEFINE_string(
    "output", None, "Where the PNG goes (default: MODEL_DIR/report.png).", flag_values=FLAGS
)
flags.DEFINE_string(
    "metric",
    None,
    "Eval summary to rank checkpoints by (default: accuracy, else the first non-loss metric, "
    "else loss). Names with 'loss' or 'error' are minimised, others maximised.",
    flag_values=FLAGS,
)

Series = dict[str, tuple[np.ndarray, np.ndarray]]  # tag -> (steps, values), one value per step


@dataclasses.dataclass
class Run:
    """The scalar summaries of one model directory.

    Attributes:
      train, eval: `{tag: (steps, values)}` from `train/` and `eval/`, sorted by step; where a tag
        was written twice at one step (e.g. `loss` by Orbit and by `print_loss`) the last wins.
      seconds: wall time of each process that wrote summaries, from its first to its last event.
    """

    train: Series
    eval: Series
    seconds: list[float]


class ReportError(ValueError):
    """A mistake in `orbitask report`'s flags or an unusable model directory."""


def read_events(path: str) -> list[tuple[str, int, float, float]]:
    """Returns `(tag, step, wall_time, value)` for every scalar in one event file. Eager.

    A file cut short (a killed run) yields the events before the cut.
    """
    import tensorflow as tf

    out = []
    try:
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            out.append(("", event.step, event.wall_time, float("nan")))  # keeps the wall time
            for value in event.summary.value:
                if value.HasField("tensor"):
                    array = tf.make_ndarray(value.tensor)
                    if array.size != 1 or array.dtype.kind not in "fiub":
                        continue  # images, histograms, text
                    number = float(array.reshape(()))
                elif value.HasField("simple_value"):
                    number = float(value.simple_value)
                else:
                    continue
                out.append((value.tag, event.step, event.wall_time, number))
    except tf.errors.DataLossError:
        pass
    return out


def load_run(model_dir: str) -> Run:
    """Reads every event file of `model_dir/train` and `model_dir/eval` (the processes' times),
    and the series from `metrics.jsonl` where the run wrote one, else from the events. Eager.

    Raises:
      ReportError: when the directory is missing or holds no event files.
    """
    if not files.isdir(model_dir):
        raise ReportError(f"--model_dir {model_dir!r} does not exist or is not a directory.")
    series: dict[str, Series] = {}
    spans: dict[str, list[float]] = {}
    for split in ("train", "eval"):
        rows: dict[str, dict[int, float]] = {}
        for path in files.glob(os.path.join(model_dir, split, "events.out.tfevents.*")):
            # events.out.tfevents.<time>.<host>.<pid>.<n>.v2: one process writes one per split.
            process = ".".join(os.path.basename(path).split(".")[4:-2])
            for tag, step, wall, value in read_events(path):
                span = spans.setdefault(process, [wall, wall])
                span[0], span[1] = min(span[0], wall), max(span[1], wall)
                if tag:
                    rows.setdefault(tag, {})[int(step)] = value
        series[split] = {
            tag: (np.array(sorted(by_step)), np.array([by_step[s] for s in sorted(by_step)]))
            for tag, by_step in rows.items()
        }
    if not spans:
        raise ReportError(
            f"no TensorBoard event files in {os.path.join(model_dir, 'train')} or "
            f"{os.path.join(model_dir, 'eval')}; pass the --model_dir you trained with."
        )
    seconds = [end - start for start, end in spans.values()]
    metrics = os.path.join(model_dir, metrics_file.NAME)
    if files.pieces(metrics):  # rewound on every resume: each split and step once
        series = _series_of(metrics_file.read(metrics))
    return Run(series["train"], series["eval"], seconds)


def _series_of(rows: list[dict]) -> dict[str, Series]:
    """`{"train": series, "eval": series}` of a metrics file's rows; a validation set's scalars
    are `<set>/<name>` among the eval ones."""
    found: dict[str, dict[str, dict[int, float]]] = {"train": {}, "eval": {}}
    for row in rows:
        split, _, name = str(row["split"]).partition("/")
        if split not in found:
            continue
        for key, value in row.items():
            if key not in ("step", "split") and isinstance(value, (int, float)):
                tag = f"{name}/{key}" if name else key
                found[split].setdefault(tag, {})[int(row["step"])] = float(value)
    return {
        split: {
            tag: (np.array(sorted(by_step)), np.array([by_step[s] for s in sorted(by_step)]))
            for tag, by_step in tags.items()
        }
        for split, tags in found.items()
    }


def minimised(name: str) -> bool:
    """Whether a smaller value of metric `name` is better (names with 'loss' or 'error')."""
    return bool(re.search(r"loss|error", name, re.IGNORECASE))


def pick_metric(run: Run, metric: str | None = None) -> str | None:
    """The eval summary to rank by: `metric`, else accuracy, else the first non-loss, else loss.

    Raises:
      ReportError: when `metric` is not an eval summary of the run.
    """
    if metric is not None:
        if metric not in run.eval:
            have = ", ".join(sorted(run.eval)) or "none"
            raise ReportError(
                f"--metric {metric!r} is not an eval summary of this run; it has: {have}."
            )
        return metric
    if "accuracy" in run.eval:
        return "accuracy"
    others = sorted(tag for tag in run.eval if not minimised(tag))
    return others[0] if others else ("loss" if "loss" in run.eval else None)


def _train_losses(run: Run) -> list[str]:
    """The train summaries that are losses (`loss`, `d_loss`, `loss/digit`, ...), `loss` first."""
    from orbitask.tasks.callbacks import loss_logs

    return list(loss_logs({t: 0.0 for t in run.train}))


def best(run: Run, metric: str) -> tuple[float, int]:
    """Returns `(best value, its step)` of eval summary `metric` (earliest step on ties)."""
    steps, values = run.eval[metric]
    index = int(np.nanargmin(values) if minimised(metric) else np.nanargmax(values))
    return float(values[index]), int(steps[index])


def panels(run: Run) -> list[tuple[str, list[tuple[str, Series, str]]]]:
    """The PNG's four panels: `(title, [(label, series, tag), ...])`: losses, eval metrics,
    learning rate, and steps/s as the run wrote it, every point (the progress line's figure,
    `actions.step_rate`). Eval summaries whose name says loss or error go with the losses; the
    others are metrics."""
    tags = sorted(run.eval)
    eval_losses = [(f"eval {t}", run.eval, t) for t in tags if t != "loss" and minimised(t)]
    train_losses = [(f"train {t}", run.train, t) for t in _train_losses(run) if t != "loss"]
    return [
        (
            "loss",
            [("train", run.train, "loss"), ("eval", run.eval, "loss"), *train_losses, *eval_losses],
        ),
        ("eval metrics", [(t, run.eval, t) for t in tags if not minimised(t)]),
        ("learning rate", [("train", run.train, "learning_rate")]),
        ("steps/s", [("train", run.train, "steps_per_second")]),
    ]


def plot(run: Run, path: str, title: str = "") -> None:
    """Writes a 2x2 PNG (1000x700 px) of the run's `panels`. Eager."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 7), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(2, 2).ravel()
    for ax, (name, lines) in zip(axes, panels(run), strict=True):
        drawn = 0
        for label, series, tag in lines:
            if tag in series:
                steps, values = series[tag]
                ax.plot(steps, values, marker="o" if len(steps) < 30 else None, label=label)
                drawn += 1
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if not drawn:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        elif len(lines) > 1 or name == "eval metrics":
            ax.legend()
        if (
            name == "loss"
            and drawn
            and all(np.nanmin(s[tag][1]) > 0 for _, s, tag in lines if tag in s)
        ):
            ax.set_yscale("log")
    if title:
        figure.suptitle(title)
    save(figure, path)


def save(figure, path: str) -> None:
    """Writes `figure` as a PNG to `path`, local or not (through `files`). Eager.

    Raises:
      OSError: when `path`'s folder does not exist.
    """
    folder = path.rpartition("/")[0]
    if folder and not files.isdir(folder):
        raise OSError(f"no folder {folder}")
    data = io.BytesIO()
    figure.savefig(data, format="png")
    files.write_text(path, data.getvalue())


def summary(run: Run, model_dir: str, png: str, metric: str | None) -> str:
    """The text summary printed by `orbitask report`. Eager."""
    import tensorflow as tf

    lines = [f"run         {model_dir}"]
    losses = _train_losses(run)
    if losses:
        last = ", ".join(f"{t} {run.train[t][1][-1]:.4g}" for t in losses)
        steps = int(max(run.train[t][0][-1] for t in losses))
        lines.append(f"train       {steps} steps, last {last}")
    if metric:
        value, step = best(run, metric)
        direction = "min" if minimised(metric) else "max"
        last_steps, last_values = run.eval[metric]
        lines.append(
            f"best        eval {metric} {value:.4g} at step {step} ({direction}; "
            f"last {last_values[-1]:.4g} at step {int(last_steps[-1])})"
        )
    else:
        lines.append("best        no eval summaries (train with --mode=train_and_eval)")
    checkpoint = tf.train.latest_checkpoint(model_dir)
    lines.append(f"checkpoint  {checkpoint or 'none'}")
    total = sum(run.seconds)
    runs = len(run.seconds)
    lines.append(
        f"time        {total:.1f} s in {runs} process{'es' if runs > 1 else ''} "
        "(first to last summary of each)"
    )
    lines.append(f"plot        {png}")
    return "\n".join(lines)


def report(model_dir: str, output: str | None = None, metric: str | None = None) -> str:
    """Writes the PNG and returns the text summary. Eager.

    Raises:
      ReportError: for a missing model directory, no event files or an unknown `metric`.
    """
    run = load_run(model_dir)
    chosen = pick_metric(run, metric)
    png = output or os.path.join(model_dir, "report.png")
    try:
        plot(run, png, title=model_dir.rstrip("/").rpartition("/")[2] or model_dir)
    except OSError as e:
        raise ReportError(f"cannot write the plot to --output {png!r}: {e.strerror or e}.") from e
    return summary(run, model_dir, png, chosen)


def main(argv: list[str]) -> int:
    """`orbitask report` on `argv` (flags only). Prints the summary; returns the exit status."""
    # Reading event files is no cause for TensorFlow's C++ start-up and data-reading lines.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    FLAGS.unparse_flags()
    if {"-h", "--help", "--helpfull"} & set(argv):
        print(f"usage: orbitask report --model_dir=DIR [FLAGS]\n\n{FLAGS.get_help().strip()}")
        return 0
    try:
        rest = FLAGS(["orbitask report", *argv])[1:]
        if rest:
            raise ReportError(f"unexpected argument(s) {' '.join(rest)}; use --model_dir=DIR.")
        if not FLAGS.model_dir:
            raise ReportError("--model_dir is required: the directory of the run to report.")
        FLAGS.model_dir = [os.path.expanduser(path) for path in FLAGS.model_dir]
        for path in FLAGS.model_dir:
            files.check_scheme(path, "--model_dir")  # before any work
        if FLAGS.output:
            FLAGS.output = os.path.expanduser(FLAGS.output)
            files.check_scheme(FLAGS.output, "--output")
        from orbitask.trainers.commands import several_runs

        runs = several_runs.find_runs(FLAGS.model_dir)
        if len(runs) == 1:
            text = report(runs[0], FLAGS.output, FLAGS.metric)
        else:
            text = several_runs.report_runs(runs, FLAGS.output, FLAGS.metric)
        from orbitask.trainers.commands.sweeps import study  # a sweep's best trial first

        text = "".join(f"{line}\n" for line in study.report_lines(FLAGS.model_dir)) + text
    except (ReportError, ConfigError, flags.Error) as e:
        print(f"orbitask: error: {e}", file=sys.stderr)
        return 2
    print(text)
    return 0
