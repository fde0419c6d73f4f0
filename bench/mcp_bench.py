"""What MCP costs, both ways, against a baseline run beside it on the same machine.

1. `ask` over MCP against the same turn through `Session.ask` in-process (on the main thread, as
   the chat runs it): the same scripted model (no delay), the same request (the Planner delegates one
   cell that adds one to x, then answers), each in a warm session of its own; the two take turns, one
   request each, so that the machine's load falls on both alike. Over MCP the clock runs in the
   client (the SDK's stdio client driving `taskweaver-lite mcp`) from the call to its result.
2. A tool call of `mcp-server-time` (`get_current_time`) from a cell against calling the server
   directly with the SDK's client in this process; and the same cell without the call (a dict
   literal), which is what running a cell costs anyway.

Medians of `--turns` timed requests (after two untimed ones) and of `--calls` calls; printed as ms
and ratios.

    python bench/mcp_bench.py [--turns 20] [--calls 50]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import yaml
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from taskweaver_lite.cli.demo import bundled_project
from taskweaver_lite.config.settings import ExecutionConfig, McpServerConfig
from taskweaver_lite.kernel.executor import KernelExecutor
from taskweaver_lite.session.workspace import Workspace
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, last_user_text, planner_reply

TIME_SERVER = str(Path(sys.executable).parent / "mcp-server-time")
CELL_WITH_CALL = "now = time.get_current_time(timezone='UTC')"
CELL_WITHOUT = "now = {'timezone': 'UTC', 'datetime': '2026-01-01T00:00:00+00:00', 'day_of_week': 'Thursday', 'is_dst': False}"


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


async def turns_both_ways(folder: Path, turns: int) -> tuple[list[float], list[float]]:
    """Milliseconds per turn in-process (`Session.ask`, on this thread as in the chat) and over MCP (as the SDK's client sees it), alternating."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "taskweaver_lite", "mcp", "-p", str(folder)])
    async with Client(stdio_client(params, errlog=sys.stderr), read_timeout_seconds=300) as client:
        with Workspace.load(folder) as workspace, workspace.new_session() as session:
            first = await client.call_tool("ask", {"question": "add one to x"})
            assert first.structured_content is not None, first
            arguments = {"question": "add one to x", "session_id": first.structured_content["session_id"]}
            times: tuple[list[float], list[float]] = ([], [])
            for number in range(turns + 2):
                started = time.perf_counter()
                session.ask("add one to x")
                middle = time.perf_counter()
                await client.call_tool("ask", arguments)
                if number >= 2:  # two untimed turns each first
                    times[0].append((middle - started) * 1000)
                    times[1].append((time.perf_counter() - middle) * 1000)
    return times


async def direct_calls(calls: int) -> list[float]:
    """Milliseconds per `get_current_time` called with the SDK's client in this process."""
    async with Client(stdio_client(StdioServerParameters(command=TIME_SERVER), errlog=sys.stderr), read_timeout_seconds=60) as client:
        await client.call_tool("get_current_time", {"timezone": "UTC"})
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            await client.call_tool("get_current_time", {"timezone": "UTC"})
            times.append((time.perf_counter() - started) * 1000)
    return times


def cell_calls(root: Path, calls: int) -> tuple[list[float], list[float]]:
    """Milliseconds per cell that calls the tool, and per cell that makes the same dict without it (the same kernel)."""
    servers = {"time": McpServerConfig(command=[TIME_SERVER])}
    with KernelExecutor(root / "session", config=ExecutionConfig(timeout=60), mcp_servers=servers) as kernel:
        kernel.wait_ready()
        kernel.run(CELL_WITH_CALL)
        timed: dict[str, list[float]] = {CELL_WITH_CALL: [], CELL_WITHOUT: []}
        for _ in range(calls):
            for code, times in timed.items():
                started = time.perf_counter()
                result = kernel.run(code)
                times.append((time.perf_counter() - started) * 1000)
                assert result.success, result.error
    return timed[CELL_WITH_CALL], timed[CELL_WITHOUT]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="mcp-bench-"))
    with ScriptedServer() as server:
        server.set_default("planner", planner)
        server.set_default("code_generator", code_reply("x = globals().get('x', 0) + 1"))
        folder = project(root, server.url)
        chat, mcp = (statistics.median(times) for times in anyio.run(turns_both_ways, folder, args.turns))
    direct = statistics.median(anyio.run(direct_calls, args.calls))
    with_call, without = (statistics.median(times) for times in cell_calls(root, args.calls))
    print(f"ask over MCP: {mcp:.1f} ms; the same turn in-process: {chat:.1f} ms; MCP adds {mcp - chat:.1f} ms (x{mcp / chat:.2f})")
    print(f"tool call from a cell: {with_call:.1f} ms; the same cell without it: {without:.1f} ms; the call itself: {with_call - without:.1f} ms")
    call = (with_call - without) / direct
    print(f"the server called directly: {direct:.1f} ms; from a cell the call costs x{call:.2f} of that, the whole cell x{with_call / direct:.2f}")


if __name__ == "__main__":
    main()
