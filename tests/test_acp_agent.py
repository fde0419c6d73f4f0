"""`taskweaver-lite acp` driven by the Agent Client Protocol SDK's own client (`spawn_agent_process`), as an editor drives it:
two prompts that share a variable, each cell a tool call with its code and output, the plan, a plot as an image, the
editor's folder read-only and its MCP server in the kernel, a cancel, confirm mode's permission (a rejected cell never
runs), bad input, and a session loaded by a second process with its history."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from acp import PROTOCOL_VERSION, RequestError, text_block
from acp.core import ClientSideConnection
from acp.schema import (
    AgentMessageChunk,
    AgentPlanUpdate,
    AllowedOutcome,
    ContentToolCallContent,
    ImageContentBlock,
    McpServerStdio,
    RequestPermissionResponse,
    TextContentBlock,
    ToolCallProgress,
    ToolCallStart,
    UserMessageChunk,
)
from acp.stdio import spawn_agent_process
from helpers import cli_env, make_project

from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, last_user_text, planner_reply, text_reply

pytestmark = pytest.mark.cli

WAIT = 240  # seconds one request may take on a loaded machine (a kernel starts, cells re-run)

STEPS = {
    "set x": "Set x = 42 and print it.",
    "double x": "Compute x*2-2 from the kept x and print it.",
    "plot": "Plot x.",
    "sleep": "Sleep for a long while.",
    "read my notes": "Read the user's notes.txt and try to change it.",
    "delete my file": "Delete the user's file.",
    "clock": "Ask the clock server for the time in UTC.",
}
CELLS = {
    "x = 42": "x = 42\nprint(x)",
    "x*2-2": "print(x*2-2)",
    "Plot x": "import matplotlib.pyplot as plt\nplt.plot([1, 2, x])\nplt.show()",
    "Sleep": "import time\nprint('sleeping', flush=True)\ntime.sleep(600)",
    "notes.txt": (
        "print(open(NOTES).read())\ntry:\n    open(NOTES, 'a').write('changed')\n    print('WRITTEN')\n"
        "except OSError as exc:\n    print('REFUSED', type(exc).__name__)"
    ),
    "Delete": "open('gone.txt', 'w').write('x')\nprint('deleted')",
    "clock": "now = clock.get_current_time(timezone='UTC')\nprint(now['timezone'])",
}


PLAN = "1. run the step\n2. report the result"


def planner(messages: list[dict[str, Any]]) -> str:
    """Delegates each request by its words; answers with the number the last cell printed, or says what happened."""
    text = last_user_text(messages)
    if "declined" in text:
        return planner_reply("You declined, so nothing was deleted.", send_to="User", plan=PLAN, current_plan_step="2. report the result")
    if "Execution result" in text or "The code" in text or "Output" in text:
        printed = re.findall(r"\b(42|82|UTC|REFUSED|WRITTEN)\b", text)
        answer = f"The answer is {printed[-1]}." if printed else "Done."
        return planner_reply(answer, send_to="User", plan=PLAN, current_plan_step="2. report the result")
    for words, step in STEPS.items():
        if words in text:
            return planner_reply(step, plan=PLAN, current_plan_step="1. run the step")
    return planner_reply("Nothing to do.", send_to="User")


def coder(folder: Path) -> Any:
    def reply(messages: list[dict[str, Any]]) -> str:
        text = last_user_text(messages)
        if "declined" in text:
            return text_reply("The user declined to run the deletion.")
        code = next(code for words, code in CELLS.items() if words in text)
        return code_reply(code.replace("NOTES", repr(str(folder / "notes.txt"))))

    return reply


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """The editor's folder: a file of the analyst's."""
    path = tmp_path / "acp-folder"
    path.mkdir()
    (path / "notes.txt").write_text("the analyst's notes\n", encoding="utf-8")
    # Anyone may write them: only the read-only mount stops the kernel (a root-run sandbox runs it as a uid of its own).
    path.chmod(0o777)
    (path / "notes.txt").chmod(0o666)
    return path


@pytest.fixture
def server(folder: Path) -> Iterator[ScriptedServer]:
    with ScriptedServer() as scripted:
        scripted.set_default("planner", planner)
        scripted.set_default("code_generator", coder(folder))
        yield scripted


@pytest.fixture
def project(tmp_path: Path, server: ScriptedServer) -> Path:
    return make_project(tmp_path, server.url)


class Editor:
    """The editor's side: every update it was sent, by session, and its answer to each permission request."""

    def __init__(self, answers: list[str] | None = None) -> None:
        self.updates: list[Any] = []
        self.answers = list(answers or [])
        self.asked: list[Any] = []

    async def session_update(self, session_id: str, update: Any, **_: Any) -> None:
        self.updates.append(update)

    async def request_permission(self, options: list[Any], session_id: str, tool_call: Any, **_: Any) -> RequestPermissionResponse:
        self.asked.append((tool_call, [option.option_id for option in options]))
        return RequestPermissionResponse(outcome=AllowedOutcome(option_id=self.answers.pop(0), outcome="selected"))

    def of(self, kind: type) -> list[Any]:
        return [update for update in self.updates if isinstance(update, kind)]

    def answer(self) -> str:
        return "".join(update.content.text for update in self.of(AgentMessageChunk))

    def clear(self) -> None:
        self.updates.clear()


