"""MCP over HTTP at `/mcp`: two `serve` replicas on a private PostgreSQL server and a sandboxed kernel gateway, driven by
MCP clients nobody here wrote (the official Python SDK's Streamable HTTP client, and the MCP Inspector's CLI from npm
where it is installed), each request carrying a user's token as an MCP host would send it.

Nothing is sticky: a session begun on one replica is asked again on the other, with its variables. Another user's
token finds no such session, and a request without a token is refused before any MCP is spoken.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from helpers import REPO, cli_env
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import CallToolResult

from taskweaver_lite.testing.kernel_gateway import sandbox_gateway
from taskweaver_lite.testing.postgres_cluster import PostgresCluster
from taskweaver_lite.testing.replicas import ServeProcess, run_code_model, write_team_project
from taskweaver_lite.testing.scripted_server import ScriptedServer

pytestmark = pytest.mark.team

WAIT = 240  # seconds one client call may take on a loaded machine (a kernel starts on the gateway)
TOOLS = ["ask", "sessions", "variables", "close_session"]


class Service:
    """Two replicas of one service, and each user's token."""

    def __init__(self, project: Path, tokens: dict[str, str]) -> None:
        self.project = project
        self.tokens = tokens
        self.replicas = ServeProcess.start_several(project, 2)

    def endpoint(self, replica: int) -> str:
        return self.replicas[replica].url + "/mcp"

    def close(self) -> None:
        for replica in self.replicas:
            replica.stop()


