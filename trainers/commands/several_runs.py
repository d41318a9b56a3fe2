"""`orbitask report` over several runs: their curves overlaid and a table of their results.

    orbitask report --model_dir=runs/lr_0.1 --model_dir=runs/lr_0.01   # these runs
    orbitask report --model_dir=runs                                   # each run under runs/

The table has a row per run: its last step, its final and best evaluation of the ranked metric
(`--metric`, as for one run) and the gin bindings that differ between the runs (each run's
`operative_config.gin`) among those a gin file or flag set (`run.json`'s `set`; all of them for
runs without it), as many as fit in 120 columns, values cut to 24 characters. The other
bindings that differ are listed below it, one a line. The PNG overlays train loss, eval loss,
the metric and the learning rate, one line per run, each run in one colour in every panel.
Eager, on the host; it never builds a task.
"""

from __future__ import annotations

import os
from typing import Any

from orbitask.common import files
from orbitask.trainers.commands import report
from orbitask.trainers.state import run_facts, settings_record


def is_run(path: str) -> bool:
    """Whether `path` is a model directory (it has `train/`, `eval/` or `metrics.jsonl`)."""
    return any(files.exists(os.path.join(path, name)) for name in ("train", "eval")) or bool(
        files.pieces(os.path.join(path, "metrics.jsonl"))
    )


def find_runs(paths: list[str]) -> list[str]:
    """The model directories `paths` name: each path that is a run, and for one that is not,
    the runs directly under it (sorted).

    Raises:
      report.ReportError: for a missing path or a folder holding no run.
    """
    runs = []
    for path in paths:
        if not files.isdir(path):
            raise report.ReportError(f"--model_dir {path!r} does not exist or is not a directory.")
        if is_run(path):
            runs.append(path)
            continue
        below = [os.path.join(path, n) for n in files.listdir(path)]
        found = [p for p in below if files.isdir(p) and is_run(p)]
        if not found:
            raise report.ReportError(
                f"--model_dir {path!r} is neither a run (no train/, eval/ or metrics.jsonl) "
                "nor a folder of runs; pass the --model_dir you trained with."
            )
        runs.extend(found)
    return runs


def names(runs: list[str]) -> list[str]:
    """Each run's shortest distinct name: its path below the runs' common folder."""
    if len(runs) == 1:
        return [runs[0].rstrip("/").rpartition("/")[2] or runs[0]]
    common = common_folder(runs)
    if all(files.is_local(r) for r in runs):
        return [os.path.relpath(os.path.abspath(r), common) for r in runs]
    return [r.rstrip("/")[len(common) :].lstrip("/") for r in runs]


def common_folder(runs: list[str]) -> str:
    """The runs' common folder: a local path's absolute one, or (with a scheme) the longest
    shared leading `/`-parts of the paths as written."""
    if all(files.is_local(r) for r in runs):
        return os.path.commonpath([os.path.abspath(r) for r in runs])
    same = []
    for column in zip(*(r.rstrip("/").split("/") for r in runs), strict=False):
        if len(set(column)) > 1:
            break
        same.append(column[0])
    return "/".join(same)


def differing_bindings(runs: list[str]) -> dict[str, list[str]]:
    """`{binding: [value in each run]}` of the gin bindings that differ between the runs (`-`:
    unbound in that run, or no `operative_config.gin`)."""
    each = []
    for run in runs:
        text = files.read_text(os.path.join(run, settings_record.LATEST), "")
        try:
            each.append(settings_record.bindings(text))
        except (SyntaxError, ValueError):
            each.append({})
    keys = list(dict.fromkeys(k for one in each for k in one))
    values = {k: [one.get(k, "-") for one in each] for k in keys}
    return {k: v for k, v in values.items() if len(set(v)) > 1}


WIDTH, CELL = 120, 24  # the table's columns, a binding's value at most


def set_bindings(runs: list[str]) -> set[str] | None:
    """The bindings the runs' gin files and flags set (every start's `set` in `run.json`) as
    `Configurable.parameter` or `MACRO`; None when no run keeps that record."""
    found = None
    for run in runs:
        entries = files.read_json(os.path.join(run, run_facts.RUN_JSON), [])
        for entry in entries if isinstance(entries, list) else []:
            try:
                found = (found or set()) | set(map(_short, settings_record.bindings(entry["set"])))
            except (KeyError, TypeError, SyntaxError, ValueError):
                continue
    return found


