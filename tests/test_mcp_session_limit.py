"""`taskweaver-lite mcp` keeps at most `mcp.max_open_sessions` sessions, and so kernels, open however many asks come at once.

The official SDK's client starts the server with the limit at 2 and sends five asks together, each
for a new session whose cell takes a while. The kernels under the server are counted as it runs:
never more than two, every ask is answered, and those that had to wait heard why, naming the setting.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from helpers import cli_env, make_project
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, last_user_text, planner_reply

pytestmark = pytest.mark.cli

WAIT = 240  # seconds one call may take on a loaded machine
ASKS = 5
LIMIT = 2


def planner(messages: list[dict[str, Any]]) -> str:
    text = last_user_text(messages)
    if "Execution result" in text or "The code" in text or "execution succeeded" in text:
        return planner_reply("The answer is 42.", send_to="User")
    return planner_reply("Wait long, then print 42." if "slow" in text else "Wait a moment, then print 42.")


def coder(messages: list[dict[str, Any]]) -> str:
    """Each cell takes a while (1.5 s); the slow one runs until the test makes the file `go` in its working folder, however busy the machine."""
    if "Wait long" in last_user_text(messages):
        return code_reply("import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.05)\nprint(42)")
    return code_reply("import time\ntime.sleep(1.5)\nprint(42)")


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    with ScriptedServer() as server:
        server.set_default("planner", planner)
        server.set_default("code_generator", coder)
        yield make_project(tmp_path, server.url)


class KernelCount:
    """The most kernels seen at once under the process `pid`: distinct connection files of ipykernel command lines, sampled on a thread."""

    def __init__(self) -> None:
        self.most = 0
        self._pid: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def watch(self, pid: int) -> None:
        self._pid = pid
        self._thread.start()

    def _watch(self) -> None:
        assert self._pid is not None
        server = psutil.Process(self._pid)
        while not self._stop.is_set():
            kernels: set[str] = set()
            try:
                children = server.children(recursive=True)
            except psutil.Error:
                return
            for child in children:
                try:
                    command = child.cmdline()
                except psutil.Error:
                    continue
                if "ipykernel_launcher" in command and "-f" in command[:-1] and child.name() != "bwrap":
                    kernels.add(command[command.index("-f") + 1])
            self.most = max(self.most, len(kernels))
            time.sleep(0.05)

    def stop(self) -> int:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        return self.most


def server_pid(project: Path) -> int:
    """The `taskweaver-lite mcp` process serving `project` (the SDK's client started it as a child of this one)."""
    for child in psutil.Process().children(recursive=True):
        try:
            command = child.cmdline()
        except psutil.Error:
            continue
        if "mcp" in command and str(project) in command:
            return child.pid
    raise AssertionError("no taskweaver-lite mcp process under the test")


def start(project: Path, limit: int) -> Client:
    """The SDK's client with `taskweaver-lite mcp` as its server, `limit` sessions open at most, none let go for idleness."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "taskweaver_lite", "mcp", "-p", str(project), "--set", f"mcp.max_open_sessions={limit}", "--set", "mcp.session_idle_timeout=0"],
        env=cli_env(),
    )
    return Client(stdio_client(params, errlog=sys.stderr), read_timeout_seconds=WAIT)


def test_concurrent_asks_past_max_open_sessions_wait_for_a_free_one_and_never_open_more_kernels(project: Path) -> None:
    kernels = KernelCount()
    results: list[Any] = []
    heard: list[str] = []

    async def scenario() -> None:
        async with start(project, LIMIT) as client:
            await client.list_tools()
            kernels.watch(server_pid(project))

            async def progress(progress: float, total: float | None, message: str | None) -> None:
                heard.append(message or "")

            async def ask(number: int) -> None:
                results.append(await client.call_tool("ask", {"question": f"question {number}"}, progress_callback=progress))

            async with anyio.create_task_group() as group:
                for number in range(ASKS):
                    group.start_soon(ask, number)

    try:
        anyio.run(scenario)
    finally:
        most = kernels.stop()
    assert len(results) == ASKS
    answers = [result.structured_content for result in results]
    assert all(not result.is_error for result in results), answers
    assert [answer["answer"] for answer in answers] == ["The answer is 42."] * ASKS
    assert len({answer["session_id"] for answer in answers}) == ASKS
    assert 1 <= most <= LIMIT, f"{most} kernels were running at once under a limit of {LIMIT}"
    waited = [line for line in heard if line.startswith("Waiting for a free session")]
    assert waited and all("mcp.max_open_sessions" in line for line in waited), heard


def test_an_ask_cancelled_while_it_waits_for_a_free_session_gives_its_place_back(project: Path) -> None:
    kernels = KernelCount()
    heard: list[str] = []
    answers: list[Any] = []

    async def scenario() -> None:
        async with start(project, 1) as client:
            await client.list_tools()
            kernels.watch(server_pid(project))
            running, waiting = anyio.Event(), anyio.Event()

            async def first_progress(progress: float, total: float | None, message: str | None) -> None:
                if message == "Running code":
                    running.set()

            async def second_progress(progress: float, total: float | None, message: str | None) -> None:
                heard.append(message or "")
                if (message or "").startswith("Waiting for a free session"):
                    waiting.set()

            async def slow() -> None:
                answers.append(await client.call_tool("ask", {"question": "a slow one"}, progress_callback=first_progress))

            async with anyio.create_task_group() as group:
                group.start_soon(slow)
                with anyio.fail_after(WAIT):
                    await running.wait()
                with anyio.CancelScope() as second:  # cancelled once it says it waits: the host's Stop

                    async def wait_then_stop() -> None:
                        with anyio.fail_after(WAIT):
                            await waiting.wait()
                        second.cancel()

                    group.start_soon(wait_then_stop)
                    await client.call_tool("ask", {"question": "another"}, progress_callback=second_progress)
                for working in (project / "sessions").glob("*/cwd"):  # the slow one may finish now: the other ask was cancelled while it waited
                    (working / "go").touch()
            with anyio.fail_after(WAIT):  # the slow one answered; the cancelled one's place is free for the next
                answers.append(await client.call_tool("ask", {"question": "the next one"}))

    try:
        anyio.run(scenario)
    finally:
        most = kernels.stop()
    assert any(line.startswith("Waiting for a free session") and "mcp.max_open_sessions" in line for line in heard), heard
    assert [answer.structured_content["answer"] for answer in answers] == ["The answer is 42."] * 2, answers
    assert most == 1, f"{most} kernels ran at once under a limit of 1"