@pytest.fixture(scope="module")
def service(postgres_cluster: PostgresCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("mcp-http")
    (root / "gateway").mkdir()
    (root / "gateway" / "taskweaver_config.yaml").write_text("{}\n", encoding="utf-8")
    with ScriptedServer() as model, sandbox_gateway(root / "gateway") as gateway:
        run_code_model(model)
        project = write_team_project(root / "project", store_url=postgres_cluster.new_database(), gateway=gateway, model_url=model.url, lease_timeout=3.0)
        tokens = {name: _add_user(project, name) for name in ("alice", "bob")}
        running = Service(project, tokens)
        try:
            yield running
        finally:
            running.close()


def _add_user(project: Path, name: str) -> str:
    command = [sys.executable, "-m", "taskweaver_lite", "users", "add", name, "-p", str(project)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=cli_env())
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@contextlib.asynccontextmanager
async def host(url: str, token: str | None) -> AsyncIterator[Client]:
    """The SDK's own client over Streamable HTTP, sending the user's token as a host's config would."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with create_mcp_http_client(headers=headers) as http, Client(streamable_http_client(url, http_client=http), read_timeout_seconds=WAIT) as client:
        yield client


def text_of(result: CallToolResult) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def test_an_sdk_client_asks_on_one_replica_then_the_other_and_another_user_finds_nothing(service: Service) -> None:
    alice, bob = service.tokens["alice"], service.tokens["bob"]

    async def scenario() -> tuple[str, dict[str, Any]]:
        async with host(service.endpoint(0), alice) as first:
            assert [tool.name for tool in (await first.list_tools()).tools] == TOOLS
            heard: list[str] = []

            async def heard_line(progress: float, total: float | None, message: str | None) -> None:
                heard.append(message or "")

            began = await first.call_tool("ask", {"question": "RUN<<x = 41\nprint(x)>>"}, progress_callback=heard_line)
            assert began.structured_content is not None and not began.is_error, text_of(began)
            session_id = began.structured_content["session_id"]
            assert "41" in began.structured_content["answer"] and "Running code" in heard, heard
        async with host(service.endpoint(1), alice) as second:
            went_on = await second.call_tool("ask", {"question": "RUN<<print(x + 1)>>", "session_id": session_id})
            assert went_on.structured_content is not None and "42" in went_on.structured_content["answer"], text_of(went_on)
            assert went_on.structured_content["session_id"] == session_id and went_on.structured_content["state"] == "finished"
            kept = await second.call_tool("variables", {"session_id": session_id})
            assert kept.structured_content is not None and {"name": "x", "type": "int", "description": "41"} in kept.structured_content["variables"]
            listed = await second.call_tool("sessions", {})
            assert listed.structured_content is not None
            mine = {row["id"]: row for row in listed.structured_content["sessions"]}
        async with host(service.endpoint(0), bob) as other:
            refused = []
            for tool, arguments in [("ask", {"question": "RUN<<print(x)>>", "session_id": session_id}), ("variables", {"session_id": session_id})]:
                with pytest.raises(MCPError) as error:
                    await other.call_tool(tool, arguments)
                refused.append(str(error.value))
            theirs = await other.call_tool("sessions", {})
            assert theirs.structured_content == {"sessions": []}
            assert refused == [f"session {session_id!r} was not found: call the sessions tool for the ids of yours"] * 2
        return session_id, mine

    session_id, mine = anyio.run(scenario)
    assert mine[session_id]["rounds"] == 2
    second_log = (service.project / f"access-{service.replicas[1].port}.log").read_text(encoding="utf-8")
    assert "POST /mcp" in second_log and "user=alice" in second_log and service.tokens["alice"] not in second_log


def test_no_token_is_401_before_any_mcp_and_the_sdk_client_says_so(service: Service) -> None:
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}
    headers = {"Accept": "application/json, text/event-stream"}
    for token in (None, "not-a-token"):
        sent = headers | ({"Authorization": f"Bearer {token}"} if token else {})
        refused = httpx.post(service.endpoint(1), json=initialize, headers=sent, timeout=30)
        assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Bearer"), refused.text
        assert refused.json()["error"]["message"].startswith(("This server needs your user's token", "This token is not valid here")), refused.text

    async def anonymous() -> None:
        async with host(service.endpoint(0), None) as client:
            await client.list_tools()

    with pytest.raises(BaseException) as failed:
        anyio.run(anonymous)
    assert "This server needs your user's token: send `Authorization: Bearer <token>`" in repr(failed.value), repr(failed.value)


def npm_tool(name: str) -> str | None:
    """A program installed with npm: in MCP_NPM_DIR (where .ci/run installs them), else on PATH; None when absent."""
    local = Path(os.environ.get("MCP_NPM_DIR") or REPO / "build" / "npm", "node_modules", ".bin", name)
    return str(local) if local.exists() else shutil.which(name)


def inspector(url: str, token: str | None, *method: str) -> subprocess.CompletedProcess[str]:
    found = npm_tool("mcp-inspector")
    if found is None:
        pytest.skip("the MCP Inspector is not installed: .ci/run installs @modelcontextprotocol/inspector with npm into build/npm")
    header = ["--header", f"Authorization: Bearer {token}"] if token is not None else []
    return subprocess.run([found, "--cli", url, "--transport", "http", *header, *method], capture_output=True, text=True, env=cli_env(), timeout=WAIT)


def test_the_mcp_inspector_cli_over_http_lists_asks_on_both_replicas_and_is_refused_without_a_token(service: Service) -> None:
    alice = service.tokens["alice"]
    listed = inspector(service.endpoint(0), alice, "--method", "tools/list")
    assert listed.returncode == 0, listed.stderr
    assert [tool["name"] for tool in json.loads(listed.stdout)["tools"]] == TOOLS
    asked = inspector(service.endpoint(0), alice, "--method", "tools/call", "--tool-name", "ask", "--tool-arg", "question=RUN<<y = 7\nprint(y)>>")
    assert asked.returncode == 0, asked.stderr
    first = json.loads(asked.stdout)["structuredContent"]
    arguments = ["question=RUN<<print(y * 6)>>", f"session_id={first['session_id']}"]
    again = inspector(service.endpoint(1), alice, "--method", "tools/call", "--tool-name", "ask", "--tool-arg", *arguments)
    assert again.returncode == 0, again.stderr
    assert "42" in json.loads(again.stdout)["structuredContent"]["answer"]
    stranger = inspector(
        service.endpoint(1), service.tokens["bob"], "--method", "tools/call", "--tool-name", "variables", "--tool-arg", f"session_id={first['session_id']}"
    )
    assert "was not found" in stranger.stdout + stranger.stderr
    anonymous = inspector(service.endpoint(0), None, "--method", "tools/list")
    assert anonymous.returncode != 0 and "This server needs your user's token" in anonymous.stderr, anonymous.stderr
