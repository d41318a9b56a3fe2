"""`ConfigError`: a user's configuration mistake, which the binary shows as one line (exit 2)."""

import re


class ConfigError(ValueError, TypeError):
    """A bad setting, gin binding, flag, data shape or path, found before the first step.

    It is both a ValueError and a TypeError, the two kinds of mistake a setting can make. Only
    this exception is turned into one line by the runner and the binary: any other exception,
    from the user's own code included, keeps its traceback.
    """


def check_positive_int_or_none(owner: str, name: str, value: object) -> None:
    """Raises ConfigError unless `value` is a positive int or None. Eager; returns None."""
    if value is not None and not (type(value) is int and value > 0):
        raise ConfigError(
            f"`{name}` must be a positive int or None; received {value!r}. "
            f"Set {owner}.{name} in your .gin file."
        )


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def one_line(text: object, limit: int | None = None) -> str:
    """`text` as one line for an error message: terminal colour codes removed, whitespace
    collapsed, cut at `limit` characters. Eager; returns it."""
    line = " ".join(_ANSI.sub("", str(text)).split())
    return line if limit is None else line[:limit]
