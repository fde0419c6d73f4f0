"""What the Agent Client Protocol costs: a prompt from an editor against the same turn through `Session.ask`.

An ACP `session/prompt` as the SDK's own client sees it (`spawn_agent_process` driving
`taskweaver-lite acp`), from the request to its response, every update streamed on the way (the
plan, the cell's tool call and its output, the answer's chunks), against `Session.ask` in-process on
the main thread, as the chat runs it: the same scripted model (streaming, no delay), the same
request (the Planner delegates one cell that adds one to x, then answers), each in a warm session of
its own. The two take turns, one request each, so that the machine's load falls on both alike.

Medians of `--turns` timed requests (after two untimed ones) per round, over `--rounds` rounds;
printed as ms and the ratio (target: at most 1.10x), with the median of each pair's own ratio (the
two requests of a pair run back to back, so a load that comes and goes touches both alike).

    python bench/acp_bench.py [--turns 30] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from acp import PROTOCOL_VERSION, text_block
from acp.schema import AgentMessageChunk, RequestPermissionResponse
from acp.stdio import spawn_agent_process

from taskweaver_lite.cli.demo import bundled_project
from taskweaver_lite.session.workspace import Workspace
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, last_user_text, planner_reply

TARGET = 1.10


def planner(messages: list[dict[str, Any]]) -> str:
    if "Execution result" in last_user_text(messages) or "The code" in last_user_text(messages):
        return planner_reply("x is one more now.", send_to="User")
    return planner_reply("Add one to x.")


def project(root: Path, url: str) -> Path:
    folder = root / "project"
    shutil.copytree(bundled_project(), folder, ignore=shutil.ignore_patterns("sessions", "*.db*"))
    config = {"llm": {"api_base": url, "api_key": "bench", "model": "scripted"}, "execution": {"timeout": 60}}
    (folder / "taskweaver_config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return folder


class Editor:
    """The client's side: it counts the updates and keeps the answer's chunks."""

    def __init__(self) -> None:
        self.updates = 0
        self.answer = ""

    async def session_update(self, session_id: str, update: Any, **_: Any) -> None:
        self.updates += 1
        if isinstance(update, AgentMessageChunk):
            self.answer += update.content.text

    async def request_permission(self, **_: Any) -> RequestPermissionResponse:
        raise AssertionError("no cell is asked for in this bench")


async def turns_both_ways(folder: Path, turns: int) -> tuple[list[float], list[float], int]:
    """Milliseconds per turn in-process (`Session.ask` on this thread) and over ACP (as the SDK's client sees it), alternating; updates per turn."""
    editor = Editor()
    command = [sys.executable, "-m", "taskweaver_lite", "acp", "-p", str(folder)]
    async with spawn_agent_process(editor, *command, transport_kwargs={"stderr": None}) as (conn, _process):  # type: ignore[arg-type]
        await conn.initialize(protocol_version=PROTOCOL_VERSION)
        session_id = (await conn.new_session(cwd=str(folder.parent), mcp_servers=[])).session_id
        with Workspace.load(folder) as workspace, workspace.new_session() as session:
            chat: list[float] = []
            acp: list[float] = []
            for number in range(turns + 2):
                started = time.perf_counter()
                rnd = session.ask("add one to x")
                middle = time.perf_counter()
                editor.answer, before = "", editor.updates
                response = await conn.prompt(session_id=session_id, prompt=[text_block("add one to x")])
                ended = time.perf_counter()
                assert rnd.answer == editor.answer == "x is one more now." and response.stop_reason == "end_turn", (rnd.answer, editor.answer)
                if number >= 2:  # two untimed turns each first
                    chat.append((middle - started) * 1000)
                    acp.append((ended - middle) * 1000)
            updates = editor.updates - before
    return chat, acp, updates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="acp-bench-"))
    ratios = []
    with ScriptedServer() as server:
        server.set_default("planner", planner)
        server.set_default("code_generator", code_reply("x = globals().get('x', 0) + 1"))
        for number in range(args.rounds):
            folder = project(root / str(number), server.url)
            chat, acp, updates = asyncio.run(turns_both_ways(folder, args.turns))
            chat_ms, acp_ms = statistics.median(chat), statistics.median(acp)
            ratio = acp_ms / chat_ms
            paired = statistics.median(one / other for one, other in zip(acp, chat, strict=True))
            ratios.append(ratio)
            print(f"round {number + 1}: ACP prompt {acp_ms:.1f} ms ({updates} updates), Session.ask {chat_ms:.1f} ms: x{ratio:.2f} (pairs x{paired:.2f})")
    worst = max(ratios)
    verdict = "met" if worst <= TARGET else "missed"
    print(f"ACP prompt vs Session.ask: x{min(ratios):.2f}-x{worst:.2f} (median x{statistics.median(ratios):.2f}); target at most x{TARGET:.2f}: {verdict}")


if __name__ == "__main__":
    main()
