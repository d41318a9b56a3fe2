"""Public names: what editors read (`if TYPE_CHECKING:` imports) is what runs (the lazy `__all__`).

`orbitask`, `orbitask.tasks` and `orbitask.trainers` load each public name on first use, so
importing them imports no TensorFlow. Editors and type checkers cannot follow that, so each package
also imports every public name from its defining module under `if TYPE_CHECKING:`. These tests keep
the two lists equal, and each import naming the object the package gives at runtime.
"""

import ast
import importlib
import inspect
import subprocess
import sys

import pytest

PACKAGES = ["orbitask", "orbitask.tasks", "orbitask.trainers"]


def type_checking_imports(package: str) -> dict[str, tuple[str, str]]:
    """`{public name: (defining module, name there)}` from the package's `if TYPE_CHECKING:`."""
    tree = ast.parse(inspect.getsource(importlib.import_module(package)))
    found = {}
    for node in tree.body:
        test = node.test if isinstance(node, ast.If) else None
        if not (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") and not (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        ):
            continue
        for statement in node.body:
            assert isinstance(statement, ast.ImportFrom), (
                f"{package}: only `from MODULE import NAME as NAME` lines belong under "
                f"TYPE_CHECKING; found line {statement.lineno}: {ast.unparse(statement)}"
            )
            for alias in statement.names:
                found[alias.asname or alias.name] = (statement.module, alias.name)
    assert found, f"{package} has no `if TYPE_CHECKING:` block of imports"
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_type_checking_imports_are_the_public_names(package):
    imported = set(type_checking_imports(package))
    public = set(importlib.import_module(package).__all__)
    assert imported == public, (
        f"{package}: the TYPE_CHECKING imports and __all__ differ. "
        f"Only in __all__: {sorted(public - imported)}; "
        f"only under TYPE_CHECKING: {sorted(imported - public)}."
    )


@pytest.mark.parametrize("package", PACKAGES)
def test_type_checking_imports_name_the_runtime_objects(package):
    module = importlib.import_module(package)
    for public, (source, name) in type_checking_imports(package).items():
        expected = getattr(importlib.import_module(source), name)
        assert getattr(module, public) is expected, (
            f"{package}.{public} is not {source}.{name}: the TYPE_CHECKING import and the lazy "
            "map name different objects"
        )


def test_importing_the_package_imports_no_tensorflow():
    code = "import orbitask, sys; print('tensorflow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False", "importing orbitask imported tensorflow"
