"""The package's rooms import each other without a circle: a room never imports a room that
imports it back. A room is a subpackage (`trainers/engine/`, `tasks/examples/`,
`orbitask/common/`, ...), or a package's own modules (`tasks/*.py`, `trainers/errors.py`,
`trainers/compat.py`); the package facades (`__init__.py`, `trainers/train.py`, which re-export
for users) are left out. `orbitask/common/` is below both `tasks/` and `trainers/`, and `tasks/`
below `trainers/`."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FACADES = {"trainers/train.py"}


def _room(relative: str) -> str:
    parts = relative.split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def _package(room: str) -> str:
    """`tasks`, `trainers` or `orbitask` (for `orbitask/common`): the top folder of a room."""
    return room.split("/")[0]


def _file_of(module: str) -> str | None:
    """The repository file of `orbitask.<module>`, or None for a name that is not a module."""
    parts = module.split(".")
    if parts[0] != "orbitask" or len(parts) < 2 or parts[1] not in ("common", "tasks", "trainers"):
        return None
    path = ROOT.joinpath(*parts) if parts[1] == "common" else ROOT.joinpath(*parts[1:])
    if path.with_suffix(".py").is_file():
        return str(path.with_suffix(".py").relative_to(ROOT))
    if (path / "__init__.py").is_file():
        return str((path / "__init__.py").relative_to(ROOT))
    return None


def import_graph() -> dict[str, dict[str, set[str]]]:
    """`{room: {room it imports: {importing file, ...}}}` over `orbitask/common/`, `tasks/` and
    `trainers/`."""
    graph: dict[str, dict[str, set[str]]] = {}
    tops = ("orbitask/common", "tasks", "trainers")
    for path in sorted(p for top in tops for p in ROOT.glob(f"{top}/**/*.py")):
        relative = str(path.relative_to(ROOT))
        if path.name == "__init__.py" or relative in FACADES:
            continue
        room = _room(relative)
        graph.setdefault(room, {})
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                # `from a.b import c`: the module a.b.c if c is one, else a.b itself
                targets = [_file_of(f"{node.module}.{a.name}") or _file_of(node.module)
                           for a in node.names]  # fmt: skip
            elif isinstance(node, ast.Import):
                targets = [_file_of(a.name) for a in node.names]
            else:
                continue
            for target in filter(None, targets):
                if target.endswith("__init__.py") or target in FACADES:
                    continue  # a facade's re-export: not a room's import
                other = _room(target)
                if other != room:
                    graph[room].setdefault(other, set()).add(relative)
    return graph


def _circles(graph: dict[str, dict[str, set[str]]]) -> list[str]:
    """Each pair of rooms that reach each other, with the files that make the first step."""

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            room = todo.pop()
            if room == goal:
                return True
            if room not in seen:
                seen.add(room)
                todo += list(graph.get(room, {}))
        return False

    return [
        f"{a} -> {b} ({', '.join(sorted(files))}) and back"
        for a, targets in sorted(graph.items())
        for b, files in sorted(targets.items())
        if reaches(b, a)
    ]


def test_no_room_imports_a_room_that_imports_it_back():
    circles = _circles(import_graph())
    assert not circles, "import circles between rooms:\n" + "\n".join(circles)


def _upward(graph: dict[str, dict[str, set[str]]]) -> list[str]:
    """Each import from a lower package into a higher one (common < tasks < trainers)."""
    order = {"orbitask": 0, "tasks": 1, "trainers": 2}
    return [
        f"{a} -> {b} ({', '.join(sorted(files))})"
        for a, targets in sorted(graph.items())
        for b, files in sorted(targets.items())
        if order[_package(b)] > order[_package(a)]
    ]


def test_common_is_below_tasks_and_tasks_below_trainers():
    graph = import_graph()
    assert "orbitask/common" in graph and "tasks" in graph["trainers/engine"]
    upward = _upward(graph)
    assert not upward, "imports from a lower package into a higher one:\n" + "\n".join(upward)


def test_the_check_sees_a_circle():
    graph = {"a": {"b": {"a/x.py"}}, "b": {"c": {"b/y.py"}}, "c": {"a": {"c/z.py"}}}
    assert _circles(graph) == [
        "a -> b (a/x.py) and back", "b -> c (b/y.py) and back", "c -> a (c/z.py) and back"
    ]  # fmt: skip
