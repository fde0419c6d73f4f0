"""What our side knows of a kernel's namespace, whichever way the kernel is reached.

Every executor (local ipykernel, a kernel behind a gateway) asks for the same `user_expressions`
with each cell: the variable snapshot (`snapshot.py`), the working folder put back (`sandbox/guard.py`),
and in a session with plugins what they logged and saved (`plugin_runtime.py`). This module builds
those expressions and the plugin install call, reads their values out of an execute reply, and turns
successive snapshots into `VariableChanges`.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

from taskweaver_lite.kernel import plugin_runtime
from taskweaver_lite.kernel import snapshot as kernel_snapshot
from taskweaver_lite.kernel.sandbox import guard as kernel_guard
from taskweaver_lite.records.execution import Variable, VariableChanges
from taskweaver_lite.records.plugin_spec import PluginSpec

SNAPSHOT = "snapshot"
CWD = "cwd"
PLUGINS = "plugins"
PLUGIN_FAILURES = "plugin_failures"
# What plugins logged and saved during a cell (asked with every cell of a session with plugins), and
# which failed to load (asked with the install request).
PLUGIN_REPORT_EXPRESSION = {PLUGINS: f"__import__('sys').modules[{plugin_runtime.MODULE_NAME!r}].drain()"}
PLUGIN_FAILURES_EXPRESSION = {PLUGIN_FAILURES: f"__import__('sys').modules[{plugin_runtime.MODULE_NAME!r}].failures()"}
_CELL_FILE = re.compile(r"cell-(\d+)")
LIBRARIES = "libraries"
# Import names of the libraries analysis code reaches for. Which of them a kernel can import is asked
# once per kernel start, in its first request: the path finder looks them up without importing any
# (and without the import hooks on sys.meta_path, such as display.py's, which wait for the real import).
ANALYSIS_LIBRARIES = (
    "pandas", "numpy", "matplotlib", "scipy", "seaborn", "sklearn", "statsmodels", "openpyxl", "xlrd", "pyarrow",
    "polars", "duckdb", "plotly", "sqlalchemy", "networkx", "sympy", "PIL", "requests", "bs4", "nltk", "xgboost",
    "lightgbm", "torch", "tabulate",
)  # fmt: skip
LIBRARIES_EXPRESSION = {
    LIBRARIES: f"__import__('json').dumps([n for n in {ANALYSIS_LIBRARIES!r} if __import__('importlib.machinery', fromlist=['_']).PathFinder.find_spec(n)])"
}


def cell_expressions(home: str) -> dict[str, str]:
    """The expressions asked for with every cell: the variables, and the working folder `home` put back."""
    return {
        SNAPSHOT: f"__import__('sys').modules[{kernel_snapshot.MODULE_NAME!r}].snapshot()",
        CWD: f"__import__('sys').modules[{kernel_guard.MODULE_NAME!r}].after_cell({home!r})",
    }


class VariableTracker:
    """The latest snapshot of user variables, and how each new one differs from it."""

    def __init__(self) -> None:
        # name -> (type, description, object id): what "changed" is judged by, without touching data.
        self._fingerprints: dict[str, tuple[str, str, str]] = {}
        self.variables: tuple[Variable, ...] = ()

    def names(self) -> tuple[str, ...]:
        """The names the kernel holds now: what a kernel that dies takes with it."""
        return tuple(self._fingerprints)

    def forget(self) -> tuple[str, ...]:
        """The kernel was replaced: nothing is held any more; returns the names that were lost."""
        lost = self.names()
        self._fingerprints, self.variables = {}, ()
        return lost

    def take(self, rows: list[list[str]] | None) -> VariableChanges:
        """Adopt a new snapshot and say how it differs; an unreadable one keeps the previous."""
        if rows is None:
            return VariableChanges()
        current = {name: (kind, description, identity) for name, kind, description, identity in rows}
        before = self._fingerprints
        changes = VariableChanges(
            created=tuple(name for name in current if name not in before),
            changed=tuple(name for name in current if name in before and before[name] != current[name]),
            deleted=tuple(name for name in before if name not in current),
        )
        self._fingerprints = current
        self.variables = tuple(Variable(name=name, type=kind, description=text) for name, (kind, text, _) in current.items())
        return changes


def snapshot_rows(reply: dict[str, Any]) -> list[list[str]] | None:
    """The snapshot's rows in an execute reply, None if it is missing or unreadable.

    Code in the kernel can replace the snapshot function: only rows of four strings are kept.
    """
    expressions = reply.get("user_expressions")
    value = expressions.get(SNAPSHOT) if isinstance(expressions, dict) else None
    if not isinstance(value, dict) or value.get("status") != "ok":
        return None
    try:
        rows = json.loads(value["data"]["text/plain"])
    except (KeyError, TypeError, ValueError, RecursionError):
        return None
    if not isinstance(rows, list):
        return None
    return [row for row in rows if isinstance(row, list) and len(row) == 4 and all(isinstance(item, str) for item in row)]


def moved_from(reply: dict[str, Any]) -> str:
    """The folder a cell left the kernel in, if it was not the working folder ('' otherwise)."""
    expressions = reply.get("user_expressions")
    value = expressions.get(CWD) if isinstance(expressions, dict) else None
    if not isinstance(value, dict) or value.get("status") != "ok":
        return ""
    try:
        moved = ast.literal_eval(value["data"]["text/plain"])
    except (KeyError, TypeError, ValueError, SyntaxError):
        return ""
    return moved if isinstance(moved, str) else ""


def moved_notice(moved: str, home: str) -> tuple[str, ...]:
    """The note a result carries when the cell left the working folder (none if it did not)."""
    if not moved:
        return ()
    return (
        f"The cell changed the working folder to {moved}; it was set back to {home} so that relative paths keep working. Use absolute paths for other folders.",
    )


def last_cell_number(*folders: Path) -> int:
    """Highest cell number already used in these folders, so a resumed session never overwrites files."""
    numbers = [int(m.group(1)) for folder in folders for path in folder.iterdir() if (m := _CELL_FILE.match(path.name))]
    return max(numbers, default=0)


def plugin_install_code(plugins: tuple[PluginSpec, ...], *, session_id: str, cwd: Path) -> str:
    """The install call up to its last argument, the number of cells run before, added at each install."""
    specs = json.dumps([spec.kernel_spec() for spec in plugins])
    return f"__import__('sys').modules[{plugin_runtime.MODULE_NAME!r}].install({specs!r}, {session_id!r}, {str(cwd)!r}, "


def expression_json(reply: dict[str, Any], name: str) -> Any:
    """A user expression whose text is JSON (a repr of a JSON string), decoded; None if it failed."""
    expressions = reply.get("user_expressions")
    value = expressions.get(name) if isinstance(expressions, dict) else None
    if not isinstance(value, dict) or value.get("status") != "ok":
        return None
    try:
        return json.loads(ast.literal_eval(value["data"]["text/plain"]))
    except (KeyError, TypeError, ValueError, SyntaxError, RecursionError, MemoryError):
        return None


def plugin_reports(reply: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What plugins logged (as notices) and the artifacts they saved during the cell."""
    value = expression_json(reply, PLUGINS)
    if not isinstance(value, dict):
        return (), ()
    logs = tuple(f"plugin log {line}" for line in value.get("logs", ()) if isinstance(line, str))
    saved = tuple(line for line in value.get("artifacts", ()) if isinstance(line, str))
    return logs, saved


def plugins_broken(reply: dict[str, Any]) -> tuple[str, ...]:
    """Plugins whose call failed on an import during the cell (a dependency imported inside `__call__`), one line each."""
    value = expression_json(reply, PLUGINS)
    broken = value.get("broken", ()) if isinstance(value, dict) else ()
    return tuple(line for line in broken if isinstance(line, str))


def plugin_failures(reply: dict[str, Any] | None) -> tuple[str, ...]:
    """The plugins that failed to load, one line each, from the install request's reply."""
    value = expression_json(reply or {}, PLUGIN_FAILURES)
    if isinstance(value, list):
        return tuple(str(line) for line in value)
    return ("the plugins could not be loaded (no answer from the kernel)",)


def importable_libraries(reply: dict[str, Any] | None) -> tuple[str, ...]:
    """The analysis libraries a kernel said it can import, from the reply that asked (() if it did not answer)."""
    value = expression_json(reply or {}, LIBRARIES)
    return tuple(str(name) for name in value) if isinstance(value, list) else ()
