"""The "By module" index of tests/README.md: each product module and the test files that
exercise it, derived from the tests' source.

A test file exercises a module when it imports the module or a name from it (a package's public
name counts for the module defining it: `from orbitask import Task` is `tasks/base.py`), names
it in a string (`"orbitask.trainers.commands.train"` run with `-m`, a gin binding
`orbitask.run_experiment.seed` or `orbitask.DigitsClassification.hidden_units`, a path such as
`trainers/commands/launch.py`), calls the CLI command it implements (`cli.main(["report", ...])`,
`[..., "orbitask.trainers.commands.cli", "sweep", ...]`), calls a helper of tests/ (`faults`,
`launching`, ...) whose body names such a module or command, or names it in its own row of
"What each file guards" (the break it catches).

    python tests/by_module.py          # prints the section
    python tests/by_module.py --write  # replaces the section in tests/README.md

Plain Python (ast and the files), no TensorFlow: it runs in a second. `test_readme.py` keeps the
section complete (every module listed, every listed test file present).
"""

from __future__ import annotations

import ast
import re
import sys
import warnings
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
README = TESTS / "README.md"
ROOTS = {"orbitask": "orbitask", "orbitask.tasks": "tasks", "orbitask.trainers": "trainers"}
HEADING = "## By module"
CLI = "orbitask.trainers.commands.cli"


def product_modules() -> dict[str, str]:
    """`{dotted name: path from the repository}` of every .py under orbitask/, tasks/ and
    trainers/ (a package's `__init__.py` is the package)."""
    modules = {}
    for package, folder in ROOTS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([package, *parts])
            if package == "orbitask" and parts[:1] in (("tasks",), ("trainers",)):
                continue  # not there: tasks/ and trainers/ are the subpackages
            modules[name] = str(path.relative_to(REPO))
    return modules


MODULES = product_modules()


