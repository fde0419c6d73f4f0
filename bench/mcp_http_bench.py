"""What MCP over HTTP costs: `ask` at `serve`'s `/mcp` against the same warm turn through `Session.ask`, measured side by side.

The same scripted model (no delay), the same request (the Planner delegates one cell that adds one
to x, then answers), each in a warm session of its own. Over HTTP the clock runs in the client: the
SDK's Streamable HTTP client, sending a user's bearer token, from the call to its result, against a
`taskweaver-lite serve` process on this machine (the project's SQLite store, the user checked on
every request). In-process, `Session.ask` on the main thread, as the chat runs it. The two take
turns, one request each, so that the machine's load falls on both alike.

Medians of `--turns` timed requests (after two untimed ones each), printed as ms and their ratio.

    python bench/mcp_http_bench.py [--turns 20]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from taskweaver_lite.cli.demo import bundled_project
from taskweaver_lite.session.workspace import Workspace
from taskweaver_lite.testing.replicas import ServeProcess
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, last_user_text, planner_reply

LIMIT = 1.15  # what the HTTP turn may cost at most, against the same turn in-process


def planner(messages: list[dict[str, Any]]) -> str:
    if "Execution result" in last_user_text(messages) or "The code" in last_user_text(messages):
        return planner_reply("x is one more now.", send_to="User")
    return planner_reply("Add one to x.")


def project(root: Path, url: str) -> Path:
    folder = root / "project"
    shutil.copytree(bundled_project(), folder, ignore=shutil.ignore_patterns("sessions", "*.db*"))
    config = {"llm": {"api_base": url, "api_key": "bench", "model": "scripted", "stream": False}, "execution": {"timeout": 60}}
    (folder / "taskweaver_config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return folder


def add_user(folder: Path) -> str:
    """A user in the project's store (so `serve` checks a token on every request); their token."""
    done = subprocess.run([sys.executable, "-m", "taskweaver_lite", "users", "add", "bench", "-p", str(folder)], capture_output=True, text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


async def turns_both_ways(folder: Path, url: str, token: str, turns: int) -> tuple[list[float], list[float]]:
    """Milliseconds per turn in-process (`Session.ask`, on this thread as in the chat) and over HTTP (as the SDK's client sees it), alternating."""
    headers = {"Authorization": f"Bearer {token}"}
    async with create_mcp_http_client(headers=headers) as http, Client(streamable_http_client(url, http_client=http), read_timeout_seconds=300) as client:
        with Workspace.load(folder) as workspace, workspace.new_session() as session:
            first = await client.call_tool("ask", {"question": "add one to x"})
            assert first.structured_content is not None and not first.is_error, first
            arguments = {"question": "add one to x", "session_id": first.structured_content["session_id"]}
            times: tuple[list[float], list[float]] = ([], [])
            for number in range(turns + 2):
                started = time.perf_counter()
                session.ask("add one to x")
                middle = time.perf_counter()
                answered = await client.call_tool("ask", arguments)
                ended = time.perf_counter()
                assert answered.structured_content is not None and answered.structured_content["state"] == "finished", answered
                if number >= 2:  # two untimed turns each first
                    times[0].append((middle - started) * 1000)
                    times[1].append((ended - middle) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="mcp-http-bench-"))
    try:
        with ScriptedServer() as model:
            model.set_default("planner", planner)
            model.set_default("code_generator", code_reply("x = globals().get('x', 0) + 1"))
            folder = project(root, model.url)
            token = add_user(folder)
            with ServeProcess.start(folder) as serve:
                chat, http = (statistics.median(times) for times in anyio.run(turns_both_ways, folder, serve.url + "/mcp", token, args.turns))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratio = http / chat
    print(f"ask over HTTP (/mcp, a bearer token): {http:.1f} ms; the same turn through Session.ask: {chat:.1f} ms; HTTP adds {http - chat:.1f} ms")
    print(f"ratio: x{ratio:.2f} (at most x{LIMIT:.2f}: {'within' if ratio <= LIMIT else 'OVER'})")


if __name__ == "__main__":
    main()
