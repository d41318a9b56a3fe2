"""`ConfigError` and `MissingBuilder`: a user's configuration mistakes, which the binary shows as
one line (exit 2)."""

import re


class ConfigError(ValueError, TypeError):
    """A bad setting, gin binding, flag, data shape or path, found before the first step.

    It is both a ValueError and a TypeError, the two kinds of mistake a setting can make. Only
    this exception and `MissingBuilder` are turned into one line by the binary: any other
    exception, from the user's own code included, keeps its traceback.
    """


class MissingBuilder(NotImplementedError):
    """A builder the base `Task` leaves to subclasses (`build_inputs`, `build_model`,
    `build_losses`) is not implemented: the binary shows it as one line (exit 2), as a
    configuration mistake such as `TASK = @orbitask.Task()`."""


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def one_line(text: object, limit: int | None = None) -> str:
    """`text` as one line for an error message: terminal colour codes removed, whitespace
    collapsed, cut at `limit` characters. Eager; returns it."""
    line = " ".join(_ANSI.sub("", str(text)).split())
    return line if limit is None else line[:limit]