def _short(key: str) -> str:
    """`Configurable.parameter` of a binding (scope and module dropped), or the macro."""
    return ".".join(key.rpartition("/")[2].split(".")[-2:])


def _cut(text: str, width: int = CELL) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _width(rows: list[list[str]]) -> int:
    """The width of `rows` as a table: its columns' widths, two spaces between."""
    return sum(max(len(r[c]) for r in rows) + 2 for c in range(len(rows[0]))) - 2


def table(runs: list[str], loaded: list[report.Run], metric: str | None) -> str:
    """The text table: a row per run, then the other bindings that differ (module
    docstring). Eager."""
    header = ["run", "steps"]
    if metric:
        header += [f"final {metric}", f"best {metric} (step)"]
    rows = [header]
    for name, run in zip(names(runs), loaded, strict=True):
        steps = [int(s[0][-1]) for s in (*run.train.values(), *run.eval.values()) if len(s[0])]
        row = [name, str(max(steps)) if steps else "-"]
        if metric and metric in run.eval:
            value, step = report.best(run, metric)
            row += [f"{run.eval[metric][1][-1]:.4g}", f"{value:.4g} ({step})"]
        elif metric:
            row += ["-", "-"]
        rows.append(row)
    differ = differing_bindings(runs)
    chosen = set_bindings(runs)
    shown = []
    for key in [k for k in differ if chosen is None or _short(k) in chosen]:
        column = [_cut(key, 40), *(_cut(v) for v in differ[key])]
        if _width(rows) + 2 + max(map(len, column)) > WIDTH:
            break
        rows = [r + [cell] for r, cell in zip(rows, column, strict=True)]
        shown.append(key)
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    rest = [k for k in differ if k not in shown]
    if rest:
        lines += ["", "also differ (one value a run, in the table's order):"]
        lines += [_cut(f"  {k}: {' | '.join(differ[k])}", WIDTH) for k in rest]
    return "\n".join(lines)


def plot(runs: list[str], loaded: list[report.Run], metric: str | None, path: str) -> None:
    """Writes the `figure` of the runs as a PNG to `path`. Eager."""
    report.save(figure(runs, loaded, metric), path)


def figure(runs: list[str], loaded: list[report.Run], metric: str | None) -> Any:
    """A 2x2 matplotlib `Figure` (1000x700 px): train loss, eval loss, eval `metric`, learning
    rate, one line per run, run i in colour `C<i>` in every panel. Eager."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 7), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    panels = [("train loss", "train", "loss"), ("eval loss", "eval", "loss")]
    panels += [(f"eval {metric}", "eval", metric), ("learning rate", "train", "learning_rate")]
    for ax, (title, split, tag) in zip(figure.subplots(2, 2).ravel(), panels, strict=True):
        drawn = 0
        for i, (name, run) in enumerate(zip(names(runs), loaded, strict=True)):
            series = getattr(run, split)
            if tag in series:
                steps, values = series[tag]
                marker = "o" if len(steps) < 30 else None
                ax.plot(steps, values, marker=marker, label=name, color=f"C{i % 10}")
                drawn += 1
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend()
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    return figure


def report_runs(runs: list[str], output: str | None, metric: str | None) -> str:
    """Writes the overlaid PNG (default: `report.png` in the runs' common folder) and returns
    the table and the PNG's path. Eager.

    Raises:
      report.ReportError: for a run without event files or a `metric` no run evaluated.
    """
    loaded = [report.load_run(run) for run in runs]
    chosen = None
    if metric is not None:
        if not any(metric in run.eval for run in loaded):
            raise report.ReportError(f"--metric {metric!r} is an eval summary of none of the runs.")
        chosen = metric
    else:
        chosen = next((m for m in map(report.pick_metric, loaded) if m), None)
    png = output or os.path.join(common_folder(runs), "report.png")
    try:
        plot(runs, loaded, chosen, png)
    except OSError as e:
        raise report.ReportError(f"cannot write the plot to --output {png!r}: {e}.") from e
    return f"{table(runs, loaded, chosen)}\n\nplot  {png}"
