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


# A gin binding `orbitask.<configurable>.<parameter>` (not a module path, not a call), and the
# `.<parameter>` shorthands that follow one in a list (`orbitask.Task.clip_norm`, `.seed`).
BINDING = re.compile(
    r"(?<![\w./-])orbitask\.(?!(?:tasks|trainers|common|configs|experiments|lazy)\b)"
    r"([A-Za-z_]\w*)\.([A-Za-z_]\w*)\b(?![.(])"
)
SHORTHAND = re.compile(r"`\.([a-z_]\w*)`")
REFERENCE = re.compile(r"@orbitask\.([A-Za-z_]\w*)\(")  # `= @orbitask.NanGuard()`, `.patience`


def _bindings(text: str) -> set[str]:
    """The gin bindings a page names: each `orbitask.X.y`, and each `.z` after one on its line
    (as `orbitask.X.z`, X the last configurable bound or referenced there)."""
    found = set()
    either = "|".join(p.pattern for p in (BINDING, SHORTHAND, REFERENCE))
    for line in text.splitlines():
        last = None
        for match in re.finditer(either, line):
            configurable, parameter, short, referenced = match.groups()
            if configurable is not None:
                last = configurable
                found.add(f"orbitask.{configurable}.{parameter}")
            elif referenced is not None:
                last = referenced
            elif last is not None:
                found.add(f"orbitask.{last}.{short}")
    return found


def test_every_gin_binding_named_in_the_docs_exists():
    """Each binding README.md and docs/ name is a parameter of a configurable gin knows (gin
    refuses to bind an unknown configurable or parameter)."""
    import gin

    import orbitask

    orbitask.load_all()
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    named = {(p.relative_to(ROOT), b) for p in pages for b in _bindings(p.read_text("utf-8"))}
    assert len(named) > 40  # the pattern finds the bindings the pages name
    broken = []
    for where, binding in sorted(named):
        try:
            gin.bind_parameter(binding, None)
        except ValueError as e:
            broken.append(f"{where}: {binding}: {e}")
    gin.clear_config()
    assert not broken, "bindings that do not exist:\n" + "\n".join(broken)
