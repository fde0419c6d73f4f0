"""The map of the code checks itself: the code tour names every module, and every file, module or class
a comment, a docstring or a page names exists; no comment cites a document or an issue a reader cannot open."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from helpers import REPO

pytestmark = pytest.mark.unit

PACKAGE = REPO / "taskweaver_lite"
TOUR = REPO / "docs" / "code-tour.md"
# A path names one of ours when it starts with one of our folders (`kernel/base.py`, `tests/helpers.py`).
PATH = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.py)\b")
MODULE = re.compile(r"\btaskweaver_lite(?:\.\w+)+")
# What a reader cannot open: our internal documents and issue tracker (this file and test_docs.py hold the pattern).
CITATIONS = re.compile(r"CONTRACT|\b[Ii]ssues? #?\d|§")
CLASS = re.compile(r"`([A-Z][a-z]+(?:[A-Z][a-z0-9]*)+)[`(.]")
# Names in backticks that are not classes of ours: Windows' file-locking call, pandas' table, jupyter_server's kernel
# manager, the CodeInterpreter's alias, the key of a fold's JSON reply.
NOT_CLASSES = {"LockFileEx", "DataFrame", "MappingKernelManager", "CodeInterpreter", "ConversationSummary"}
# Entry-point groups are named like modules: `taskweaver_lite.roles` is also a folder, these are not.
ENTRY_POINT_GROUPS = {"taskweaver_lite.role_adapters"}


@cache
def tracked() -> tuple[str, ...]:
    """The repository's files, as git knows them (other projects' files under tests/data left out)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True)
    return tuple(name for name in listed.stdout.split() if not name.startswith("tests/data/") and (REPO / name).is_file())


def modules() -> list[Path]:
    """Every module of the package with code in it (a subpackage's empty `__init__` is not a module of the tour)."""
    return [path for path in sorted(PACKAGE.rglob("*.py")) if path.name != "__init__.py" or path.parent == PACKAGE]


# What a reader reads in a module: its comments, and its docstrings (a triple-quoted string that opens the
# file or follows a `def` or `class` line).
# Read by pattern, not parsed: the check runs in the quick tier over every file.
COMMENT = re.compile(r"(?:^|\s)#\s?(.*)$", re.MULTILINE)
DOCSTRING = re.compile(r'^[ \t]*[rRuU]?"""(.*?)"""', re.MULTILINE | re.DOTALL)


def prose(name: str, text: str) -> Iterator[tuple[int, str]]:
    """(line, text) of what a reader reads in the file `name` holding `text`: a page's `code` spans; a module's comments and docstrings."""
    docstrings = (m for m in DOCSTRING.finditer(text) if text[: m.start()].rstrip().endswith(":") or not text[: m.start()].strip())
    spans = re.finditer(r"`([^`\n]+)`", text) if name.endswith(".md") else (*COMMENT.finditer(text), *docstrings)
    yield from ((text[: m.start(1)].count("\n") + 1, m.group(1)) for m in spans)


def readable() -> list[str]:
    """The files whose prose names our files: the package, tests, benches, the docs and the top-level pages (the changelog names old places on purpose)."""
    ours = ("taskweaver_lite", "tests", "bench", "docs", "prompts")
    return [name for name in tracked() if (name.endswith(".md") and name != "CHANGELOG.md") or (name.endswith(".py") and name.split("/")[0] in ours)]


def test_the_code_tour_names_every_module() -> None:
    rows = [line for line in TOUR.read_text(encoding="utf-8").splitlines() if line.startswith("| `")]
    missing = []
    for path in modules():
        inside = path.relative_to(PACKAGE)
        folder = f"`{inside.parent.as_posix()}/`" if inside.parent != Path(".") else None
        named = any(f"{inside.as_posix()}`" in row or (folder is not None and folder in row and f"`{inside.name}`" in row) for row in rows)
        if not named:
            missing.append(inside.as_posix())
    assert missing == [], f"docs/code-tour.md does not name these modules (a row naming `folder/module.py`, or the folder's row naming `module.py`): {missing}"


