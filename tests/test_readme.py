"""The README and docs/*.md are executed, so the documentation cannot rot.

Every fenced code block of a document, by its language:

  python  run in document order, each in a fresh namespace, in one process per document. A block
          whose first line is `# NAME.py` is instead written to that file (and imported), so the
          blocks and commands after it can use it.
  gin     parsed by the binary's parser (trainers.commands.train.parse_gin); a block whose first
          line is `# NAME.gin` is also written to that file.
  bash    run with `bash -e`, in document order, with `orbitask` on PATH.
  text    (or no language) output samples, pseudo-code and trees: not code.

Everything runs in a fresh temporary folder (relative paths such as runs/... land there).
Skipped: the two set-up blocks after `<!-- main-command -->` and `<!-- test-command -->` (CI runs
the test command itself), a block right after `<!-- not-run: REASON -->`, and shell blocks that
start processes on a cluster (`orbitask launch`, TF_CONFIG). The main command's training run
(its part after the venv set-up) does run, and must print the lines of the ```text block after
it, in form (`matches_expected`), with an eval accuracy of at least 0.9.

`python tests/test_readme.py BLOCKS.json` is the per-document runner the test starts.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SETUP_MARKERS = ("<!-- main-command -->", "<!-- test-command -->")
SETUP_COMMANDS = {
    "<!-- main-command -->": 'python3 -m venv .venv && .venv/bin/pip install -q -e ".[dev]" && '
    ".venv/bin/orbitask --gin_file=experiments/digits.gin --model_dir=runs/digits",
    "<!-- test-command -->": 'python3 -m venv .venv && .venv/bin/pip install -q -e ".[dev]" && '
    ".venv/bin/python -m pytest tests --durations=25",
}
CLUSTER = re.compile(r"orbitask launch|TF_CONFIG")
LANGUAGES = {"python", "gin", "bash", "sh", "text", ""}
FILE_LINE = re.compile(r"#\s*([\w./-]+\.(py|gin))\s*$")


def blocks(path: Path) -> list[dict]:
    """Every fenced block of a Markdown file: language, code, line, marker, written file."""
    out, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^```\s*([\w-]*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            i += 1
        code = "\n".join(lines[start + 1 : i]) + "\n"
        before = [line.strip() for line in lines[:start] if line.strip()]
        first = code.splitlines()[0] if code.strip() else ""
        named = FILE_LINE.match(first)
        out.append(
            dict(
                language=fence.group(1).lower(),
                code=code,
                line=start + 1,
                marker=before[-1] if before and before[-1].startswith("<!--") else "",
                file=named.group(1) if named else None,
            )
        )
        i += 1
    return out


def _skipped(block: dict) -> bool:
    if block["marker"] in SETUP_MARKERS or block["marker"].startswith("<!-- not-run:"):
        return True
    return block["language"] in ("bash", "sh") and bool(CLUSTER.search(block["code"]))


def _env() -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CONFIG", None)
    env.pop("PYTHONPATH", None)  # the repo root on it makes gin read configs/ as a package
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)


def _check(result: subprocess.CompletedProcess, what: str) -> None:
    tail = (result.stdout[-3000:] + "\n" + result.stderr[-3000:]).strip()
    assert result.returncode == 0, f"{what} failed (exit {result.returncode}):\n{tail}"
    assert "Traceback" not in result.stderr, f"{what} printed a traceback:\n{tail}"


# ------------------------------------------------------------------------------------- tests


def test_setup_commands_are_intact():
    found = {b["marker"]: b for b in blocks(REPO / "README.md") if b["marker"] in SETUP_MARKERS}
    for marker, command in SETUP_COMMANDS.items():
        assert marker in found, f"README.md lost its {marker} block"
        assert found[marker]["language"] == "bash"
        assert found[marker]["code"].strip() == command


def main_command_and_expected_output(readme: str) -> tuple[str, list[str]]:
    """The README's main command, as run after set-up (the part after the last `&&`, with
    `orbitask` from PATH), and the lines of the first ```text block after it: what it prints
    at its end. Read from the README each time, so the test follows its wording."""
    after = readme.split("<!-- main-command -->", 1)[1]
    command = re.search(r"^```bash\s*\n(.*?)^```", after, re.S | re.M)
    expected = re.search(r"^```text\s*\n(.*?)^```", after, re.S | re.M)
    assert command and expected, "README.md: no bash block and ```text block after main-command"
    run = command.group(1).strip().split("&&")[-1].strip()
    return run.removeprefix(".venv/bin/"), [x for x in expected.group(1).splitlines() if x]


