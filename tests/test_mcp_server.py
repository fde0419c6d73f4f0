"""`taskweaver-lite mcp` driven by MCP clients nobody here wrote: the official Python SDK's stdio client (and the
MCP Inspector's CLI from npm, where it is installed): tools, two asks that keep a variable, progress, resources,
a cancelled request, bad input, and a session resumed by a new server process."""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import REPO, cli_env, make_project, run_cli
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp_types import CallToolResult

from taskweaver_lite.config.file import load_config
from taskweaver_lite.errors import SessionBusyError
from taskweaver_lite.session.workspace import Workspace
from taskweaver_lite.store.lock import SessionLock
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, last_user_text, planner_reply

pytestmark = pytest.mark.cli

WAIT = 240  # seconds one client call may take on a loaded machine (a kernel starts, cells re-run)


def planner(messages: list[dict[str, Any]]) -> str:
    """Delegates each request by its words; answers with the number the last cell printed."""
    text = last_user_text(messages)
    if "Execution result" in text or "The code" in text:
        printed = re.findall(r"\b(42|82)\b", text)
        if "Cancelled" in text or "interrupted" in text:
            return planner_reply("The cell was stopped.", send_to="User")
        return planner_reply(f"The answer is {printed[-1]}." if printed else "Done.", send_to="User")
    for words, step in STEPS.items():
        if words in text:
            return planner_reply(step)
    return planner_reply("Nothing to do.", send_to="User")


STEPS = {
    "set x": "Set x = 42 and print it.",
    "double x": "Compute x*2-2 from the kept x and print it.",
    "plot": "Plot x and write table.csv.",
    "sleep": "Sleep for a long while.",
    "write other": "Write other.csv.",
}
CELLS = {
    "x = 42": "x = 42\nprint(x)",
    "x*2-2": "print(x*2-2)",
    "Plot x": "import matplotlib.pyplot as plt\nplt.plot([1, 2, x])\nplt.show()\nopen('table.csv', 'w').write('a,b\\n1,2\\n')",
    "Sleep": "import time\ntime.sleep(600)",
    "other.csv": "open('other.csv', 'w').write('c\\n3\\n')",
}


def coder(messages: list[dict[str, Any]]) -> str:
    text = last_user_text(messages)
    return code_reply(next(code for words, code in CELLS.items() if words in text))


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    with ScriptedServer() as server:
        server.set_default("planner", planner)
        server.set_default("code_generator", coder)
        yield make_project(tmp_path, server.url)


