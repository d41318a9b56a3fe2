"""Each training start's settings: gin's operative config, kept per start, and what a resume
changed.

`operative_config.gin` holds the latest start's settings (what `orbitask export` rebuilds the
model from). `operative_config-<step>.gin` holds those a start at global step `<step>` ran with:
written by the first start, and by each resume whose settings differ from the previous start's
(an unchanged resume adds no file, so a job restarted a thousand times keeps one). A resume
compares its bindings with the previous start's and names each change in one line.
"""

from __future__ import annotations

import os
import re

import gin
from gin import config_parser

from orbitask.common import files
from orbitask.trainers.state.full_disk import write_text

LATEST = "operative_config.gin"
STATE_OVERRIDES = "run_experiment.learning_rate"  # restored from the checkpoint, when a number


class _Token(str):
    """A reference or macro, printed as written (`@name()`, `%NAME`)."""

    def __repr__(self) -> str:
        return str(self)


class _AsText(config_parser.ParserDelegate):
    def configurable_reference(self, scoped_configurable_name, evaluate):
        return _Token(f"@{scoped_configurable_name}{'()' if evaluate else ''}")

    def macro(self, macro_name):
        return _Token(f"%{macro_name}")


def bindings(text: str) -> dict[str, str]:
    """`{binding: value as written}` of an operative config's text: `NAME` for a macro,
    `[scope/]configurable.parameter` for the rest."""
    found = {}
    for statement in config_parser.ConfigParser(text, _AsText()):
        if not isinstance(statement, config_parser.BindingStatement):
            continue
        name = statement.selector
        if statement.arg_name:
            name = f"{name}.{statement.arg_name}"
        if statement.scope:
            name = f"{statement.scope}/{name}"
        found[name] = repr(statement.value)
    return found


def changes(old: dict[str, str], new: dict[str, str]) -> list[tuple[str, str, str]]:
    """`(binding, old value, new value)` of each binding that differs, in `new`'s order, then
    those only `old` has (`-` for a value absent on one side)."""
    changed = [(k, old.get(k, "-"), v) for k, v in new.items() if old.get(k) != v]
    return changed + [(k, v, "-") for k, v in old.items() if k not in new]


def record(model_dir: str, step: int, resumed: bool, lr_now: float | None) -> list[str]:
    """Writes this start's operative config (module docstring) and returns the lines a resume
    that changed settings prints (`resume_lines`; none at a first start). The files begin with
    those lines as comments, so the record says which value applied. Eager; the chief of a
    training run, once the run is accepted.

    Raises:
      NoSpaceError: when the device is full.
    """
    text = gin.operative_config_str()
    if not text.strip():
        return []
    latest = os.path.join(model_dir, LATEST)
    previous = files.read_text(latest)
    changed = []
    if previous is not None:
        try:
            changed = changes(bindings(previous), bindings(text))
        except (SyntaxError, ValueError):  # a record edited by hand: keep this start's
            changed = [(LATEST, "unreadable", "this start's")]
    lines = resume_lines(step, changed, lr_now) if resumed else []
    text = "".join(f"# {line}\n" for line in lines) + text
    if previous is None or changed or not _starts(model_dir):
        write_text(os.path.join(model_dir, f"operative_config-{step}.gin"), text)
    write_text(latest, text)
    return lines


def _starts(model_dir: str) -> list[str]:
    return [n for n in files.listdir(model_dir) if re.fullmatch(r"operative_config-\d+\.gin", n)]


def resume_lines(step: int, changed: list, lr_now: float | None) -> list[str]:
    """The lines a resume at `step` prints for `changed` (none when nothing changed).

    `lr_now` is the restored learning rate where `run_experiment.learning_rate` is a number:
    the checkpoint's rate then goes on, whatever the new binding says.
    """
    if not changed:
        return []
    text = "; ".join(f"{name} {old} -> {new}" for name, old, new in changed)
    lines = [f"resumed at step {step} with changed settings: {text}"]
    if lr_now is not None and any(name == STATE_OVERRIDES for name, _, _ in changed):
        lines.append(
            f"the learning rate is training state: the checkpoint's rate {lr_now:.4g} goes on "
            f"(a callback that assigns ctx.lr changes it)"
        )
    for name, _, _ in changed:
        moved = _step_counts_using(name)
        if moved:
            lines.append(
                f"{name} also sets {', '.join(moved)}: a length counted in steps changes in "
                "the middle of the run"
            )
    return lines


def _step_counts_using(macro: str) -> list[str]:
    """The parameters named like step counts (`*steps*`) bound to `%macro`, other than
    `train_steps` itself."""
    if not re.fullmatch(r"[A-Za-z_]\w*", macro):
        return []
    current = bindings(gin.config_str())
    return [
        name
        for name, value in current.items()
        if value == f"%{macro}" and "steps" in name.rsplit(".", 1)[-1]
        and not name.endswith("run_experiment.train_steps")
    ]  # fmt: skip
