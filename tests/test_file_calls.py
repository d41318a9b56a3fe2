"""Every file orbitask reads or writes under a model, output or prediction directory goes through
`orbitask.common.files` (`tf.io.gfile`), so that `gs://` works as a local path does. This test
reads the product code and fails on a Python file call outside that module: `open(`, the
`os.path` functions that touch the disk or mangle a `scheme://` (`exists`, `isdir`, `abspath`,
`normpath`, ...; `join`, `basename`, `dirname` are text and work on any path), `os.listdir`,
`os.makedirs`, `os.replace`, ..., `shutil.*` and `glob`. The calls that are local by nature are
listed in ALLOWED, each with its reason."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROOM = "orbitask/common/files.py"

PATH_CALLS = {
    "exists", "isfile", "isdir", "islink", "lexists", "getsize", "getmtime", "getctime",
    "getatime", "abspath", "realpath", "normpath", "relpath", "commonpath", "samefile",
}  # fmt: skip
OS_CALLS = {
    "listdir", "makedirs", "mkdir", "replace", "rename", "remove", "unlink", "rmdir", "scandir",
    "walk", "stat", "open",
}  # fmt: skip

# (file, function): why its file calls are on local paths only
ALLOWED = {
    ("trainers/commands/train.py", "config_root"): "the installed package's own folder",
    ("trainers/commands/train.py", "_resolved"): "a --gin_file without a scheme (one with a "
    "scheme goes through files)",
    ("trainers/commands/train.py", "parse_gin"): "folders on sys.path for a gin import: local "
    ".gin files only",
    ("trainers/commands/train.py", "_inside"): "local folders on sys.path, never a bucket",
    ("trainers/commands/scaffold.py", "check_name"): "a new task's files in the working directory",
    ("trainers/commands/scaffold.py", "scaffold"): "a new task's files in the working directory",
    ("trainers/commands/scaffold.py", "main"): "a new task's files in the working directory",
    ("trainers/commands/network.py", "loopback_only"): "/proc of this process",
    ("trainers/actions/preemption.py", "_leave_closed_terminal"): "/dev/null for a closed "
    "terminal's output",
    ("trainers/distribution/slurm.py", "tf_config"): "shutil.which: a program on this host",
    ("trainers/distribution/platforms.py", "deliver"): "relpath of two paths of one gfile walk "
    "(a scheme is mangled alike in both)",
    ("trainers/state/checkpoint_manager.py", "__init__"): "a worker's checkpoints in a local "
    "temporary folder",
    ("trainers/state/checkpoint_manager.py", "_remove_abandoned"): "the local temporary folders "
    "of dead workers",
    ("trainers/state/model_dir_lock.py", "acquire"): "flock: a local or NFS lock file",
    ("trainers/state/model_dir_lock.py", "holder"): "flock: a local or NFS lock file",
    ("trainers/state/loggers.py", "run_name"): "a local model directory's name (is_local first)",
    ("trainers/commands/several_runs.py", "names"): "local runs' names (is_local first)",
    ("trainers/commands/several_runs.py", "common_folder"): "local runs' folder (is_local first)",
    ("trainers/commands/sweep.py", "_processes"): "a sweep's folder: SQLite and flock, local",
    ("trainers/commands/sweeps/study.py", "open_study"): "a sweep's SQLite file, local",
    ("trainers/commands/sweeps/study.py", "claims"): "a sweep's flock, local or NFS",
    ("trainers/commands/sweeps/sweeping.py", "__init__"): "a sweep folder's name (a local folder)",
    ("trainers/commands/ray_train.py", "_worker"): "the driver's working directory, where the "
    "worker shares its host",
}


def file_calls(source: str) -> list[tuple[str, int, str]]:
    """`(function, line, call)` of each Python file call in `source`; `function` is the
    innermost enclosing function's name ("" at module level)."""
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = function
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = child.name
            if isinstance(child, ast.Call):
                call = _name(child.func)
                if call and _is_file_call(call):
                    found.append((function, child.lineno, call))
            visit(child, name)

    visit(ast.parse(source), "")
    return found


def _name(func: ast.AST) -> str | None:
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        return ".".join([func.id, *reversed(parts)])
    return None


def _is_file_call(call: str) -> bool:
    parts = call.split(".")
    if call == "open" or parts[0] in ("shutil", "glob"):
        return True
    if parts[:2] == ["os", "path"] and len(parts) == 3:
        return parts[2] in PATH_CALLS
    return parts[0] == "os" and len(parts) == 2 and parts[1] in OS_CALLS


def product_files() -> list[Path]:
    tops = ("orbitask", "tasks", "trainers")
    return sorted(p for top in tops for p in ROOT.glob(f"{top}/**/*.py"))


def test_file_calls_go_through_the_files_module():
    wrong = []
    for path in product_files():
        relative = str(path.relative_to(ROOT))
        if relative == ROOM:
            continue
        for function, line, call in file_calls(path.read_text(encoding="utf-8")):
            if (relative, function) not in ALLOWED:
                wrong.append(f"{relative}:{line} {call}() in {function or 'the module'}")
    assert not wrong, (
        "Python file calls outside orbitask.common.files (use files.*, or add the function to "
        "ALLOWED with the reason its paths are local):\n" + "\n".join(wrong)
    )


def test_every_allowed_function_still_makes_a_file_call():
    made = set()
    for path in product_files():
        relative = str(path.relative_to(ROOT))
        made |= {(relative, f) for f, _, _ in file_calls(path.read_text(encoding="utf-8"))}
    assert not set(ALLOWED) - made, f"stale ALLOWED entries: {sorted(set(ALLOWED) - made)}"


def test_the_scan_sees_each_kind_of_call():
    source = (
        "import os, shutil, glob\n"
        "def write(model_dir):\n"
        "    with open(os.path.join(model_dir, 'x')) as f: pass\n"
        "    os.path.isfile(model_dir); os.path.join(model_dir, 'a')\n"
        "    os.makedirs(model_dir); shutil.rmtree(model_dir); glob.glob(model_dir)\n"
    )
    calls = [call for _, _, call in file_calls(source)]
    assert calls == ["open", "os.path.isfile", "os.makedirs", "shutil.rmtree", "glob.glob"]