@asynccontextmanager
async def agent(project: Path, editor: Editor, *options: str) -> AsyncIterator[ClientSideConnection]:
    """The SDK's client with `taskweaver-lite acp -p PROJECT [OPTIONS]` as its agent process, initialized."""
    command = [sys.executable, "-m", "taskweaver_lite", "acp", "-p", str(project), *options]
    async with spawn_agent_process(editor, *command, env=cli_env(), transport_kwargs={"stderr": None}) as (conn, _process):  # type: ignore[arg-type]
        reply = await asyncio.wait_for(conn.initialize(protocol_version=PROTOCOL_VERSION), WAIT)
        assert reply.agent_capabilities is not None and reply.agent_capabilities.load_session
        yield conn


async def ask(conn: ClientSideConnection, session_id: str, text: str) -> str:
    response = await asyncio.wait_for(conn.prompt(session_id=session_id, prompt=[text_block(text)]), WAIT)
    return response.stop_reason


def texts(update: Any) -> str:
    blocks = [item.content for item in update.content or [] if isinstance(item, ContentToolCallContent)]
    return "\n".join(block.text for block in blocks if isinstance(block, TextContentBlock))


def stored_sessions(project: Path) -> list[dict[str, Any]]:
    done = subprocess.run([sys.executable, "-m", "taskweaver_lite", "sessions", "-p", str(project), "--json"], capture_output=True, text=True, env=cli_env())
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def test_an_editor_asks_twice_sees_cells_plan_and_plot_reads_its_folder_and_cancels(project: Path, folder: Path, server: ScriptedServer) -> None:
    editor = Editor()
    clock = McpServerStdio(name="clock", command=shutil.which("mcp-server-time") or "mcp-server-time", args=[], env=[])

    async def scenario() -> None:
        async with agent(project, editor) as conn:
            session_id = (await conn.new_session(cwd=str(folder), mcp_servers=[clock])).session_id
            assert await ask(conn, session_id, "set x please") == "end_turn"
            assert editor.answer() == "The answer is 42."
            [start] = editor.of(ToolCallStart)
            assert start.kind == "execute" and start.raw_input == {"code": "x = 42\nprint(x)"} and "x = 42" in texts(start)
            assert start.title == "Set x = 42 and print it."
            ended = editor.of(ToolCallProgress)[-1]
            assert ended.tool_call_id == start.tool_call_id and ended.status == "completed"
            assert "42" in texts(ended) and "x = 42" in texts(ended)
            plans = editor.of(AgentPlanUpdate)
            assert [(entry.content, entry.status) for entry in plans[0].entries] == [("run the step", "in_progress"), ("report the result", "pending")]
            assert [entry.status for entry in plans[-1].entries] == ["completed", "completed"]

            editor.clear()
            assert await ask(conn, session_id, "now double x minus two") == "end_turn"
            assert editor.answer() == "The answer is 82."

            editor.clear()
            assert await ask(conn, session_id, "plot it") == "end_turn"
            images = [item.content for item in editor.of(ToolCallProgress)[-1].content if isinstance(item.content, ImageContentBlock)]
            assert images and images[0].mime_type == "image/png" and images[0].data.startswith("iVBORw0KGgo")  # base64 of the PNG signature

            editor.clear()
            assert await ask(conn, session_id, "read my notes") == "end_turn"
            output = texts(editor.of(ToolCallProgress)[-1])
            assert "the analyst's notes" in output and "REFUSED" in output, output  # lent read-only
            assert (folder / "notes.txt").read_text(encoding="utf-8") == "the analyst's notes\n"

            editor.clear()
            assert await ask(conn, session_id, "what does the clock say") == "end_turn"
            assert editor.answer() == "The answer is UTC."

            editor.clear()
            prompt = asyncio.ensure_future(ask(conn, session_id, "sleep now"))
            await wait_for_output(editor, "\nsleeping\n")  # the output, not the code
            await conn.cancel(session_id=session_id)
            assert await asyncio.wait_for(prompt, 20) == "cancelled"  # within seconds, not at the cell's 30 s timeout
            assert editor.of(ToolCallProgress)[-1].status == "failed"

            editor.clear()
            assert await ask(conn, session_id, "double x again") == "end_turn"
            assert editor.answer() == "The answer is 82."

    asyncio.run(scenario())
    [row] = stored_sessions(project)
    assert row["rounds"] == 7  # the cancelled round is stored too, failed