@cache
def known() -> tuple[frozenset[str], frozenset[str], frozenset[str], frozenset[str]]:
    """The repository's files, the names of its Python files, our top-level folders, and the package's dotted module names."""
    files = frozenset(tracked())
    basenames = frozenset(Path(file).name for file in files if file.endswith(".py"))
    folders = frozenset({path.name for path in PACKAGE.iterdir() if path.is_dir()} | {"taskweaver_lite", "tests", "bench", "docs", "prompts", "project"})
    dotted = {".".join(Path(file).with_suffix("").parts).removesuffix(".__init__") for file in files if file.startswith("taskweaver_lite/")}
    return files, basenames, folders, frozenset(dotted | {"taskweaver_lite.prompts", "taskweaver_lite.default_project", *ENTRY_POINT_GROUPS})


def dead_names(name: str, text: str) -> Iterator[str]:
    """`file:line: name` for each file path, package module or class the prose of the file `name` (holding `text`) names that does not exist."""
    files, basenames, folders, dotted = known()
    for line, chunk in prose(name, text):
        for match in PATH.finditer(chunk):
            path = match.group(1)
            found = path.split("/")[0] not in folders or {path, f"taskweaver_lite/{path}"} & files if "/" in path else path in basenames
            if not found:
                yield f"{name}:{line + chunk[: match.start()].count(chr(10))}: {path}"
        for match in MODULE.finditer(chunk):
            module, _, attribute = match.group(0).rpartition(".")
            if match.group(0) not in dotted and not (module in dotted and attribute in defined_names()):
                yield f"{name}:{line + chunk[: match.start()].count(chr(10))}: {match.group(0)}"
        if name.startswith("taskweaver_lite/"):
            dead = (m for m in CLASS.finditer(chunk) if m.group(1) not in defined_names() | NOT_CLASSES)
            yield from (f"{name}:{line + chunk[: m.start()].count(chr(10))}: {m.group(1)}" for m in dead)


@cache
def defined_names() -> frozenset[str]:
    """Every name the repository's Python defines (a class or function, an assignment) or imports: a class a comment names must be one."""
    code = "\n".join((REPO / file).read_text(encoding="utf-8") for file in tracked() if file.endswith(".py"))
    defined = re.findall(r"\b(?:class|def)\s+(\w+)|^\s*(\w+)\s*[:=]", code, re.MULTILINE)
    imported = re.findall(r"\bimport\s+\(?([\w ,.\n]+?)\)?$", code, re.MULTILINE)
    return frozenset({name for pair in defined for name in pair if name} | {word for names in imported for word in re.findall(r"\w+", names)})


def test_every_file_module_and_class_a_comment_or_a_page_names_exists() -> None:
    dead = [found for name in readable() for found in dead_names(name, (REPO / name).read_text(encoding="utf-8"))]
    assert dead == [], "these name what no longer exists (moved or renamed: name the new place):\n" + "\n".join(dead)


def test_the_dead_name_check_sees_a_moved_file_a_moved_module_and_a_renamed_class() -> None:
    sample = '"""Reads `kernel/nothing_here.py` and `taskweaver_lite.kernel.nothing_here`,\nbuilt by `NoSuchBuilder`."""\n# `kernel/base.py` stays.\n'
    dead = [
        "taskweaver_lite/x.py:1: kernel/nothing_here.py",
        "taskweaver_lite/x.py:1: taskweaver_lite.kernel.nothing_here",
        "taskweaver_lite/x.py:2: NoSuchBuilder",
    ]
    assert list(dead_names("taskweaver_lite/x.py", sample)) == dead


def test_no_code_cites_an_internal_document_or_an_issue_number() -> None:
    holding_the_pattern = ("tests/test_docs.py", "tests/test_code_map.py")
    ours = ("taskweaver_lite", "tests", "bench")
    code = [name for name in tracked() if name.endswith(".py") and name.split("/")[0] in ours and name not in holding_the_pattern]
    cited = [
        f"{name}:{number}: {match.group(0)!r}"
        for name in code
        for number, line in enumerate((REPO / name).read_text(encoding="utf-8").splitlines(), 1)
        if (match := CITATIONS.search(line))
    ]
    assert cited == [], "say what the behaviour is instead of citing a document or an issue a reader cannot open:\n" + "\n".join(cited)