def _package_names() -> dict[str, dict[str, str]]:
    """`{package: {public name: defining module}}` from each package's imports (the
    TYPE_CHECKING block of the lazy packages)."""
    names: dict[str, dict[str, str]] = {}
    for module, path in MODULES.items():
        if not path.endswith("__init__.py"):
            continue
        for node in ast.walk(ast.parse((REPO / path).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in MODULES:
                for alias in node.names:
                    names.setdefault(module, {})[alias.asname or alias.name] = node.module
    return names


PACKAGE_NAMES = _package_names()


def _commands() -> dict[str, str]:
    """`{command: module}` from the CLI's table (`orbitask report`: commands.report)."""
    tree = ast.parse((REPO / MODULES[CLI]).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "COMMANDS":
            table = ast.literal_eval(node.value)
            return {name: module for name, (module, _) in table.items()}
    raise AssertionError(f"no COMMANDS table in {MODULES[CLI]}")


COMMANDS = _commands()


def resolve(dotted: str) -> set[str]:
    """The product modules a dotted name means: the longest module it starts with, and a
    package's public name resolved to its defining module (`orbitask.run_experiment.seed`:
    trainers/run/experiment.py)."""
    if dotted.split(".")[0] in ("tasks", "trainers"):  # imported from the repository's root
        dotted = f"orbitask.{dotted}"
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        head = ".".join(parts[:end])
        if head in MODULES:
            found = {head}
            if end < len(parts) and parts[end] in PACKAGE_NAMES.get(head, {}):
                found |= resolve(".".join([PACKAGE_NAMES[head][parts[end]], *parts[end:]]))
            return found
    return set()


def named_in(text: str) -> set[str]:
    """The product modules of the dotted names in `text` (`@orbitask.DigitsCNN()`)."""
    return set().union(set(), *(resolve(d) for d in re.findall(r"orbitask(?:\.\w+)+", text)))


EXPERIMENTS = {  # an experiment's file name -> the modules its bindings name
    p.name: named_in(p.read_text()) for p in sorted((REPO / "experiments").glob("*.gin"))
}


def _path_module(text: str) -> set[str]:
    """The module a path string names (`trainers/commands/launch.py`), if any."""
    path = text.lstrip("./")
    return {m for m, p in MODULES.items() if p == path}


def _joined(node: ast.AST) -> str | None:
    """The string a `REPO / "trainers" / "launch.py"`-like expression ends in, or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        left, right = _joined(node.left), _joined(node.right)
        return f"{left}/{right}" if left and right else right
    return None


class Uses(ast.NodeVisitor):
    """The product modules one file's source exercises, and the helpers of tests/ it calls."""

    def __init__(self, helpers: dict[str, dict[str, set[str]]] | None = None):
        self.modules: set[str] = set()
        self.aliases: dict[str, str] = {}  # a local name -> the dotted name it is bound to
        self.helpers = helpers or {}

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.modules |= resolve(alias.name)
            self.aliases[alias.asname or alias.name.split(".")[0]] = (
                alias.name if alias.asname else alias.name.split(".")[0]
            )

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        for alias in node.names:
            dotted = f"{module}.{alias.name}"
            self.modules |= resolve(dotted)
            self.aliases[alias.asname or alias.name] = dotted
            if module.startswith("tests") and alias.name in self.helpers.get(module, {}):
                self.modules |= self.helpers[module][alias.name]

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain, base = [], node
        while isinstance(base, ast.Attribute):
            chain.append(base.attr)
            base = base.value
        if isinstance(base, ast.Name) and base.id in self.aliases:
            dotted = ".".join([self.aliases[base.id], *reversed(chain)])
            self.modules |= resolve(dotted)
            module, _, function = dotted.rpartition(".")
            self.modules |= self.helpers.get(module, {}).get(function, set())
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            self._text(node.value)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        joined = _joined(node)
        if joined:
            self._text(joined)
        self.generic_visit(node)

    def _text(self, text: str) -> None:
        """A string: dotted names in it, the module of a path, an experiment's .gin file, or
        Python code (a program a test runs) read as code."""
        if "\n" in text:
            try:
                with warnings.catch_warnings():  # text that is not code: escapes it holds
                    warnings.simplefilter("ignore")
                    tree = ast.parse(text)
                self.visit(tree)
                return
            except SyntaxError:
                pass
        self.modules |= named_in(text) | _path_module(text)
        if text == "*.gin":  # every experiment, as a test that builds them all globs them
            self.modules |= set().union(*EXPERIMENTS.values())
        self.modules |= EXPERIMENTS.get(text.rpartition("experiments/")[2], set())

    def visit_List(self, node: ast.List) -> None:
        """`cli.main(["report", ...])` and `[..., "orbitask.trainers.commands.cli", "sweep"]`."""
        texts = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
        for before, text in zip([CLI, *texts], texts, strict=False):
            if before == CLI and text in COMMANDS:
                self.modules |= resolve(COMMANDS[text])
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "main"
            and isinstance(func.value, ast.Name)
            and self.aliases.get(func.value.id) == CLI
            and node.args
            and isinstance(node.args[0], ast.List)
            and node.args[0].elts
            and isinstance(node.args[0].elts[0], ast.Constant)
            and node.args[0].elts[0].value in COMMANDS
        ):
            self.modules |= resolve(COMMANDS[node.args[0].elts[0].value])
        self.generic_visit(node)


def helper_functions() -> dict[str, dict[str, set[str]]]:
    """`{"tests.faults": {"command": {modules}}, ...}`: what each top-level function of a helper
    of tests/ names (strings, paths, module-level constants it reads), other helpers' functions
    it calls included."""
    helpers: dict[str, dict[str, set[str]]] = {}
    trees = {
        f"tests.{p.stem}": ast.parse(p.read_text())
        for p in sorted(TESTS.glob("*.py"))
        if not p.name.startswith(("test_", "conftest", "by_module"))
    }
    for _ in range(3):  # a helper calling another helper's function: a few rounds settle it
        for module, tree in trees.items():
            constants = {}
            for node in tree.body:
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                    uses = Uses(helpers)
                    uses.visit(node.value)
                    constants[node.targets[0].id] = uses.modules
            imports = Uses(helpers)
            for node in tree.body:
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    imports.visit(node)
            own = helpers.setdefault(module, {})
            for node in tree.body:
                if isinstance(node, ast.FunctionDef):
                    uses = Uses(helpers)
                    uses.aliases = dict(imports.aliases)
                    uses.visit(node)
                    for name in {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}:
                        uses.modules |= constants.get(name, set()) | own.get(name, set())
                    own[node.name] = uses.modules
    return helpers


def _guard_rows() -> dict[str, set[str]]:
    """`{test file: modules}` that "What each file guards" names in each file's row."""
    rows: dict[str, set[str]] = defaultdict(set)
    for line in README.read_text().splitlines():
        if match := re.match(r"^\| `(test_\w+\.py)` \|", line):
            for path in re.findall(r"`((?:orbitask|tasks|trainers)/[\w/]+\.py)`", line):
                rows[match.group(1)] |= _path_module(path)
    return rows


def index() -> dict[str, list[str]]:
    """`{module path: [test file, ...]}` for every product module, in path order."""
    helpers = helper_functions()
    guards = _guard_rows()
    by_module: dict[str, set[str]] = {path: set() for path in MODULES.values()}
    for test in sorted(TESTS.glob("test_*.py")):
        uses = Uses(helpers)
        uses.visit(ast.parse(test.read_text()))
        same_name = {m for m, p in MODULES.items() if Path(p).stem == test.stem[len("test_") :]}
        for module in uses.modules | guards.get(test.name, set()) | same_name:
            by_module[MODULES[module]].add(test.name)
    for path, tests in BY_HAND.items():
        by_module[path] |= {t for t in tests if (TESTS / t).exists()}
    return {path: sorted(by_module[path]) for path in sorted(by_module)}


# Checked by hand: modules the rules above do not reach, each with the tests whose docstrings
# and assertions are about its mechanism.
BY_HAND = {
    "orbitask/lazy.py": ["test_public_names.py"],
    "tasks/extra_losses.py": ["test_real_count.py"],
    "tasks/multi_task_model.py": ["test_multi_task.py"],
    "tasks/scalar_batch.py": ["test_deferred_callbacks.py", "test_summaries_metrics.py"],
    "tasks/step_signature.py": ["test_model_garden.py", "test_own_step.py"],
    "trainers/actions/step_rate.py": ["test_cli_progress.py", "test_report.py"],
    "trainers/engine/kept_step.py": ["test_step_tensors.py"],
    "trainers/engine/ps_trainer.py": ["test_parameter_server.py"],
    "trainers/engine/replica_batches.py": ["test_real_count.py"],
    "trainers/engine/user_code.py": ["test_errors.py", "test_run_eagerly.py"],
    "trainers/run/batch_checks.py": ["test_bad_input.py", "test_per_example_loss.py"],
    "trainers/run/dry_step.py": ["test_own_step.py"],
    "trainers/run/folders.py": ["test_platforms.py", "test_read_only.py"],
    "trainers/run/entries.py": ["test_cli_progress.py", "test_profiling.py", "test_signals.py"],
    "trainers/state/tuning_loggers.py": ["test_search_tools.py"],
}


def importers() -> dict[str, list[str]]:
    """`{module path: [paths of the product modules importing it]}`."""
    found: dict[str, set[str]] = defaultdict(set)
    for module, path in MODULES.items():
        uses = Uses()
        uses.visit(ast.parse((REPO / path).read_text()))
        for used in uses.modules - {module}:
            found[MODULES[used]].add(path)
    return {path: sorted(paths) for path, paths in found.items()}


def _only_a_docstring(path: str) -> bool:
    body = ast.parse((REPO / path).read_text()).body
    return len(body) == 1 and isinstance(body[0], ast.Expr)


def section() -> str:
    """The Markdown section, heading included."""
    lines = [
        HEADING,
        "",
        "Each module of orbitask/, tasks/ and trainers/, and the test files that exercise it: that",
        "import it or a name from it, name it (a `-m` module, a gin binding, a path), run the CLI",
        "command it implements, or name it in their row above. Made by `python tests/by_module.py",
        "--write` (the rules in its docstring); `test_readme.py` fails for a module missing here",
        "or a test file listed here that does not exist. A test file named after a module",
        "(`test_triggers.py`, `triggers.py`) exercises it. A module no test reaches by those",
        "rules and none checked by hand (`BY_HAND` there) says `none named` and the modules that",
        "import it, whose rows name its tests.",
        "",
        "| module | test files |",
        "|---|---|",
    ]
    callers = importers()
    for path, tests in index().items():
        if tests:
            named = ", ".join(f"`{t}`" for t in tests)
        elif _only_a_docstring(path):
            named = "none named (a package's docstring only)"
        else:
            through = ", ".join(f"`{p}`" for p in callers.get(path, []))
            named = f"none named; through {through}" if through else "none named"
        lines.append(f"| `{path}` | {named} |")
    return "\n".join(lines) + "\n"


def write() -> None:
    """Replaces the section in tests/README.md (appended where there is none)."""
    text = README.read_text()
    start = text.find(f"\n{HEADING}\n")
    if start < 0:
        README.write_text(text.rstrip("\n") + "\n\n" + section())
        return
    end = text.find("\n## ", start + 1)
    rest = text[end:] if end >= 0 else ""
    README.write_text(text[: start + 1] + section() + rest)


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        print(section(), end="")
