"""TaskWeaver's whole `taskweaver.plugin` module in the kernel, and plugins that break only when called."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import make_project, run_cli
from test_plugins import write_plugin

from taskweaver_lite.cli.plugins import plugin_table
from taskweaver_lite.config.settings import ExecutionConfig
from taskweaver_lite.kernel.executor import KernelExecutor
from taskweaver_lite.plugins.catalog import discover

pytestmark = pytest.mark.kernel

# As klarna_search is written: TaskWeaver's three names, a self-test, the dependency imported inside __call__.
LAZY_PLUGIN = """
from taskweaver.plugin import Plugin, register_plugin, test_plugin


@register_plugin
class Search(Plugin):
    def __call__(self, query: str):
        import not_installed_anywhere_xyz
        return not_installed_anywhere_xyz.search(query)


@test_plugin(name="finds something", description="a query returns rows")
def test_call(api_call):
    return len(api_call(query="shoes")) > 0
"""
FUNCTION_PLUGIN = """
from taskweaver.plugin import register_plugin


@register_plugin
def doubler(x: int):
    return 2 * x
"""


def lazy_project(tmp_path: Path) -> Path:
    project = make_project(tmp_path, "http://127.0.0.1:9/v1")
    write_plugin(project / "plugins", "search", "name: search\ndescription: Searches.\n", LAZY_PLUGIN)
    write_plugin(project / "plugins", "doubler", "name: doubler\ndescription: Doubles.\n", FUNCTION_PLUGIN)
    return project


def test_test_plugin_imports_and_a_plugin_that_fails_on_an_import_when_called_is_reported_broken_after_that_call(tmp_path: Path) -> None:
    project = lazy_project(tmp_path)
    catalog = discover(project)
    with KernelExecutor(tmp_path / "s", config=ExecutionConfig(timeout=30), plugins=catalog.enabled) as executor:
        assert executor.run("doubler(21)").result == "42", "a function registered as a plugin is callable"
        assert executor.plugin_failures == (), "the file imports test_plugin and loads"
        before = plugin_table(catalog.entries, executor.plugin_failures)
        failed = executor.run("search('shoes')")
        again = executor.run("search('boots')")
        after = plugin_table(catalog.entries, executor.plugin_failures)
    assert [line.split()[1] for line in before.splitlines() if line.startswith("search ")] == ["enabled"]
    assert not failed.success and failed.error is not None and "not_installed_anywhere_xyz" in failed.error.value
    assert not again.success
    row = next(line for line in after.splitlines() if line.startswith("search "))
    assert row.split()[1] == "broken", after
    assert "its call failed on an import: ModuleNotFoundError: No module named 'not_installed_anywhere_xyz'" in row
    assert len(executor.plugin_failures) == 1, "reported once, not at every call"


@pytest.mark.cli
def test_the_plugins_command_shows_a_call_time_import_that_would_fail(tmp_path: Path) -> None:
    project = lazy_project(tmp_path)
    listed = run_cli("plugins", "-p", str(project), "--json")
    states = {row["name"]: (row["state"], row["error"]) for row in json.loads(listed.stdout)}
    assert states["doubler"] == ("enabled", "")
    assert states["search"][0] == "broken"
    assert "its __call__ imports not_installed_anywhere_xyz, not installed where the kernel runs" in states["search"][1]
