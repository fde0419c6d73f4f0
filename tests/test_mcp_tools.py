"""`mcp.servers`: reference MCP servers from the registries (mcp-server-time from PyPI, server-everything from npm)
started by the session's kernel, their tools in the CodeGenerator's prompt and called from cells; servers that do
not start are one line each, and the session goes on."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO, make_project, run_cli

from taskweaver_lite.session.workspace import Workspace
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply

pytestmark = pytest.mark.kernel

# A server that says hello on stdout before any MCP: not a server this session can talk to.
GARBAGE = [sys.executable, "-c", "import time; print('hello there', flush=True); time.sleep(60)"]


def npm_server(name: str) -> Path | None:
    """The entry script of an npm package installed by .ci/run (into MCP_NPM_DIR, default build/npm), None when absent."""
    folder = Path(os.environ.get("MCP_NPM_DIR") or REPO / "build" / "npm")
    script = folder / "node_modules" / "@modelcontextprotocol" / name / "dist" / "index.js"
    return script if script.exists() and shutil.which("node") else None


def system_message(server: ScriptedServer, number: int = 0) -> str:
    content: str = [r for r in server.requests if r.role == "code_generator"][number].messages[0]["content"]
    return content


def test_a_cell_calls_a_reference_servers_tool_and_fixes_a_tool_error_while_broken_servers_are_one_line(tmp_path: Path) -> None:
    with ScriptedServer() as server:
        servers: dict[str, Any] = {"time": {"command": ["mcp-server-time"]}, "broken": {"command": ["no-such-mcp-server"]}, "garbage": {"command": GARBAGE}}
        project = make_project(tmp_path, server.url, mcp={"servers": servers})
        server.enqueue("planner", planner_reply("Get the time in UTC with the time tool."), planner_reply("It is Saturday in UTC.", send_to="User"))
        server.enqueue(
            "code_generator",
            code_reply("print(time.get_current_time(timezone='Nowhere/Nope'))"),
            code_reply("now = time.get_current_time(timezone='UTC')\nprint(now['timezone'], type(now).__name__)"),
        )
        with Workspace.load(project) as workspace, workspace.new_session() as session:
            rnd = session.ask("what time is it in UTC?")
            variables = [v.name for v in session.live_variables().variables]

    assert rnd.state == "finished" and rnd.answer == "It is Saturday in UTC."
    first, fixed = [post.execution for post in rnd.posts if post.execution is not None]
    assert first.error is not None and first.error.name == "McpToolError" and "Invalid timezone" in first.error.value
    assert fixed.success and fixed.stdout == "UTC dict\n"
    notices = " | ".join(first.notices)
    assert "MCP server broken: did not start (no-such-mcp-server was not found where the kernel runs)" in notices
    assert "MCP server garbage: wrote a line that is not MCP on its stdout ('hello there')" in notices
    prompt = system_message(server)
    assert "class time:  # MCP server" in prompt and "    def get_current_time(*, timezone: str) -> dict | list | str:" in prompt
    assert "class broken" not in prompt and "class garbage" not in prompt
    assert "McpToolError" in server.requests[[r.role for r in server.requests].index("code_generator") + 1].messages[-1]["content"]
    assert "time" not in variables and "now" in variables


def test_server_everything_from_npm_answers_a_cell(tmp_path: Path) -> None:
    script = npm_server("server-everything")
    if script is None:
        pytest.skip("@modelcontextprotocol/server-everything is not installed: .ci/run installs it with npm into build/npm")
    with ScriptedServer() as server:
        # The sandbox shows the kernel no more than it must: the npm folder is lent to it read-only.
        execution = {"timeout": 60, "mounts": [str(script.parents[3])]}
        project = make_project(tmp_path, server.url, execution=execution, mcp={"servers": {"everything": {"command": ["node", str(script), "stdio"]}}})
        server.enqueue("planner", planner_reply("Add 2 and 3 with the everything server."), planner_reply("5", send_to="User"))
        server.enqueue("code_generator", code_reply("print(everything.get_sum(a=2, b=3))\nprint(everything.get_structured_content(location='Chicago'))"))
        with Workspace.load(project) as workspace, workspace.new_session() as session:
            rnd = session.ask("add 2 and 3")
    [result] = [post.execution for post in rnd.posts if post.execution is not None]
    assert result.success, result.error
    assert result.stdout.startswith("The sum of 2 and 3 is 5.\n{") and "'temperature'" in result.stdout
    assert re.search(r"def get_sum\(\*, a: float, b: float\)", system_message(server))


def test_a_chat_whose_server_cannot_start_answers_and_says_so_in_one_line(tmp_path: Path) -> None:
    with ScriptedServer() as server:
        project = make_project(tmp_path, server.url, mcp={"servers": {"gone": {"command": ["no-such-mcp-server", "--flag"]}}})
        server.enqueue("planner", planner_reply("Print 6*7."), planner_reply("42", send_to="User"))
        server.enqueue("code_generator", code_reply("print(6*7)"))
        done = run_cli("chat", "-p", str(project), stdin="what is 6*7?\n/plugins\n")
        listed = run_cli("plugins", "-p", str(project))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "42\n"
    line = "MCP server gone: did not start (no-such-mcp-server was not found where the kernel runs): no-such-mcp-server --flag"
    assert done.stderr.count(f"{line}; the session goes on without it") == 1, done.stderr
    assert line in listed.stdout and listed.returncode == 0


# What `npx -y` of a package the registry does not have writes on stderr before exiting 1: the error first, npm's notices last.
NPX_404 = """npm error code E404
npm error 404 Not Found - GET https://registry.npmjs.org/@example%2fserver-nope - Not found
npm error 404
npm error 404  '@example/server-nope@*' is not in this registry.
npm error A complete log of this run can be found in: /root/.npm/_logs/2026-12-05T04_00_00_000Z-debug-0.log
npm notice
npm notice New major version of npm available! 10.8.2 -> 11.6.4
npm notice To update run: npm install -g npm@11.6.4
npm notice
"""


def test_a_server_that_fails_is_told_by_its_first_error_line_not_npms_last_notice(tmp_path: Path) -> None:
    fake = tmp_path / "npx"
    fake.write_text(f"#!{sys.executable}\nimport sys\nsys.stderr.write({NPX_404!r})\nsys.exit(1)\n", encoding="utf-8")
    fake.chmod(0o755)
    crash = [sys.executable, "-c", "import json\nprint('starting', file=__import__('sys').stderr)\njson.loads('{')"]
    servers = {"nope": {"command": [str(fake), "-y", "@example/server-nope"]}, "crash": {"command": crash}}
    project = make_project(tmp_path, "http://127.0.0.1:9", mcp={"servers": servers})
    listed = run_cli("plugins", "-p", str(project))
    assert listed.returncode == 0, listed.stderr
    said = {line.split(":", 1)[0]: line for line in listed.stdout.splitlines() if line.startswith("MCP server ")}
    assert "it said: npm error code E404: 404 Not Found - GET https://registry.npmjs.org/@example%2fserver-nope - Not found" in said["MCP server nope"]
    assert "npm notice" not in said["MCP server nope"]
    assert "it said: json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes" in said["MCP server crash"], said


def test_the_docs_recipe_for_an_npm_server_runs_as_written_from_a_mounted_install_without_the_network(tmp_path: Path) -> None:
    script = npm_server("server-everything")
    if script is None:
        pytest.skip("@modelcontextprotocol/server-everything is not installed: .ci/run installs it with npm into build/npm")
    page = (REPO / "docs" / "mcp.md").read_text(encoding="utf-8")
    [recipe] = [block for block in re.findall(r"```yaml\n(.*?)```", page, re.DOTALL) if "server-everything" in block]
    settings = yaml.safe_load(recipe.replace("/home/me/mcp-servers", str(script.parents[4])))
    assert "npx" not in recipe and not settings.get("execution", {}).get("network"), "the recipe downloads nothing and opens no network"
    everything = {"everything": settings["mcp"]["servers"]["everything"]}
    with ScriptedServer() as server:
        project = make_project(tmp_path, server.url, execution={**settings["execution"], "timeout": 60}, mcp={"servers": everything})
        server.enqueue("planner", planner_reply("Add 2 and 3 with the everything server."), planner_reply("5", send_to="User"))
        server.enqueue("code_generator", code_reply("print(everything.get_sum(a=2, b=3))"))
        with Workspace.load(project) as workspace, workspace.new_session() as session:
            rnd = session.ask("add 2 and 3")
    [result] = [post.execution for post in rnd.posts if post.execution is not None]
    assert result.success and result.stdout == "The sum of 2 and 3 is 5.\n", (result.error, result.notices)


def test_plugins_lists_a_server_that_needs_the_network_as_not_started_under_a_sandbox_without_one(tmp_path: Path) -> None:
    servers = {"online": {"command": ["mcp-server-time"], "network": True}, "time": {"command": ["mcp-server-time"]}}
    project = make_project(tmp_path, "http://127.0.0.1:9", mcp={"servers": servers}, execution={"sandbox": "bubblewrap"})
    listed = run_cli("plugins", "-p", str(project))
    assert listed.returncode == 0, listed.stderr
    assert "MCP server online: not started: it needs the network (mcp.servers.online.network: true)" in listed.stdout, listed.stdout
    assert re.search(r"^time +mcp +get_current_time, convert_time$", listed.stdout, re.MULTILINE), listed.stdout
    as_json = {row["name"]: row for row in json.loads(run_cli("plugins", "-p", str(project), "--json").stdout)}
    assert as_json["online"]["state"] == "broken" and as_json["time"]["state"] == "enabled"
    opened = make_project(tmp_path / "open", "http://127.0.0.1:9", mcp={"servers": servers}, execution={"sandbox": "bubblewrap", "network": True})
    assert re.search(r"^online +mcp +get_current_time", run_cli("plugins", "-p", str(opened)).stdout, re.MULTILINE)


def test_a_tools_image_and_embedded_resource_are_kept_as_the_cells_artifact_and_file_and_named_in_its_output(tmp_path: Path) -> None:
    script = npm_server("server-everything")
    if script is None:
        pytest.skip("@modelcontextprotocol/server-everything is not installed: .ci/run installs it with npm into build/npm")
    cell = "said = everything.get_tiny_image()\nprint(said)\nref = everything.get_resource_reference(resourceType='Text', resourceId=1)"
    with ScriptedServer() as server:
        execution = {"timeout": 60, "mounts": [str(script.parents[3])]}
        project = make_project(tmp_path, server.url, execution=execution, mcp={"servers": {"everything": {"command": ["node", str(script), "stdio"]}}})
        server.enqueue("planner", planner_reply("Get the tiny image and resource 1."), planner_reply("Done.", send_to="User"))
        server.enqueue("code_generator", code_reply(cell))
        with Workspace.load(project) as workspace, workspace.new_session() as session:
            rnd = session.ask("show me the image")
            working = session.working_dir
    [result] = [post.execution for post in rnd.posts if post.execution is not None]
    assert result.success, result.error
    [image] = result.artifacts
    assert Path(image).read_bytes().startswith(b"\x89PNG"), "the tool's image is kept as the cell's plot is"
    assert "everything.get_tiny_image returned an image (image/png): kept as this cell's artifact" in result.stdout, result.stdout
    assert "Here's the image you requested:\nThe image above is the MCP logo." in result.stdout
    named = re.search(r"everything\.get_resource_reference returned the resource (\S+) \(text/plain\): saved as (\S+) in the working folder", result.stdout)
    assert named is not None, result.stdout
    assert (working / named[2]).read_text(encoding="utf-8").startswith("Resource 1:"), "the embedded resource's text is the file's"
