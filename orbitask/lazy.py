"""Public names that load their module on first use, so importing a package imports little."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def exports(package: str, where: dict[str, str]) -> tuple[list[str], Callable, Callable]:
    """Returns `(__all__, __getattr__, __dir__)` for `package`, whose public names are the keys
    of `where` (`{name: module defining it}`). Eager; each name is imported on first use and then
    kept in the package's namespace."""

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return sorted(where), __getattr__, __dir__
