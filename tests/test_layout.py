"""The package's shape: no import cycles (deferred and type-only imports included), empty subpackage
`__init__`s, and a command line that starts without the heavy dependencies."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import taskweaver_lite

pytestmark = pytest.mark.unit

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


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Every package module with the package modules it imports (parsed once per run)."""
    return {name: set(imported_modules(name, path)) for name, path in MODULES.items()}


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
    graph = import_graph()
    assert graph[f"{PACKAGE}.session.session"], "the import graph is empty: the parser no longer sees imports"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


# The layers, bottom up: each part of the package (a folder, or a module of the root) and the parts it sits
# on directly. It may import those and whatever they may import, nothing else: nothing above it, nothing
# beside it. A part added later is refused until it is given its floor here (and a row in docs/code-tour.md).
SITS_ON: dict[str, tuple[str, ...]] = {
    "errors": (),
    "records": ("errors",),  # the values several layers share: posts and rounds, events, a cell's result, usage, tips, a plugin's spec
    "config": ("records",),
    "safety": ("config",),
    "telemetry": ("config",),  # tracing: the model client, the kernel, the folds, the session and the server open spans through it
    "llm": ("config", "telemetry"),
    "prompts": (),  # data: llm/templates.py reads it with importlib.resources
    "store": ("safety",),
    "kernel": ("llm", "safety"),
    "plugins": ("llm",),
    "memory": ("llm",),
    "knowledge": ("memory",),
    "roles": ("kernel", "knowledge", "plugins"),
    "compat": ("roles",),  # found by the role registry through an entry point: roles never import it
    "session": ("roles", "store"),
    "notebook": ("session",),  # `%%ask` in a notebook's own kernel: the magics, the notebook's session, its cell's view
    "__init__": ("session", "notebook"),  # the public names (imported on first use), the version, `%load_ext taskweaver_lite`
    "eval": ("__init__",),  # its report names the version
    "mcp": ("__init__",),  # this agent as an MCP server (the MCP client the kernel runs is kernel/mcp/client.py)
    "acp": ("__init__",),  # this agent for editors over the Agent Client Protocol
    "jupyter_ai": ("notebook",),  # `@TaskWeaver` in JupyterLab's chat: the persona starts `taskweaver-lite acp` for the notebook's project
    "web": ("mcp",),  # serve answers MCP at /mcp with the same tools
    "testing": ("eval", "web"),
    "cli": ("testing", "acp"),
    "__main__": ("cli",),
    "plugin": ("kernel",),  # what plugin files import
    "role": ("roles",),  # what role files import
}


def allowed(part: str) -> set[str]:
    """What `part` may import: the parts it sits on, and what they may import."""
    return set(SITS_ON[part]).union(*(allowed(base) for base in SITS_ON[part]))


def part_of(module: str) -> str:
    """`taskweaver_lite.store.sql` -> `store`; `taskweaver_lite.errors` -> `errors`; the package itself -> `__init__`."""
    return module.removeprefix(PACKAGE).removeprefix(".").split(".")[0] or "__init__"


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


def import_chain(module: str, importer: dict[str, str], part: str) -> str:
    """'memory.summary -> llm.client -> roles.x': how `part` reaches `module`."""
    chain = [module]
    while part_of(chain[-1]) != part:
        chain.append(importer[chain[-1]])
    return " -> ".join(name.removeprefix(f"{PACKAGE}.") for name in reversed(chain))


def test_every_part_of_the_package_has_its_floor_and_sits_only_on_lower_ones() -> None:
    parts = sorted({part_of(name) for name in MODULES})
    assert [part for part in parts if part not in SITS_ON] == [], "give each of these its floor in SITS_ON (tests/test_layout.py) and docs/code-tour.md"
    order = list(SITS_ON)
    for index, (part, bases) in enumerate(SITS_ON.items()):
        assert set(bases) <= set(order[:index]), f"{part} sits on a part listed after it: list the parts bottom up"