async def wait_for_output(editor: Editor, text: str) -> None:
    """Until a running cell's live output shows `text`."""
    deadline = asyncio.get_running_loop().time() + WAIT
    while not any(text in texts(update) for update in editor.of(ToolCallProgress)):
        assert asyncio.get_running_loop().time() < deadline, f"no cell printed {text!r}"
        await asyncio.sleep(0.05)


def test_past_acp_max_open_sessions_an_idle_session_is_closed_for_room_and_while_all_answer_another_is_refused(
    project: Path, folder: Path, server: ScriptedServer
) -> None:
    editor = Editor()

    async def scenario() -> None:
        async with agent(project, editor, "--set", "acp.max_open_sessions=1") as conn:
            first = (await conn.new_session(cwd=str(folder), mcp_servers=[])).session_id
            assert await ask(conn, first, "set x please") == "end_turn"
            second = (await conn.new_session(cwd=str(folder), mcp_servers=[])).session_id  # the idle first one is closed for it
            prompt = asyncio.ensure_future(ask(conn, second, "sleep now"))
            await wait_for_output(editor, "\nsleeping\n")
            openings = (lambda: conn.new_session(cwd=str(folder), mcp_servers=[]), lambda: conn.prompt(session_id=first, prompt=[text_block("double x")]))
            for opening in openings:  # a new thread, and the first one's (closed for room) reopened
                with pytest.raises(RequestError) as refused:
                    await asyncio.wait_for(opening(), WAIT)
                assert "acp.max_open_sessions" in str(refused.value) and "all answering" in str(refused.value), str(refused.value)
            await conn.cancel(session_id=second)
            assert await asyncio.wait_for(prompt, 20) == "cancelled"
            editor.clear()
            assert await ask(conn, first, "double x") == "end_turn", "once the other stopped, the first one reopens (its x rebuilt)"
            assert editor.answer() == "The answer is 82."

    asyncio.run(scenario())
    assert len(stored_sessions(project)) == 2, "a refused thread stores nothing"


def test_confirm_mode_asks_before_each_cell_and_a_rejected_cell_never_runs(project: Path, folder: Path, server: ScriptedServer) -> None:
    editor = Editor(answers=["reject_once", "allow_once"])

    async def scenario() -> None:
        async with agent(project, editor, "--set", "execution.confirm=true") as conn:
            session_id = (await conn.new_session(cwd=str(folder), mcp_servers=[])).session_id
            assert await ask(conn, session_id, "delete my file") == "end_turn"
            assert editor.answer() == "You declined, so nothing was deleted."
            [(asked, options)] = editor.asked
            assert options == ["allow_once", "allow_always", "reject_once"] and asked.raw_input == {"code": CELLS["Delete"]}
            [start] = editor.of(ToolCallStart)
            assert start.tool_call_id == asked.tool_call_id and start.status == "pending"
            ended = editor.of(ToolCallProgress)[-1]
            assert ended.status == "failed" and "declined" in texts(ended)
            editor.clear()
            assert await ask(conn, session_id, "set x please") == "end_turn"
            assert editor.answer() == "The answer is 42." and len(editor.asked) == 2

    asyncio.run(scenario())
    assert not list(project.glob("sessions/*/cwd/gone.txt")), "a rejected cell ran"
    told = [r for r in server.requests if r.role == "code_generator"][1].messages[-1]["content"]
    assert "the user declined to run it" in told


