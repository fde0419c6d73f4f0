"""`taskweaver-lite mcp` answers its host at once and opens the project when a call needs it.

Driven by the official Python SDK's stdio client against the real command: `initialize` and the lists
of tools and resources open nothing; concurrent first calls share one opening; a project that cannot
be opened (a mistake in the config, confirm mode, a damaged store) fails the call with the reason, on
stderr too, and the next call tries again without a restart of the host.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any, TextIO

import anyio
import pytest
from helpers import cli_env, make_project
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client

pytestmark = pytest.mark.cli

WAIT = 120  # seconds one client call may take on a loaded machine
NO_MODEL = "http://127.0.0.1:9/v1"  # no call here reaches a model


def agent(project: Path, *options: str, errlog: TextIO) -> Client:
    """The SDK's own client, starting `taskweaver-lite mcp -p PROJECT [OPTIONS]` as its stdio server, its stderr in `errlog`."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "taskweaver_lite", "mcp", "-p", str(project), *options], env=cli_env())
    return Client(stdio_client(params, errlog=errlog), read_timeout_seconds=WAIT)


async def refusal(client: Client, tool: str, arguments: dict[str, Any]) -> str:
    """The one line of the protocol error a call gets."""
    with pytest.raises(MCPError) as refused:
        await client.call_tool(tool, arguments)
    return str(refused.value)


def test_the_host_hears_initialize_and_the_lists_before_the_project_opens_and_concurrent_first_calls_open_it_once(tmp_path: Path) -> None:
    project = make_project(tmp_path, NO_MODEL)
    store = project / "sessions.db"
    log = tmp_path / "stderr.txt"

    async def scenario() -> list[Any]:
        with log.open("w", encoding="utf-8") as errlog:
            async with agent(project, "--set", "session.roles=[planner,code_interpreter,nope]", errlog=errlog) as client:
                assert [tool.name for tool in (await client.list_tools()).tools] == ["ask", "sessions", "variables", "close_session"]
                assert (await client.list_resources()).resources == []
                assert not store.exists(), "the store was opened before any call needed it"
                answers: list[Any] = []

                async def listed() -> None:
                    answers.append((await client.call_tool("sessions", {})).structured_content)

                async def unknown() -> None:
                    answers.append(await refusal(client, "variables", {"session_id": "nope"}))

                async with anyio.create_task_group() as group:
                    for call in (listed, listed, unknown, listed):
                        group.start_soon(call)
                assert store.exists()
                return answers

    answers = anyio.run(scenario)
    assert sorted(map(str, answers)) == sorted([str({"sessions": []})] * 3 + ["no session 'nope' here: call the sessions tool for the ids"])
    said = log.read_text(encoding="utf-8")
    assert said.count("no role is called 'nope'") == 1, f"the project was opened more than once (or never): {said}"


def test_a_project_that_cannot_be_opened_fails_the_call_with_why_and_the_next_call_opens_it_once_fixed(tmp_path: Path) -> None:
    project = make_project(tmp_path, NO_MODEL)
    config = project / "taskweaver_config.yaml"
    good = config.read_text(encoding="utf-8")
    config.write_text(good + "session:\n  max_internal_hopz: 3\n", encoding="utf-8")
    log = tmp_path / "stderr.txt"

    async def scenario() -> None:
        with log.open("w", encoding="utf-8") as errlog:
            async with agent(project, errlog=errlog) as client:
                assert len((await client.list_tools()).tools) == 4  # the host sees the server up, with its tools
                said = await refusal(client, "sessions", {})
                assert "unknown key 'session.max_internal_hopz'" in said and "taskweaver_config.yaml" in said and "\n" not in said, said
                asked = await client.call_tool("ask", {"question": "set x"})
                assert asked.is_error and asked.structured_content is not None
                answer = asked.structured_content["answer"]
                assert answer.startswith("The project could not be opened: ") and "max_internal_hopz" in answer, answer
                assert str(tmp_path) not in answer, "the server's paths stay on the server"
                config.write_text(good, encoding="utf-8")  # fixed while the host stays connected
                assert (await client.call_tool("sessions", {})).structured_content == {"sessions": []}

    anyio.run(scenario)
    said = log.read_text(encoding="utf-8")
    assert "the project could not be opened (the next call tries again)" in said and "max_internal_hopz" in said, said


def test_a_damaged_store_is_named_at_the_first_call_and_a_store_moved_aside_is_made_anew(tmp_path: Path) -> None:
    project = make_project(tmp_path, NO_MODEL)
    store = project / "sessions.db"
    store.write_bytes(b"not a database, " * 1000)

    async def scenario() -> None:
        with (tmp_path / "stderr.txt").open("w", encoding="utf-8") as errlog:
            async with agent(project, errlog=errlog) as client:
                said = await refusal(client, "sessions", {})
                assert "sessions.db is not a readable session store: it is damaged" in said, said
                with pytest.raises(MCPError, match="is not a readable session store"):
                    await client.read_resource("taskweaver-lite://session/abc/artifacts/plot.png")
                shutil.move(store, project / "sessions.db.damaged")  # what the message says to do
                assert (await client.call_tool("sessions", {})).structured_content == {"sessions": []}

    anyio.run(scenario)
    assert store.exists()


def test_confirm_mode_is_refused_at_the_first_call_in_one_line_since_no_one_could_answer(tmp_path: Path) -> None:
    project = make_project(tmp_path, NO_MODEL)

    async def scenario() -> None:
        with (tmp_path / "stderr.txt").open("w", encoding="utf-8") as errlog:
            async with agent(project, "--set", "execution.confirm=true", errlog=errlog) as client:
                asked = await client.call_tool("ask", {"question": "set x"})
                assert asked.is_error and asked.structured_content is not None
                assert asked.structured_content["answer"].startswith(
                    "The project could not be opened: execution.confirm: true asks a person at a terminal before each cell runs"
                )
                said = await refusal(client, "sessions", {})
                assert said.startswith("execution.confirm: true asks a person at a terminal") and "--set execution.confirm=false" in said

    anyio.run(scenario)
    assert not (project / "sessions.db").exists(), "nothing was opened, nothing stored"