def matches_expected(expected: str, printed: str) -> bool:
    """Whether a printed line has the form of an expected one: each decimal number of `expected`
    stands for any number with at most as many significant digits (the binary prints `.4g`,
    which drops trailing zeros); everything else (words, the step, paths) must be as written."""
    parts, digits, pos = [], [], 0
    for number in re.finditer(r"\d+\.\d+", expected):
        parts += [re.escape(expected[pos : number.start()]), r"(\d+(?:\.\d+)?)(?:e[-+]\d+)?"]
        digits.append(_significant(number.group()))
        pos = number.end()
    match = re.fullmatch("".join([*parts, re.escape(expected[pos:])]), printed)
    return bool(match) and all(
        _significant(g) <= n for g, n in zip(match.groups(), digits, strict=True)
    )


def _significant(number: str) -> int:
    return len(number.replace(".", "").lstrip("0"))


def test_matches_expected_keeps_the_number_format():
    line = "eval at step 1000: accuracy 0.9721, loss 0.09554"
    assert matches_expected(line, "eval at step 1000: accuracy 0.9512, loss 0.1234")
    assert matches_expected(line, "eval at step 1000: accuracy 0.97, loss 1.2e-05")
    assert not matches_expected(line, "eval at step 1000: accuracy 0.951253, loss 0.1234")
    assert not matches_expected(line, "eval at step 999: accuracy 0.9512, loss 0.1234")
    assert not matches_expected(line, "eval at step 1000: accuracy nan, loss 0.1234")
    assert not matches_expected(line, "eval at step 1000: loss 0.1234, accuracy 0.9512")


@pytest.mark.slow
def test_main_command_prints_what_the_readme_shows(tmp_path):
    """The main command (the digits experiment, ~10 s) prints the README's expected lines, in
    order and in form, with an accuracy of at least 0.9."""
    command, expected = main_command_and_expected_output((REPO / "README.md").read_text())
    assert command.startswith("orbitask "), command
    result = _run(["bash", "-e", "-c", command], tmp_path)
    _check(result, f"the main command `{command}`")
    printed = [line.strip() for line in result.stdout.splitlines()]
    position = 0
    for line in expected:
        found = [
            i
            for i, out in enumerate(printed[position:], position)
            if matches_expected(line.strip(), out)
        ]
        assert found, f"no line like {line!r} after line {position} of:\n{result.stdout[-2000:]}"
        position = found[0] + 1
        accuracy = re.search(r"accuracy (\d+\.\d+)", printed[found[0]])
        if accuracy:
            assert float(accuracy.group(1)) >= 0.9, printed[found[0]]
    assert any("accuracy" in line for line in expected), "the README shows no eval line"


def test_every_block_has_a_known_language():
    for document in DOCUMENTS:
        for block in blocks(document):
            assert block["language"] in LANGUAGES, (
                f"{document.name}:{block['line']}: ```{block['language']} blocks are not run; "
                "use python, gin, bash or text (see tests/test_readme.py)"
            )


def test_the_readme_runs_python_gin_and_shell_blocks():
    runnable = [b for b in blocks(REPO / "README.md") if not _skipped(b)]
    kinds = {b["language"] for b in runnable}
    assert {"python", "gin", "bash"} <= kinds, kinds