def test_bad_input_is_an_error_of_one_line_and_stores_nothing(project: Path, folder: Path) -> None:
    async def scenario() -> list[str]:
        said = []
        async with agent(project, Editor()) as conn:
            attempts = [
                conn.new_session(cwd="relative/folder", mcp_servers=[]),
                conn.new_session(cwd=str(folder / "missing"), mcp_servers=[]),
                conn.prompt(session_id="no-such-session", prompt=[text_block("set x")]),
                conn.load_session(cwd=str(folder), session_id="no-such-session", mcp_servers=[]),
            ]
            for attempt in attempts:
                with pytest.raises(RequestError) as refused:
                    await asyncio.wait_for(attempt, WAIT)
                said.append(str(refused.value))
        return said

    said = asyncio.run(scenario())
    assert said[0] == "cwd must be an absolute path (the editor's working folder), not 'relative/folder'"
    assert said[1].endswith("missing is not a folder on this machine")
    assert said[2].startswith("no open session 'no-such-session'")
    assert said[3] == "no session 'no-such-session' in this project (session/new starts one)"
    assert all("\n" not in line for line in said)
    assert stored_sessions(project) == []


def test_an_empty_or_overlong_prompt_is_refused_and_the_session_goes_on(project: Path, folder: Path) -> None:
    async def scenario() -> list[str]:
        said = []
        async with agent(project, Editor()) as conn:
            session_id = (await conn.new_session(cwd=str(folder), mcp_servers=[])).session_id
            for text in ("   ", "y" * 20_001):
                with pytest.raises(RequestError) as refused:
                    await ask(conn, session_id, text)
                said.append(str(refused.value))
            assert await ask(conn, session_id, "set x") == "end_turn"
        return said

    said = asyncio.run(scenario())
    assert said[0] == "the prompt is empty: write a request"
    assert said[1] == "the prompt has 20,001 characters; at most 20,000 are taken (link large files rather than pasting them)"
    [row] = stored_sessions(project)
    assert row["rounds"] == 1


def test_a_second_process_loads_the_session_with_its_history_and_variables(project: Path, folder: Path) -> None:
    first, second = Editor(), Editor()

    async def start() -> str:
        async with agent(project, first) as conn:
            session_id = (await conn.new_session(cwd=str(folder), mcp_servers=[])).session_id
            assert await ask(conn, session_id, "set x please") == "end_turn"
            return session_id

    async def resume(session_id: str) -> None:
        async with agent(project, second) as conn:
            await asyncio.wait_for(conn.load_session(cwd=str(folder), session_id=session_id, mcp_servers=[]), WAIT)
            [request] = second.of(UserMessageChunk)
            assert request.content.text == "set x please"
            assert second.answer() == "The answer is 42."
            [cell] = second.of(ToolCallStart)
            assert cell.raw_input == {"code": "x = 42\nprint(x)"}
            assert second.of(ToolCallProgress)[-1].status == "completed" and "42" in texts(second.of(ToolCallProgress)[-1])
            second.clear()
            assert await ask(conn, session_id, "now double x minus two") == "end_turn"
            assert second.answer() == "The answer is 82."  # x came back: the first process's cell re-ran

    session_id = asyncio.run(start())
    asyncio.run(resume(session_id))
    [row] = stored_sessions(project)
    assert row["id"] == session_id and row["rounds"] == 2


def test_the_editor_settings_as_the_docs_write_them_work_from_any_folder_without_the_venv_on_path(project: Path, folder: Path) -> None:
    """The docs' Zed and JetBrains entries: the console script's full path, `acp -p PROJECT`, started from / with a bare PATH."""
    command = str(Path(sys.executable).parent / "taskweaver-lite")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(folder.parent)}
    editor = Editor()

    async def scenario() -> str:
        async with spawn_agent_process(editor, command, "acp", "-p", str(project), env=env, cwd="/", transport_kwargs={"stderr": None}) as (conn, _):  # type: ignore[arg-type]
            await asyncio.wait_for(conn.initialize(protocol_version=PROTOCOL_VERSION), WAIT)
            session_id = (await asyncio.wait_for(conn.new_session(cwd=str(folder), mcp_servers=[]), WAIT)).session_id
            return await ask(conn, session_id, "set x please")

    assert asyncio.run(scenario()) == "end_turn"
    assert editor.answer() == "The answer is 42."
