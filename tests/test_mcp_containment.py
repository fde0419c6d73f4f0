"""`taskweaver-lite mcp` as an MCP host's user would probe it: `variables` never runs a cell, and errors carry none of the server's paths or process ids.

Driven by the official Python SDK's stdio client against the real command, the model scripted.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import cli_env, make_project
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client
from test_mcp_server import stored_sessions

from taskweaver_lite.session.workspace import Workspace
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, last_user_text, planner_reply

pytestmark = pytest.mark.cli

WAIT = 240
# The cell leaves a line in ran.txt each time it runs: a replay would add one.
CELL = "open('ran.txt', 'a').write('ran\\n')\nx = 42\nprint(x)"


def _planner(messages: list[dict[str, Any]]) -> str:
    if "Execution result" in last_user_text(messages) or "The code" in last_user_text(messages):
        return planner_reply("The answer is 42.", send_to="User")
    return planner_reply("Set x = 42 and print it.")


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    with ScriptedServer() as server:
        server.set_default("planner", _planner)
        server.set_default("code_generator", lambda messages: code_reply(CELL))
        yield make_project(tmp_path, server.url)


def _client(project: Path) -> Client:
    params = StdioServerParameters(command=sys.executable, args=["-m", "taskweaver_lite", "mcp", "-p", str(project)], env=cli_env())
    return Client(stdio_client(params, errlog=sys.stderr), read_timeout_seconds=WAIT)


def test_variables_of_a_session_not_open_come_from_the_store_and_no_cell_runs_again(project: Path) -> None:
    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with _client(project) as client:
            first = await client.call_tool("ask", {"question": "set x"})
            second = await client.call_tool("ask", {"question": "set x"})  # a second session: two ids of one day
        async with _client(project) as client:  # a new server: neither session is open in it
            assert first.structured_content is not None
            listed = await client.call_tool("variables", {"session_id": first.structured_content["session_id"]})
        assert listed.structured_content is not None and second.structured_content is not None
        return first.structured_content, listed.structured_content

    first, listed = anyio.run(scenario)
    assert [row["name"] for row in listed["variables"]] == ["x"], listed
    ran = project / "sessions" / first["session_id"] / "cwd" / "ran.txt"
    assert ran.read_text(encoding="utf-8") == "ran\n", "the session's cell ran again to answer `variables`"


def test_an_ambiguous_or_unknown_session_id_is_one_line_without_the_servers_paths(project: Path) -> None:
    async def scenario() -> list[str]:
        said = []
        async with _client(project) as client:
            for _ in range(2):
                await client.call_tool("ask", {"question": "set x"})
            for tool, arguments in (("variables", {"session_id": "2"}), ("ask", {"question": "x", "session_id": "2"}), ("variables", {"session_id": "nope"})):
                with pytest.raises(MCPError) as refused:
                    await client.call_tool(tool, arguments)
                said.append(str(refused.value))
        return said

    said = anyio.run(scenario)
    ids = [row["id"] for row in stored_sessions(project)]
    with Workspace.load(project) as workspace:  # held by a chat meanwhile: a new server says so, with no process id or path
        claim = workspace.store.lock(ids[0])
        try:

            async def busy() -> str:
                async with _client(project) as client:
                    refused = await client.call_tool("ask", {"question": "set x", "session_id": ids[0]})
                assert refused.is_error
                return str(refused.content[0].text)  # type: ignore[union-attr]

            said.append(anyio.run(busy))
        finally:
            claim.release()
    assert "is open in another taskweaver-lite process" in said[3] and "pid" not in said[3], said
    assert "matches several sessions" in said[0] and "matches several sessions" in said[1], said
    assert "no session 'nope'" in said[2], said
    for line in said:
        assert "\n" not in line and "Traceback" not in line and str(project) not in line and "sessions.db" not in line, line
