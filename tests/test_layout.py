"""The package's shape: no import cycles (deferred and type-only imports included), empty subpackage
`__init__`s, and a command line that starts without the heavy dependencies."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import taskweaver_lite

PACKAGE = "taskweaver_lite"
ROOT = Path(taskweaver_lite.__file__).resolve().parent
# Loaded by the chat, the kernel or the renderer; `taskweaver-lite --help` must not wait for them.
HEAVY = ("openai", "jupyter_client", "rich", "pydantic")


def module_name(path: Path) -> str:
    """`taskweaver_lite/kernel/executor.py` -> `taskweaver_lite.kernel.executor` (a package is its `__init__`)."""
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}
# In a checkout, pyproject maps the top-level `prompts/` folder to the data package `taskweaver_lite.prompts`.
MODULES.setdefault(f"{PACKAGE}.prompts", ROOT.parent / "prompts" / "__init__.py")


def imported_modules(name: str, path: Path) -> Iterator[str]:
    """Every package module `name` imports, wherever the statement is: top level, functions, `if TYPE_CHECKING:`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import mod` imports the module `pkg.mod`; `from mod import name`, just `mod`.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        yield from (target for target in targets if target in MODULES and target != name)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (depth-first search, colouring nodes on the path)."""
    on_path: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> list[str] | None:
        if node in on_path:
            return [*on_path[on_path.index(node) :], node]
        if node in done:
            return None
        on_path.append(node)
        for target in sorted(graph[node]):
            if cycle := visit(target):
                return cycle
        on_path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        if cycle := visit(start):
            return cycle
    return None


def test_the_package_has_no_import_cycle_counting_deferred_and_type_checking_imports() -> None:
    graph = {name: set(imported_modules(name, path)) for name, path in MODULES.items()}
    assert graph[f"{PACKAGE}.session.session"], "the import graph is empty: the parser no longer sees imports"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


# What the memory and the knowledge may build on: the records, the errors, the config, the guards the config
# names, and the model wire (with its prompt templates). Anything else (roles, the session, the store, the
# CLI, the server, eval...) is above them; a module added later is above them too until it is listed here.
BELOW_MEMORY = ("config", "errors", "llm", "records", "safety", "telemetry")
# Tracing sits just above the config: the model client, the kernel, the folds and the session all open spans through it.
MAY_REACH = {"memory": BELOW_MEMORY, "knowledge": (*BELOW_MEMORY, "memory"), "telemetry": ("config", "errors", "records", "safety")}


def reached_from(starts: list[str], graph: dict[str, set[str]]) -> dict[str, str]:
    """Every module the `starts` import, directly or not, each with the module that first imports it."""
    importer: dict[str, str] = {}
    todo = list(starts)
    while todo:
        name = todo.pop()
        for target in sorted(graph[name] - importer.keys()):
            importer[target] = name
            todo.append(target)
    return importer


def import_chain(module: str, importer: dict[str, str], package: str) -> str:
    """'memory.summary -> llm.client -> roles.x': how `package` reaches `module`."""
    chain = [module]
    while not chain[-1].startswith(f"{PACKAGE}.{package}."):
        chain.append(importer[chain[-1]])
    return " -> ".join(name.removeprefix(f"{PACKAGE}.") for name in reversed(chain))


@pytest.mark.parametrize("package", sorted(MAY_REACH))
def test_memory_knowledge_and_telemetry_import_nothing_above_them(package: str) -> None:
    graph = {name: set(imported_modules(name, path)) for name, path in MODULES.items()}
    importer = reached_from([name for name in MODULES if name.startswith(f"{PACKAGE}.{package}.")], graph)
    allowed = (package, *MAY_REACH[package])
    above = sorted(name for name in importer if name.removeprefix(f"{PACKAGE}.").split(".")[0] not in allowed)
    assert above == [], f"{package}/ reaches modules above it: " + "; ".join(import_chain(name, importer, package) for name in above)


def test_the_layer_check_names_the_import_that_climbs() -> None:
    graph = {f"{PACKAGE}.memory.a": {f"{PACKAGE}.llm.client"}, f"{PACKAGE}.llm.client": {f"{PACKAGE}.session"}, f"{PACKAGE}.session": set()}
    importer = reached_from([f"{PACKAGE}.memory.a"], graph)
    assert import_chain(f"{PACKAGE}.session", importer, "memory") == "memory.a -> llm.client -> session"


def test_the_cycle_finder_names_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


@pytest.mark.parametrize("package", sorted(name for name, path in MODULES.items() if path.name == "__init__.py" and name != PACKAGE))
def test_subpackage_init_imports_nothing(package: str) -> None:
    tree = ast.parse(MODULES[package].read_text(encoding="utf-8"))
    imports = [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert imports == [], f"{package} re-exports; import from its modules instead"


def test_command_line_module_loads_without_the_heavy_dependencies() -> None:
    probe = f"import sys, taskweaver_lite.cli.main\nprint(sorted({{m.partition('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"