def agent(project: Path, *options: str) -> Client:
    """The SDK's own client, starting `taskweaver-lite mcp -p PROJECT [OPTIONS]` as its stdio server."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "taskweaver_lite", "mcp", "-p", str(project), *options], env=cli_env())
    return Client(stdio_client(params, errlog=sys.stderr), read_timeout_seconds=WAIT)


def stored_sessions(project: Path) -> list[dict[str, Any]]:
    done = subprocess.run([sys.executable, "-m", "taskweaver_lite", "sessions", "-p", str(project), "--json"], capture_output=True, text=True, env=cli_env())
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def test_an_mcp_client_asks_twice_in_one_session_reads_a_plot_and_cancels_a_cell(project: Path) -> None:
    async def scenario() -> None:
        async with agent(project) as client:
            assert [tool.name for tool in (await client.list_tools()).tools] == ["ask", "sessions", "variables", "close_session"]
            heard_lines: list[str] = []

            async def heard(progress: float, total: float | None, message: str | None) -> None:
                heard_lines.append(message or "")

            first = await client.call_tool("ask", {"question": "set x please"}, progress_callback=heard)
            assert first.structured_content is not None and not first.is_error
            session_id = first.structured_content["session_id"]
            assert first.structured_content["answer"] == "The answer is 42."
            assert "The answer is 42." in first.content[0].text and session_id in first.content[0].text  # type: ignore[union-attr]
            assert "Running code" in heard_lines, heard_lines

            second = await client.call_tool("ask", {"question": "now double x minus two", "session_id": session_id})
            assert second.structured_content == {"answer": "The answer is 82.", "session_id": session_id, "state": "finished", "artifacts": []}

            plotted = await client.call_tool("ask", {"question": "plot it", "session_id": session_id})
            assert plotted.structured_content is not None
            links = plotted.structured_content["artifacts"]
            png = next(uri for uri in links if uri.endswith(".png"))
            assert any(uri.endswith("/files/table.csv") for uri in links), links
            listed = {str(r.uri): r.mime_type for r in (await client.list_resources()).resources}
            assert listed[png] == "image/png" and any(mime == "text/csv" for mime in listed.values()), listed
            image = (await client.read_resource(png)).contents[0]
            assert base64.b64decode(image.blob).startswith(b"\x89PNG")  # type: ignore[union-attr]
            table = (await client.read_resource(png.replace("/artifacts/", "/files/").rsplit("/", 1)[0] + "/table.csv")).contents[0]
            assert table.text == "a,b\n1,2\n"  # type: ignore[union-attr]

            await cancel_a_long_cell(client, session_id)
            after = await client.call_tool("ask", {"question": "double x again", "session_id": session_id})
            assert after.structured_content is not None and after.structured_content["answer"] == "The answer is 82.", after
            kept = await client.call_tool("variables", {"session_id": session_id})
            assert kept.structured_content is not None
            assert {"name": "x", "type": "int", "description": "42"} in kept.structured_content["variables"]

    anyio.run(scenario)
    [row] = stored_sessions(project)
    assert row["rounds"] == 5  # the cancelled round is stored too, failed


async def cancel_a_long_cell(client: Client, session_id: str) -> None:
    """An ask whose cell sleeps for ten minutes, cancelled once the cell runs: the request ends within seconds."""
    running = anyio.Event()

    async def heard(progress: float, total: float | None, message: str | None) -> None:
        if message == "Running code":
            running.set()

    async with anyio.create_task_group() as group:

        async def ask() -> None:
            await client.call_tool("ask", {"question": "sleep now", "session_id": session_id}, progress_callback=heard)

        group.start_soon(ask)
        with anyio.fail_after(WAIT):
            await running.wait()
        await anyio.sleep(1)
        group.cancel_scope.cancel()


def test_bad_input_is_a_protocol_error_in_one_line_and_stores_nothing(project: Path) -> None:
    async def scenario() -> list[str]:
        said = []
        async with agent(project) as client:
            for arguments in ({"question": "set x", "session_id": "no-such-session"}, {"question": "y" * 20_001}, {"session_id": "x"}, {"question": "  "}):
                with pytest.raises(MCPError) as refused:
                    await client.call_tool("ask", arguments)
                said.append(str(refused.value))
            with pytest.raises(MCPError) as unknown:
                await client.read_resource("taskweaver-lite://session/nope/artifacts/a.png")
            said.append(str(unknown.value))
        return said

    said = anyio.run(scenario)
    assert "no session 'no-such-session'" in said[0]
    assert "20,001 characters; ask takes at most 20,000" in said[1]
    assert said[2] == said[3] == "ask needs a question: a non-empty string"
    assert "no session 'nope'" in said[4]
    assert all("\n" not in line for line in said)
    assert stored_sessions(project) == []


def test_a_new_server_process_resumes_a_stored_session_with_its_variables(project: Path) -> None:
    async def ask(question: str, session_id: str | None = None) -> CallToolResult:
        async with agent(project, "--set", "session.max_internal_hops=9") as client:
            return await client.call_tool("ask", {"question": question} | ({"session_id": session_id} if session_id else {}))

    first = anyio.run(ask, "set x").structured_content
    assert first is not None
    with Workspace.load(project) as workspace:  # a chat holds the session meanwhile: the server says so, and opens nothing
        assert workspace.remembered_overrides(first["session_id"]) == ["session.max_internal_hops=9"]  # `chat --resume` applies them again
        claim = workspace.store.lock(first["session_id"])
        try:
            refused = anyio.run(ask, "double x", first["session_id"])
        finally:
            claim.release()
    assert refused.is_error and "is open in another taskweaver-lite process" in refused.content[0].text  # type: ignore[union-attr]
    again = anyio.run(ask, "double x", first["session_id"]).structured_content
    assert again is not None and again["answer"] == "The answer is 82." and again["session_id"] == first["session_id"]
    done = subprocess.run(
        [sys.executable, "-m", "taskweaver_lite", "export", first["session_id"], "-p", str(project), "--format", "md", "-o", str(project / "s.md")],
        capture_output=True,
        text=True,
        env=cli_env(),
    )
    assert done.returncode == 0, done.stderr
    assert "print(x*2-2)" in (project / "s.md").read_text(encoding="utf-8")


def npm_tool(name: str) -> str | None:
    """A program installed with npm: in MCP_NPM_DIR (where .ci/run installs them), else on PATH; None when absent."""
    local = Path(os.environ.get("MCP_NPM_DIR") or REPO / "build" / "npm", "node_modules", ".bin", name)
    return str(local) if local.exists() else shutil.which(name)


def test_the_mcp_inspector_cli_lists_the_tools_and_asks(project: Path) -> None:
    found = npm_tool("mcp-inspector")
    if found is None:
        pytest.skip("the MCP Inspector is not installed: .ci/run installs @modelcontextprotocol/inspector with npm into build/npm")
    command = [found, "--cli"]
    server = [sys.executable, "-m", "taskweaver_lite", "mcp", "-p", str(project)]
    listed = subprocess.run([*command, *server, "--method", "tools/list"], capture_output=True, text=True, env=cli_env(), timeout=WAIT)
    assert listed.returncode == 0, listed.stderr
    assert [tool["name"] for tool in json.loads(listed.stdout)["tools"]] == ["ask", "sessions", "variables", "close_session"]
    asked = subprocess.run(
        [*command, *server, "--method", "tools/call", "--tool-name", "ask", "--tool-arg", "question=set x"],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=WAIT,
    )
    assert asked.returncode == 0, asked.stderr
    assert json.loads(asked.stdout)["structuredContent"]["answer"] == "The answer is 42."


def test_a_session_the_host_leaves_idle_is_released_and_close_session_releases_one_at_once(project: Path) -> None:
    def resumed_in_a_chat(session_id: str) -> subprocess.CompletedProcess[str]:
        return run_cli("chat", "-p", str(project), "--resume", session_id, stdin="double x please\n", timeout=WAIT)

    async def scenario() -> None:
        async with agent(project, "--set", "mcp.session_idle_timeout=2") as client:
            idle = await client.call_tool("ask", {"question": "set x"})
            assert idle.structured_content is not None
            # Past the setting (looked at every half second) it is released while the host stays connected: its lock is free.
            await anyio.to_thread.run_sync(functools.partial(released_within, 60, project, idle.structured_content["session_id"]))
            done = await anyio.to_thread.run_sync(resumed_in_a_chat, idle.structured_content["session_id"])
            assert done.returncode == 0 and "The answer is 82." in done.stdout, done.stderr
            closed = await client.call_tool("ask", {"question": "set x"})
            assert closed.structured_content is not None
            session_id = closed.structured_content["session_id"]
            released = await client.call_tool("close_session", {"session_id": session_id})
            assert not released.is_error and released.structured_content == {"session_id": session_id, "closed": True}
            done = await anyio.to_thread.run_sync(resumed_in_a_chat, session_id)
            assert done.returncode == 0 and "The answer is 82." in done.stdout, done.stderr
            again = await client.call_tool("ask", {"question": "double x", "session_id": session_id})  # the host goes on: resumed
            assert again.structured_content is not None and again.structured_content["answer"] == "The answer is 82."

    anyio.run(scenario)


def released_within(seconds: float, project: Path, session_id: str) -> None:
    """Until this process can take the session's lock (no other process has it open); AssertionError after `seconds`."""
    lock = load_config(project).store_path
    deadline = time.monotonic() + seconds
    while True:
        try:
            SessionLock(lock.with_name(lock.name + ".locks") / f"{session_id}.lock", session_id=session_id).release()
            return
        except SessionBusyError:
            assert time.monotonic() < deadline, f"the idle session {session_id} was not released within {seconds} s"
            time.sleep(0.1)


