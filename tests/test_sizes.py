"""The product code stays small enough to read: no function over 60 lines, no module over 350,
in `tasks/`, `trainers/` and `orbitask/`, but the few listed in `ALLOWED` with their reasons. A
function's length counts from its `def` to its last line, docstring included; a module's, all
its lines."""

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOPS = ("tasks", "trainers", "orbitask")
FUNCTION_LINES = 60
MODULE_LINES = 350

# "path" for a module, "path:function" for a function: why it may be longer, for now.
ALLOWED: dict[str, str] = {}


def oversized(relative: str, source: str) -> list[str]:
    """`path (N lines)` for a module over `MODULE_LINES`, `path:name (N lines)` for each
    function or method over `FUNCTION_LINES`."""
    found = []
    lines = len(source.splitlines())
    if lines > MODULE_LINES:
        found.append(f"{relative} ({lines} lines)")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > FUNCTION_LINES:
                found.append(f"{relative}:{node.name} ({length} lines)")
    return found


@functools.cache
def _product() -> dict[str, list[str]]:
    """`{name: [what is over]}` over the product's modules, `name` as `ALLOWED` keys it."""
    over: dict[str, list[str]] = {}
    for top in TOPS:
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = str(path.relative_to(ROOT))
            for line in oversized(relative, path.read_text(encoding="utf-8")):
                over.setdefault(line.rpartition(" (")[0], []).append(line)
    return over


def test_no_function_over_60_lines_and_no_module_over_350():
    over = _product()
    unlisted = [line for name, lines in over.items() if name not in ALLOWED for line in lines]
    assert not unlisted, (
        "over the limits (split them, or list them in tests/test_sizes.py's ALLOWED with a "
        "reason):\n" + "\n".join(unlisted)
    )


def test_every_allowed_entry_is_still_over():
    over = _product()
    within = [name for name in ALLOWED if name not in over]
    assert not within, f"within the limits now: remove from ALLOWED: {within}"


def test_the_scan_sees_a_long_function_and_a_long_module():
    body = "\n".join(f"        x{i} = {i}" for i in range(FUNCTION_LINES))
    source = f"class A:\n    def long(self):\n{body}\n" + "\n" * MODULE_LINES
    assert oversized("m.py", source) == [
        f"m.py ({MODULE_LINES + FUNCTION_LINES + 2} lines)",
        f"m.py:long ({FUNCTION_LINES + 1} lines)",
    ]
    assert oversized("m.py", "def short():\n    return 1\n") == []
