"""Every command starts at once: `--help`, `--version` and the light commands import only what they run.

The import set of `taskweaver-lite --help` is held exactly, as tests/test_layout.py holds the layers'
imports: a module that joins it (a command's implementation imported to register the command, a
third-party package) fails here by name, before anyone feels the start-up slow down.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cli  # fresh interpreters, started as commands

# What registering every command may import: the command line's own light modules and the error tree.
HELP_MODULES = {
    "taskweaver_lite",
    "taskweaver_lite.cli",
    "taskweaver_lite.cli.audit",
    "taskweaver_lite.cli.eval",
    "taskweaver_lite.cli.gateway",
    "taskweaver_lite.cli.main",
    "taskweaver_lite.cli.users",
    "taskweaver_lite.errors",
}

# Run a command's parser in a fresh interpreter and report, as it exits, what it imported.
PROBE = """
import atexit, json, sys
before = set(sys.modules)
def report():
    loaded = set(sys.modules) - before
    ours = sorted(m for m in loaded if m.startswith("taskweaver_lite"))
    others = sorted({m.partition(".")[0] for m in loaded} - set(sys.stdlib_module_names) - {"taskweaver_lite", "_distutils_hack"})
    sys.__stderr__.write("\\nIMPORTED " + json.dumps({"ours": ours, "others": others}) + "\\n")
atexit.register(report)
from taskweaver_lite.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def imported_by(*argv: str, cwd: Path | None = None) -> dict[str, list[str]]:
    """The package's modules and the third-party packages that `taskweaver-lite ARGV` imported."""
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=60, cwd=cwd)
    marker = done.stderr.rpartition("IMPORTED ")[2]
    assert marker, f"the probe did not report: {done.stderr[-2000:]}"
    loaded: dict[str, list[str]] = json.loads(marker)
    return loaded


def test_help_imports_only_the_command_lines_light_modules_and_no_third_party_package() -> None:
    loaded = imported_by("--help")
    assert set(loaded["ours"]) == HELP_MODULES, (
        "`taskweaver-lite --help` imports more (or less) of the package than registering the commands needs: "
        f"added {sorted(set(loaded['ours']) - HELP_MODULES)}, gone {sorted(HELP_MODULES - set(loaded['ours']))}; "
        "import a command's implementation inside its run function, not where the command is registered"
    )
    assert loaded["others"] == [], f"`taskweaver-lite --help` imports third-party packages: {loaded['others']}"


def test_version_reads_the_installed_metadata_and_nothing_more() -> None:
    loaded = imported_by("--version")
    assert set(loaded["ours"]) == HELP_MODULES
    assert loaded["others"] == []


@pytest.mark.parametrize("command", ["users", "sessions", "config", "mcp", "chat", "serve", "export"])
def test_a_commands_own_help_imports_no_more_than_the_top_level_help(command: str) -> None:
    loaded = imported_by(command, "--help")
    assert set(loaded["ours"]) == HELP_MODULES, f"`taskweaver-lite {command} --help` imports {sorted(set(loaded['ours']) - HELP_MODULES)}"
    assert loaded["others"] == []


def test_listing_sessions_does_not_import_the_chat_the_kernel_or_the_model_client(tmp_path: Path) -> None:
    from taskweaver_lite.cli.init import init_project

    init_project(tmp_path / "project")
    loaded = imported_by("sessions", "-p", str(tmp_path / "project"))
    chat_stack = [
        m
        for m in loaded["ours"]
        if m.startswith(("taskweaver_lite.cli.chat", "taskweaver_lite.kernel", "taskweaver_lite.llm.client", "taskweaver_lite.session"))
    ]
    assert chat_stack == [], f"`sessions` imports the chat's stack: {chat_stack}"
    assert not {"openai", "jupyter_client", "rich", "prompt_toolkit"} & set(loaded["others"]), loaded["others"]