def test_ask_links_only_the_files_its_own_cells_wrote_not_a_replays_nor_a_strangers(project: Path) -> None:
    async def ask(*questions: str, session_id: str | None = None) -> dict[str, Any]:
        async with agent(project) as client:
            for question in questions:
                answered = await client.call_tool("ask", {"question": question} | ({"session_id": session_id} if session_id else {}))
                assert answered.structured_content is not None, answered
                session_id = answered.structured_content["session_id"]
            return answered.structured_content

    plotted = anyio.run(ask, "set x", "plot it")
    assert any(uri.endswith("/files/table.csv") for uri in plotted["artifacts"]), plotted
    working = project / "sessions" / plotted["session_id"] / "cwd"
    stranger = working / "notes.txt"  # written by someone else, dated in the future
    stranger.write_text("not the agent's\n", encoding="utf-8")
    os.utime(stranger, (time.time() + 3600, time.time() + 3600))
    # A new server process resumes the session: its replay writes table.csv (and draws the plot) again first.
    wrote = anyio.run(functools.partial(ask, "write other now", session_id=plotted["session_id"]))
    assert [uri.rsplit("/", 2)[-2:] for uri in wrote["artifacts"]] == [["files", "other.csv"]], wrote["artifacts"]


def test_an_ask_whose_turn_fails_still_answers_with_structured_content_naming_the_session(tmp_path: Path) -> None:
    async def scenario(project: Path) -> CallToolResult:
        async with agent(project) as client:
            return await client.call_tool("ask", {"question": "set x"})

    with ScriptedServer() as silent:  # no reply for anyone: every model call fails
        failed = anyio.run(scenario, make_project(tmp_path, silent.url, llm={"max_retries": 0}))
    assert failed.is_error and failed.structured_content is not None, failed
    assert failed.structured_content["state"] == "failed" and failed.structured_content["artifacts"] == []
    assert failed.structured_content["session_id"] and failed.structured_content["session_id"] in failed.content[0].text  # type: ignore[union-attr]
    assert failed.structured_content["answer"] == failed.content[0].text  # type: ignore[union-attr]
