"""API docs: every public name has a docstring saying when it runs and what it returns.

Public names are `tasks.__all__` and `trainers.__all__`. For a class, its public methods (its own
and those inherited from orbitask classes) count too; an override without a docstring inherits the
base method's, which documents the contract. "When it runs" means the docstring says eager,
tf.function or traced; "what it returns" means it says returns (or yields).
"""

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

from orbitask import common, tasks, trainers

WHEN = re.compile(r"eager|tf\.function|traced", re.IGNORECASE)
RETURNS = re.compile(r"return|yield", re.IGNORECASE)
PUBLIC = [(pkg.__name__, name) for pkg in (tasks, trainers) for name in pkg.__all__]


def _ours(obj) -> bool:
    return (getattr(obj, "__module__", None) or "").startswith(
        ("orbitask.common", "orbitask.tasks", "orbitask.trainers")
    )


def _functions(obj):
    """(qualified name, function) for a public function, or a class's public methods."""
    if not inspect.isclass(obj):
        yield obj.__name__, obj
        return
    seen = set()
    for klass in obj.__mro__:
        if not _ours(klass):
            continue
        for name, member in vars(klass).items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            if isinstance(member, property):
                yield f"{obj.__name__}.{name}", member.fget
            elif inspect.isfunction(inspect.unwrap(getattr(obj, name, None) or member)):
                yield f"{obj.__name__}.{name}", getattr(obj, name)
            elif isinstance(member, (staticmethod, classmethod)):
                yield f"{obj.__name__}.{name}", member.__func__


def test_every_module_has_a_docstring():
    missing = []
    for pkg in (common, tasks, trainers):
        for info in pkgutil.walk_packages(pkg.__path__, prefix=f"{pkg.__name__}."):
            module = importlib.import_module(info.name)
            if not (module.__doc__ or "").strip():
                missing.append(module.__name__)
    assert not missing, f"modules without a docstring: {missing}"


@pytest.mark.parametrize("package, name", PUBLIC, ids=[f"{p}.{n}" for p, n in PUBLIC])
def test_public_name_is_documented(package, name):
    obj = getattr(importlib.import_module(package), name)
    assert (obj.__doc__ or "").strip(), f"{package}.{name} has no docstring"
    problems = []
    for qualified, fn in _functions(obj):
        doc = inspect.getdoc(fn) or ""
        if not doc:
            problems.append(f"{qualified}: no docstring")
            continue
        if not WHEN.search(doc):
            problems.append(f"{qualified}: does not say when it runs (eager / tf.function)")
        if not RETURNS.search(doc):
            problems.append(f"{qualified}: does not say what it returns")
    assert not problems, "\n".join(problems)


ROOT = Path(__file__).resolve().parents[1]
# Dotted names in the package (`orbitask.` optional), and paths of the repository's files.
DOTTED = re.compile(
    r"(?<![\w./-])((?:orbitask\.)?(?:tasks|trainers)\.[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)"
)
FILE = re.compile(
    r"(?<![\w./-])((?:tasks|trainers|benchmarks|tests|configs|experiments|docs)/[\w/.-]*"
    r"\.(?:py|gin|md|sh))"
)
PLACEHOLDER = re.compile(r"NAME|/my[._]")  # `experiments/NAME.gin`, `experiments/my.gin`


def _resolves(name: str) -> bool:
    """Whether a dotted name is a module of the package, or an attribute inside one."""
    parts = name.rstrip(".").removeprefix("orbitask.").split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(["orbitask", *parts[:i]]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _texts():
    folders = ("tasks", "trainers", "orbitask", "benchmarks", "tests")
    for path in [p for f in folders for p in sorted((ROOT / f).rglob("*.py"))]:
        yield path, path.read_text(encoding="utf-8")
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        yield path, path.read_text(encoding="utf-8")


def test_every_dotted_path_and_file_named_in_docs_and_code_exists():
    """A module moved or renamed leaves no docstring, comment or page naming its old place."""
    broken = []
    for path, text in _texts():
        where = path.relative_to(ROOT)
        names = [m for m in DOTTED.findall(text) if not m.endswith(".py")]  # a user's tasks.py
        broken += [f"{where}: {m}" for m in names if not _resolves(m)]
        broken += [
            f"{where}: {m}"
            for m in FILE.findall(text)
            if not PLACEHOLDER.search(m) and not (ROOT / m).exists()
        ]
    assert not broken, "names of places that do not exist:\n" + "\n".join(sorted(set(broken)))