@pytest.mark.parametrize("part", list(SITS_ON))
def test_each_part_imports_only_the_parts_below_it(part: str) -> None:
    graph = import_graph()
    importer = reached_from([name for name in MODULES if part_of(name) == part], graph)
    above = sorted(name for name in importer if part_of(name) not in {part, *allowed(part)})
    assert above == [], f"{part} reaches modules it may not import (it may: {', '.join(sorted(allowed(part))) or 'nothing'}): " + "; ".join(
        import_chain(name, importer, part) for name in above
    )


def test_the_code_tours_table_of_layers_says_what_this_test_checks() -> None:
    tour = (ROOT.parent / "docs" / "code-tour.md").read_text(encoding="utf-8")
    table = tour.split("## The layers", 1)[1].split("\n## ", 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines() if line.startswith("| `")]
    named = {layer_name(row[0]): tuple(sorted(layer_name(base) for base in re.findall(r"`[^`]+`", row[2]))) for row in rows}
    assert list(named) == list(SITS_ON), "docs/code-tour.md lists the layers bottom up, as SITS_ON does"
    assert named == {part: tuple(sorted(bases)) for part, bases in SITS_ON.items()}, "docs/code-tour.md says what each layer sits on, as SITS_ON does"


def layer_name(cell: str) -> str:
    """'`records/`' -> 'records'; '`errors.py`' -> 'errors'."""
    return cell.strip("`").removesuffix("/").removesuffix(".py")


def test_executors_are_chosen_in_one_place_and_used_through_their_protocol() -> None:
    # kernel/choice.py picks the class by what the config asks for; the rest of the package sees `Executor` only.
    named = re.compile(r"\b(?:KernelExecutor|GatewayExecutor|OwnKernelExecutor)\b")
    naming = sorted(name for name, path in MODULES.items() if part_of(name) != "kernel" and named.search(path.read_text(encoding="utf-8")))
    assert naming == [], f"these name an executor class; build one with kernel/choice.py and ask it through kernel/interface.py: {naming}"


def test_what_a_model_or_an_executor_can_do_is_declared_never_probed() -> None:
    # ChatModel (llm/client.py) and Executor (kernel/interface.py) declare their optional abilities.
    probe = re.compile(r"getattr\([^,]+, \"(?:close|model_name|scope_cache|share_cache|kept_variables|catch_up)\"")
    probing = sorted(name for name, path in MODULES.items() if probe.search(path.read_text(encoding="utf-8")))
    assert probing == [], f"these look an ability up with getattr; call the protocol's method: {probing}"


def test_only_the_store_speaks_to_postgresql() -> None:
    driver = re.compile(r"^\s*(?:import|from) psycopg", re.MULTILINE)
    speaking = sorted(name for name, path in MODULES.items() if driver.search(path.read_text(encoding="utf-8")) and part_of(name) not in ("store", "testing"))
    assert speaking == [], f"these open PostgreSQL connections of their own; go through the store (store/interface.py: Store, Notices): {speaking}"


def test_the_layer_check_names_the_import_that_climbs() -> None:
    graph = {f"{PACKAGE}.memory.a": {f"{PACKAGE}.llm.client"}, f"{PACKAGE}.llm.client": {f"{PACKAGE}.session.session"}, f"{PACKAGE}.session.session": set()}
    importer = reached_from([f"{PACKAGE}.memory.a"], graph)
    assert import_chain(f"{PACKAGE}.session.session", importer, "memory") == "memory.a -> llm.client -> session.session"
    assert part_of(PACKAGE) == "__init__" and part_of(f"{PACKAGE}.errors") == "errors" and "records" in allowed("store")


def test_the_cycle_finder_names_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


@pytest.mark.parametrize("package", sorted(name for name, path in MODULES.items() if path.name == "__init__.py" and name != PACKAGE))
def test_subpackage_init_imports_nothing(package: str) -> None:
    tree = ast.parse(MODULES[package].read_text(encoding="utf-8"))
    imports = [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert imports == [], f"{package} re-exports; import from its modules instead"


@pytest.mark.cli  # a fresh interpreter, started as a command: not the quick tier
def test_command_line_module_loads_without_the_heavy_dependencies() -> None:
    probe = f"import sys, taskweaver_lite.cli.main\nprint(sorted({{m.partition('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"