README_MAX_LINES = 250
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_the_readme_is_a_short_guide():
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines; keep it a user's guide of at most {README_MAX_LINES} and "
        "move reference material into docs/ (see its 'Where to read on')"
    )


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors for a Markdown file's headings: lower case, punctuation dropped."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    headings = re.findall(r"^#+\s+(.*?)\s*$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_links_between_documents_resolve():
    broken = []
    for document in DOCUMENTS:
        text = re.sub(r"^```.*?^```", "", document.read_text(), flags=re.S | re.M)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            resolved = (document.parent / path).resolve() if path else document
            if not resolved.exists():
                broken.append(f"{document.name}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{document.name}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def _listed_modules(text: str) -> set[str]:
    """The modules the first ```text tree of the architecture page names, as paths: a line
    `name/` opens a package (its indent is its depth), `name.py` is a module in the open one."""
    tree = re.search(r"^```text\n(.*?)^```", text, re.S | re.M).group(1)
    listed, open_packages = set(), []
    for line in tree.splitlines():
        entry = line.split()[0] if line.strip() else ""
        depth = (len(line) - len(line.lstrip())) // 2
        if entry.endswith("/"):
            open_packages[depth:] = [entry.rstrip("/")]
        elif entry.endswith(".py") and "/" not in entry:
            listed.add("/".join([*open_packages[:depth], entry]))
    return listed


def test_the_architecture_page_names_every_module():
    modules = {
        str(path.relative_to(REPO))
        for top in ("orbitask/common", "tasks", "trainers")
        for path in (REPO / top).rglob("*.py")
        if path.name != "__init__.py"
    }
    listed = _listed_modules((REPO / "docs" / "architecture.md").read_text())
    assert modules == listed, (
        "docs/architecture.md's tree of modules is out of date. "
        f"Not listed: {sorted(modules - listed)}; listed but absent: {sorted(listed - modules)}."
    )


def test_the_tests_by_module_index_lists_every_module_and_only_test_files_that_exist():
    """tests/README.md's "By module" section (made by tests/by_module.py): every module of
    orbitask/, tasks/ and trainers/ has its row, no row names a module that is gone, and each
    test file a row names exists."""
    text = (REPO / "tests" / "README.md").read_text()
    assert "\n## By module\n" in text, "tests/README.md lost its '## By module' section"
    section = text.split("\n## By module\n", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `([\w/]+\.py)` \| (.*) \|$", section, re.M))
    modules = {
        str(path.relative_to(REPO))
        for top in ("orbitask", "tasks", "trainers")
        for path in (REPO / top).rglob("*.py")
    }
    missing, gone = sorted(modules - set(rows)), sorted(set(rows) - modules)
    absent = sorted(
        {t for named in rows.values() for t in re.findall(r"`(test_\w+\.py)`", named)}
        - {p.name for p in (REPO / "tests").glob("test_*.py")}
    )
    assert not missing and not gone and not absent, (
        f"tests/README.md's 'By module' index is out of date. Modules without a row: {missing}; "
        f"rows of modules that do not exist: {gone}; test files listed that do not exist: "
        f"{absent}. Run `python tests/by_module.py --write`."
    )


def _document_id(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_docs_exist():
    names = {p.name for p in DOCUMENTS}
    for guide in ("porting_from_seed.md", "porting_from_model_garden.md", "porting_from_keras.md"):
        assert guide in names, f"docs/{guide} is missing"


@pytest.mark.slow
@pytest.mark.parametrize("document", DOCUMENTS, ids=_document_id)
def test_document_runs(document, tmp_path):
    chosen = [b for b in blocks(document) if not _skipped(b)]
    for block in chosen:
        if block["file"]:
            target = tmp_path / block["file"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block["code"])
    inline = [b for b in chosen if b["language"] in ("python", "gin")]
    shell = [b for b in chosen if b["language"] in ("bash", "sh")]
    if not inline and not shell:
        pytest.skip(f"{document.name} has no code blocks")
    spec = tmp_path / "_blocks.json"
    spec.write_text(json.dumps({"document": document.name, "blocks": inline}))

    def run_inline():
        if inline:
            result = _run([sys.executable, __file__, str(spec)], tmp_path)
            _check(result, f"{document.name}'s python and gin blocks")

    def run_shell():
        for block in shell:
            result = _run(["bash", "-e", "-o", "pipefail", "-c", block["code"]], tmp_path)
            _check(result, f"{document.name}:{block['line']} (bash)")

    with ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(run_inline), pool.submit(run_shell)]:
            future.result()


# ------------------------------------------------------------------------- the block runner


def _run_blocks(spec_path: str) -> int:
    """Parses the gin blocks, then runs the python blocks; the first failure exits 1."""
    spec = json.loads(Path(spec_path).read_text())
    sys.path.insert(0, os.getcwd())
    import gin

    from orbitask.trainers.commands import train

    for block in spec["blocks"]:
        where = f"{spec['document']}:{block['line']}"
        try:
            if block["language"] == "gin":
                path = block["file"] or f"_block_{block['line']}.gin"
                Path(path).write_text(block["code"])
                gin.clear_config()
                train.parse_gin([path], [])
                gin.clear_config()  # gin bindings must not reach the python blocks
            elif block["file"]:
                if block["file"].endswith(".py") and "/" not in block["file"]:
                    __import__(block["file"][:-3])
            else:  # from a file, so that AutoGraph and tracebacks can read the source
                path = f"_{spec['document']}_line{block['line']}.py"
                Path(path).write_text(block["code"])
                runpy.run_path(path, run_name="__main__")
        except BaseException:  # noqa: BLE001 -- report which block failed, then stop
            print(f"{where} ({block['language']} block) failed:", file=sys.stderr, flush=True)
            traceback.print_exc()
            return 1
        print(f"{where} ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_run_blocks(sys.argv[1]))
