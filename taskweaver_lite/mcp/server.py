"""This agent as an MCP server: an MCP host (Claude Desktop, VS Code, any MCP client) asks it questions.

`taskweaver-lite mcp -p PROJECT` speaks MCP on its standard input and output (the official SDK's
stdio transport, each input line held only up to 4 MiB by `mcp/bounded_stdio.py`: nothing else reaches
stdout, logs go to stderr). Its tools:

- `ask` {question, session_id?}: one chat turn (the Planner, the CodeGenerator, the kernel,
  compression, the store) in a new session or in the one `session_id` names; it answers with the
  Planner's answer and the session's id, in its text and its structured content. A session stays
  open here with its kernel (the few used last); one that is not open is resumed from the store,
  its cells re-run to rebuild its variables. A long turn reports progress; a cancelled request
  interrupts the cell, fails the round as a Ctrl-C does, and keeps the session.
- `sessions` {}: the stored sessions, newest first.
- `variables` {session_id}: the variables a session's kernel holds: now if it is open here, else as its last cell left them (stored: it never runs code).

What the cells produced (plots, files in the working folder) are resources, with MIME types, under
`taskweaver-lite://session/<id>/...`; `ask` links those of its turn. Bad input (an unknown session,
a question past MAX_QUESTION_CHARS, arguments that do not fit) is a protocol error with one line,
and nothing is stored for it.

It answers `initialize` and lists its tools before it has imported the session's stack or opened
the project: the first call that needs the project opens it (`session/lazy_workspace.py`), and a
project that cannot be opened (a damaged store, PostgreSQL down) fails that call with the reason.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from taskweaver_lite import __version__
from taskweaver_lite.errors import AmbiguousSessionError, ConfigError, TaskWeaverError, UnknownSessionError
from taskweaver_lite.mcp.bounded_stdio import bounded_stdio_server
from taskweaver_lite.mcp.resources import artifact_links, list_resources, read_resource
from taskweaver_lite.session.lazy_workspace import LazyWorkspace

# `initialize` and the tools' list are answered before any of these is imported: the session's stack comes
# with the first call that opens the project (session/lazy_workspace.py), the records with the first answer.
if TYPE_CHECKING:
    from taskweaver_lite.config.settings import Config
    from taskweaver_lite.records.conversation import Round
    from taskweaver_lite.records.events import Event
    from taskweaver_lite.records.execution import Variable
    from taskweaver_lite.session.session import Session
    from taskweaver_lite.session.workspace import Workspace

# The longest question `ask` takes: as long as a line the chat takes (put longer text in a file).
MAX_QUESTION_CHARS = 20_000
# Seconds between looks, while an ask waits for a free session, for a cancel of its request.
SLOT_POLL = 0.5
# Seconds a cancelled turn gets to stop its cell and store its failed round before the cancellation is answered.
STOP_WAIT = 60.0
# Seconds an ask waits for the session's previous answer before it is refused: as long as a cancelled one may take to
# wind down, so that asking again right after a cancel is answered, not refused, on a busy machine too.
BUSY_WAIT = STOP_WAIT
# Seconds between looks, until a call opened the project, for whether one has (the idle sessions' timer starts then).
OPENED_POLL = 0.5
ACTIVITY = {
    "planner_thinking": "The Planner is thinking",
    "code_writing": "Writing code",
    "code_running": "Running code",
    "repairing": "Repairing a reply",
    "role_working": "A role is working",
}
_T = TypeVar("_T")
Released = Literal["closed", "not open", "answering"]  # what close_session found

ASK = types.Tool(
    name="ask",
    title="Ask the data-analysis agent",
    description=(
        "Ask a data-analysis question in plain language. The agent plans, writes Python and runs it in a persistent, "
        "sandboxed kernel, and answers. Pass the session_id of an earlier answer to continue that session: its variables, "
        "files and history are kept. Plots and files the code writes are offered as resources."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "question": {"type": "string", "description": f"the request, up to {MAX_QUESTION_CHARS:,} characters"},
            "session_id": {"type": "string", "description": "continue this session (from an earlier answer); leave out to start a new one"},
        },
        "required": ["question"],
        "additionalProperties": False,
    },
    output_schema={
        "type": "object",
        "properties": {
            "answer": {"type": "string"},
            "session_id": {"type": "string"},
            "state": {"type": "string", "enum": ["finished", "failed", "cancelled"]},
            "artifacts": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["answer", "session_id", "state", "artifacts"],
    },
    # It runs code that may write files and reach what the kernel reaches, and asks a model: not read-only, open world.
    annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=True),
)
SESSIONS = types.Tool(
    name="sessions",
    title="The stored sessions",
    description="The stored sessions, newest first: id, title, rounds, started and last active (epoch seconds).",
    input_schema={"type": "object", "properties": {}, "additionalProperties": False},
    output_schema={
        "type": "object",
        "properties": {
            "sessions": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"},
                        "title": {"type": "string"},
                        "rounds": {"type": "integer"},
                        "started": {"type": "number"},
                        "last_active": {"type": "number"},
                        "owner": {"type": ["string", "null"]},
                    },
                    "required": ["id", "title", "rounds", "started", "last_active"],
                },
            }
        },
        "required": ["sessions"],
    },
    annotations=types.ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False),
)
VARIABLES = types.Tool(
    name="variables",
    title="A session's variables",
    description="The variables a session's kernel holds (name, type, a short description): now, if the session is open here, else as its "
    "last cell left them. It never runs code.",
    input_schema={"type": "object", "properties": {"session_id": {"type": "string"}}, "required": ["session_id"], "additionalProperties": False},
    output_schema={
        "type": "object",
        "properties": {
            "session_id": {"type": "string"},
            "variables": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "type": {"type": "string"}, "description": {"type": "string"}},
                    "required": ["name", "type", "description"],
                },
            },
        },
        "required": ["session_id", "variables"],
    },
    annotations=types.ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False),
)

CLOSE_SESSION = types.Tool(
    name="close_session",
    title="Close a session here",
    description=(
        "Release a session this server holds open: its kernel stops and its claim goes, so the user's terminal (chat --resume) or "
        "another assistant can open it. It stays stored: ask with its session_id later resumes it, re-running its cells."
    ),
    input_schema={"type": "object", "properties": {"session_id": {"type": "string"}}, "required": ["session_id"], "additionalProperties": False},
    output_schema={
        "type": "object",
        "properties": {"session_id": {"type": "string"}, "closed": {"type": "boolean", "description": "false when it was not open here"}},
        "required": ["session_id", "closed"],
    },
    annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False),
)

TOOLS = (ASK, SESSIONS, VARIABLES, CLOSE_SESSION)  # as `tools/list` gives them, on every transport


def closed_result(session_id: str, released: Released) -> types.CallToolResult:
    """`close_session`'s answer: what became of the session, in one line and as structured content."""
    if released == "answering":
        return _error_result(f"Session {session_id} is answering a question: close it once that answer is in (or cancel the ask).")
    if released == "not open":
        text = f"Session {session_id} was not open here: nothing to release. It is stored; ask with its session_id resumes it."
    else:
        text = f"Session {session_id} is closed here and stays stored: chat --resume {session_id} opens it, and ask with its session_id resumes it."
    return _json_result({"session_id": session_id, "closed": released == "closed"}, text=text)


def bad_input(message: str) -> MCPError:
    """A protocol error (invalid params) whose message is one line for the person behind the client."""
    return MCPError(code=types.INVALID_PARAMS, message=message)


@dataclass
class OpenSession:
    """A session open in this server: one turn at a time; `closed` once the server let it go (a turn that got it asks again).

    `users`: the asks that were handed it and have not finished; a session in use is never let go for room or idleness.
    """

    session: Session
    busy: threading.Lock = field(default_factory=threading.Lock)
    last_used: float = field(default_factory=time.monotonic)
    closed: bool = False
    users: int = 0


class Agent:
    """The sessions this server opened, by id, the least recently used first; opening and resuming go through the project's workspace.

    The workspace is opened by the first call that needs it (`LazyWorkspace`), on that call's thread.
    A session holds its kernel and its claim in the store (no other program may open it) while it is
    open here. So it is let go, and stays stored, when it has gone unused for `idle_timeout` seconds
    (mcp.session_idle_timeout; 0: never), when `close_session` asks, and when a session must be
    opened and `max_open` are (the one used least recently that no ask is using); the next `ask` that
    names it resumes it.

    At most `max_open` sessions (mcp.max_open_sessions), and so kernels, are open or opening at
    once, however many asks come together: an ask that needs another while all of them are answering
    waits for one to finish (`on_wait` says so once), and a cancel of its request ends the wait. A
    host that sends several asks at once (a model calling tools in parallel) thus gets every answer,
    in turn, rather than errors to retry, and its own timeout or Stop still ends a wait.
    """

    def __init__(self, project: LazyWorkspace, *, max_open: int | None = None, idle_timeout: float | None = None) -> None:
        """`max_open`, `idle_timeout`: or None for the project's mcp.max_open_sessions and mcp.session_idle_timeout once it is opened."""
        self.project = project
        self._max_open = max_open
        self._idle_timeout = idle_timeout
        self.open: OrderedDict[str, OpenSession] = OrderedDict()
        self._guard = threading.Lock()
        self._slots = threading.Condition(self._guard)  # told when a session is let go or an ask is done with one
        self._opening = 0  # sessions being opened or resumed now, each counted against max_open

    @property
    def max_open(self) -> int:
        """Sessions this server keeps open at most: the argument, else the opened project's mcp.max_open_sessions."""
        if self._max_open is not None:
            return self._max_open
        return self.workspace.config.mcp.max_open_sessions

    @property
    def idle_timeout(self) -> float:
        """Seconds an open session may go unused before it is let go (0: never); 0 until the project is opened, when none is open."""
        if self._idle_timeout is not None:
            return self._idle_timeout
        opened = self.project.opened
        return opened.config.mcp.session_idle_timeout if opened is not None else 0.0

    @property
    def workspace(self) -> Workspace:
        """The project's workspace, opened now if no call has yet (it blocks: call it from a worker thread)."""
        return self.project.get()

    def session(self, ref: str | None, *, on_replay: Callable[[int, int], None] | None = None, on_wait: Callable[[str], None] | None = None) -> OpenSession:
        """The open session `ref` names (resumed from the store if need be), or a new one; UnknownSessionError for an unknown id.

        The caller uses it until `done_with(entry)`, which it must call. Opening one waits while
        `max_open` are open and in use (`on_wait` hears why, once); it is KeyboardInterrupt that ends the wait.
        """
        workspace = self.workspace
        session_id = None
        if ref is not None:
            with self._guard:
                session_id = workspace.store.resolve(ref)
                if session_id in self.open:
                    self.open.move_to_end(session_id)
                    entry = self.open[session_id]
                    entry.last_used = time.monotonic()
                    entry.users += 1
                    return entry
        closing = self._room(on_wait)
        try:
            self._close(closing)
            if session_id is None:
                session = workspace.new_session()
                workspace.store.save_overrides(session.id, self.project.overrides)
            else:
                session, _ = workspace.resume_session(session_id, on_replay=on_replay)
        except BaseException:
            with self._slots:
                self._opening -= 1
                self._slots.notify_all()
            raise
        with self._slots:
            self._opening -= 1
            kept = self.open[session.id] = OpenSession(session, users=1)
        return kept

    def _room(self, on_wait: Callable[[str], None] | None) -> list[OpenSession]:
        """Room for one more session: the sessions let go to make it (to be closed), one opening counted; waits while all are in use."""
        closing: list[OpenSession] = []
        told = False
        try:
            with self._slots:
                while len(self.open) + self._opening >= self.max_open:
                    unused = next((key for key, entry in self.open.items() if entry.users == 0), None)
                    if unused is not None:  # the one used least recently that no ask is using: let go, it stays stored
                        closing.append(self.open.pop(unused))
                        continue
                    if on_wait is not None and not told:
                        on_wait(f"Waiting for a free session: the {self.max_open} this server keeps open (mcp.max_open_sessions) are all answering")
                        told = True
                    self._slots.wait(SLOT_POLL)  # woken when one is done; the poll lets a cancel's KeyboardInterrupt in
                self._opening += 1
        except BaseException:
            self._close(closing)
            raise
        return closing

    def done_with(self, entry: OpenSession) -> None:
        """An ask is done with `entry` (from `session`): once no ask uses it, it may be let go for room or idleness."""
        with self._slots:
            entry.users -= 1
            entry.last_used = time.monotonic()
            self._slots.notify_all()

    def release(self, ref: str) -> tuple[str, Released]:
        """Close the session `ref` names here now (it stays stored): its id, and whether it was closed, not open, or answering."""
        session_id = self.workspace.store.resolve(ref)
        with self._guard:
            entry = self.open.get(session_id)
            if entry is None:
                return session_id, "not open"
            if entry.users or entry.busy.locked():
                return session_id, "answering"
            del self.open[session_id]
            self._slots.notify_all()
        self._close([entry])
        return session_id, "closed"

    def release_idle(self) -> list[str]:
        """Close the sessions no request has used for `idle_timeout` seconds (they stay stored); their ids."""
        if not self.idle_timeout:
            return []
        settled = time.monotonic() - self.idle_timeout
        with self._guard:
            idle = [key for key, entry in self.open.items() if entry.last_used <= settled and not entry.users and not entry.busy.locked()]
            closing = [self.open.pop(key) for key in idle]
            self._slots.notify_all()
        self._close(closing)
        return idle

    def close(self) -> None:
        """Close every open session (each stays stored)."""
        with self._guard:
            entries, self.open = list(self.open.values()), OrderedDict()
        self._close(entries)

    @staticmethod
    def _close(entries: Iterable[OpenSession]) -> None:
        for entry in entries:
            entry.closed = True
            entry.session.close()


async def release_idle_sessions(agent: Agent) -> None:
    """Let go of the sessions left idle past `agent.idle_timeout`, checking a few times within it, until cancelled.

    No session is open before the project is, and its config says the timeout: this starts once a call opened it.
    """
    while agent.project.opened is None:
        await anyio.sleep(OPENED_POLL)
    if not agent.idle_timeout:
        return
    every = min(max(agent.idle_timeout / 4, 0.25), 30.0)
    while True:
        await anyio.sleep(every)
        await anyio.to_thread.run_sync(agent.release_idle)


class Turn:
    """One `ask` on a thread of its own: its progress lines go to the server's loop, Stop raises KeyboardInterrupt in it as Ctrl-C does."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_progress: Callable[[str], None]) -> None:
        self._loop = loop
        self._on_progress = on_progress
        self._thread: threading.Thread | None = None
        self.session: Session | None = None
        self.done: asyncio.Future[Any] = loop.create_future()

    def start(self, work: Callable[[Turn], Any]) -> None:
        """Run `work(self)` on a new thread; `done` gets its result or its error."""
        self._thread = threading.Thread(target=self._run, args=(work,), name="mcp-ask", daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[Turn], Any]) -> None:
        try:
            result: Any = work(self)
        except BaseException as exc:  # noqa: BLE001 - handed to the loop, which raises it where the request waits
            self._loop.call_soon_threadsafe(_settle, self.done, None, exc)
        else:
            self._loop.call_soon_threadsafe(_settle, self.done, result, None)

    def progress(self, text: str) -> None:
        """Say `text` to the client as progress (from the turn's thread)."""
        self._loop.call_soon_threadsafe(self._on_progress, text)

    def listen(self, event: Event) -> None:
        """The session's events as progress lines: who is working on what."""
        from taskweaver_lite.records.events import Working

        if isinstance(event, Working):
            self.progress(ACTIVITY.get(event.activity, event.activity))

    def stop(self) -> None:
        """Cancel the turn like Ctrl-C: KeyboardInterrupt in its thread and the running cell interrupted (the session stays)."""
        thread = self._thread
        if thread is None or not thread.is_alive() or thread.ident is None:
            return
        import ctypes

        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(KeyboardInterrupt))
        if self.session is not None:
            self.session.executor.interrupt()


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


async def on_thread(work: Callable[[Turn], _T], *, report: Callable[[float, str], Awaitable[None]]) -> _T:
    """`work` on a turn thread, its progress reported in order; a cancelled request stops it and waits for it to wind down."""
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str] = asyncio.Queue()
    sender = loop.create_task(send_progress(lines, report))
    turn = Turn(loop, lines.put_nowait)
    turn.start(work)
    try:
        return await asyncio.shield(turn.done)
    except anyio.get_cancelled_exc_class():
        turn.stop()
        with anyio.CancelScope(shield=True), anyio.move_on_after(STOP_WAIT):
            await asyncio.wait([turn.done])
        raise
    finally:
        sender.cancel()


async def send_progress(lines: asyncio.Queue[str], report: Callable[[float, str], Awaitable[None]]) -> None:
    """Send each progress line as a notification, numbered; a client gone meanwhile is no reason to fail the turn."""
    number = 0
    while True:
        text = await lines.get()
        number += 1
        with contextlib.suppress(Exception):  # progress is advisory: the answer still goes out
            await report(number, text)


def answer_of(rnd: Round) -> str:
    """The Planner's answer to the user in `rnd` (the round's error when it failed)."""
    from taskweaver_lite.records.conversation import USER

    if rnd.state == "failed":
        return f"This request failed: {rnd.error or 'no answer'}"
    return next((post.message for post in reversed(rnd.posts) if post.send_to == USER), "")


def ask_result(session: Session, rnd: Round, *, written: Collection[str]) -> types.CallToolResult:
    """`ask`'s answer: the text with the session id, the structured content, links to the turn's plots and the files its cells `written`."""
    answer = answer_of(rnd)
    links = artifact_links(session, rnd, written=written)
    text = f"{answer}\n\n(session {session.id}: pass session_id {session.id!r} to continue it with its variables)"
    structured = {"answer": answer, "session_id": session.id, "state": rnd.state, "artifacts": [str(link.uri) for link in links]}
    content: list[types.ContentBlock] = [types.TextContent(type="text", text=text), *links]
    return types.CallToolResult(content=content, structured_content=structured, is_error=rnd.state == "failed")


def failed_answer(session_id: str | None, message: str, *, state: str = "failed") -> types.CallToolResult:
    """`ask`'s answer when the turn gave none (it failed, was cancelled, or could not start): the reason, in its text and structured content.

    This machine's paths and process ids are left out (`for_client`).
    """
    message = for_client(message)
    structured = {"answer": message, "session_id": session_id or "", "state": state, "artifacts": []}
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], structured_content=structured, is_error=True)


def variables_result(session_id: str, variables: Iterable[Variable]) -> types.CallToolResult:
    """`variables`' answer: one line per variable in its text, the rows in its structured content."""
    rows = [{"name": v.name, "type": v.type, "description": v.description} for v in variables]
    text = "\n".join(f"{r['name']}: {r['type']} {r['description']}".rstrip() for r in rows) or "No variables yet."
    return _json_result({"session_id": session_id, "variables": rows}, text=text)


def question_of(arguments: dict[str, Any]) -> tuple[str, str | None]:
    """`ask`'s arguments checked: the question and the session id, or a protocol error naming what is wrong."""
    question, ref = arguments.get("question"), arguments.get("session_id")
    extra = sorted(set(arguments) - {"question", "session_id"})
    if extra:
        raise bad_input(f"ask takes question and session_id, not {', '.join(extra)}")
    if not isinstance(question, str) or not question.strip():
        raise bad_input("ask needs a question: a non-empty string")
    if len(question) > MAX_QUESTION_CHARS:
        raise bad_input(f"the question has {len(question):,} characters; ask takes at most {MAX_QUESTION_CHARS:,} (put longer text in a file in the project)")
    if ref is not None and (not isinstance(ref, str) or not ref.strip()):
        raise bad_input("session_id must be the id of a session (a string), or left out for a new session")
    return question, ref


class ToolServer(abc.ABC):
    """The MCP handlers every transport shares: the tools, their arguments checked, the errors that say what was wrong.

    Where the sessions live is the subclass's, which implements the six abstract methods: this
    process (`AgentServer`, stdio) or a team's service (`web/mcp_endpoint.py`, `serve`'s `/mcp`),
    which also knows who is asking.
    """

    def lowlevel(self) -> Server[Any]:
        """The SDK server with this agent's handlers."""
        return Server(
            "taskweaver-lite",
            version=__version__,
            instructions="A data-analysis agent with a persistent Python kernel: call ask with a question; pass session_id back to continue.",
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
            on_list_resources=self.list_resources,
            on_read_resource=self.read_resource,
        )

    async def list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        """The tools: ask, sessions, variables, close_session."""
        return types.ListToolsResult(tools=list(TOOLS))

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        """Run one tool call; bad input is a protocol error, a failed turn an error result."""
        arguments = dict(params.arguments or {})
        if params.name == "ask":
            question, ref = question_of(arguments)
            return await self.ask(ctx, question, ref)
        if params.name == "sessions":
            rows = await self.stored_sessions(ctx)
            return _json_result({"sessions": rows}, text="\n".join(f"{r['id']}  {r['rounds']} rounds  {r['title']}" for r in rows) or "No stored sessions.")
        if params.name == "variables":
            ref = arguments.get("session_id")
            if not isinstance(ref, str) or not ref.strip():
                raise bad_input("variables needs session_id: the id of a session")
            return await self.variables(ctx, ref)
        if params.name == "close_session":
            ref = arguments.get("session_id")
            if not isinstance(ref, str) or not ref.strip():
                raise bad_input("close_session needs session_id: the id of a session")
            return await self.close_session(ctx, ref)
        raise bad_input(f"no tool {params.name!r}: the tools are ask, sessions, variables and close_session")

    @abc.abstractmethod
    async def ask(self, ctx: Any, question: str, ref: str | None) -> types.CallToolResult:
        """One turn in the session `ref` names (a new one for None)."""

    @abc.abstractmethod
    async def stored_sessions(self, ctx: Any) -> list[dict[str, Any]]:
        """The caller's stored sessions, newest first, as `sessions --json` rows."""

    @abc.abstractmethod
    async def variables(self, ctx: Any, ref: str) -> types.CallToolResult:
        """The variables the session's kernel holds."""

    @abc.abstractmethod
    async def close_session(self, ctx: Any, ref: str) -> types.CallToolResult:
        """Release the session `ref` names (it stays stored)."""

    @abc.abstractmethod
    async def list_resources(self, ctx: Any, params: Any) -> types.ListResourcesResult:
        """What the caller's sessions' cells produced."""

    @abc.abstractmethod
    async def read_resource(self, ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        """One file a session's cells produced."""


class AgentServer(ToolServer):
    """The tools over an `Agent`: the sessions of this process, for the one client on its standard input."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    async def stored_sessions(self, ctx: Any) -> list[dict[str, Any]]:
        """Every stored session of the project."""
        try:
            entries = await anyio.to_thread.run_sync(lambda: self.agent.workspace.sessions())
        except TaskWeaverError as exc:
            raise _failed(exc) from None
        return [entry.to_dict() for entry in entries]

    async def ask(self, ctx: Any, question: str, ref: str | None) -> types.CallToolResult:
        """One turn on a thread of its own, its progress reported, a cancel interrupting it."""

        def work(turn: Turn) -> types.CallToolResult:
            try:
                self.agent.project.get()
            except TaskWeaverError as exc:  # a mistake in the config, a damaged store: the client hears why, and the next call tries again
                return failed_answer(ref, f"The project could not be opened: {exc}")
            try:
                entry = self._opened(ref, turn)
            except MCPError:
                raise
            except TaskWeaverError as exc:  # open in another program, a kernel that cannot start: the client hears why
                return failed_answer(ref, f"The session could not be opened: {exc}")
            try:
                return self._answer(entry, question, turn)
            finally:
                self.agent.done_with(entry)

        return await on_thread(work, report=lambda number, text: ctx.session.report_progress(number, None, text))

    def _answer(self, entry: OpenSession, question: str, turn: Turn) -> types.CallToolResult:
        """The turn in `entry`'s session, once the ask before it there is answered."""
        if not entry.busy.acquire(timeout=BUSY_WAIT):
            return failed_answer(entry.session.id, f"session {entry.session.id} is answering another question: wait for that answer, then ask again")
        try:
            if entry.closed:  # the server is shutting down (a session in use is never let go otherwise)
                return failed_answer(entry.session.id, f"Session {entry.session.id} was closed as the server shuts down: ask again.")
            turn.session = entry.session
            entry.session.add_listener(turn.listen)
            try:
                return self._turn(entry.session, question)
            finally:
                entry.session.remove_listener(turn.listen)
        finally:
            entry.last_used = time.monotonic()
            entry.busy.release()

    def _opened(self, ref: str | None, turn: Turn) -> OpenSession:
        """The session to ask in; an unknown or ambiguous id is a protocol error (nothing is opened or stored)."""
        try:
            return self.agent.session(ref, on_replay=lambda done, total: turn.progress(f"Re-running earlier cells: {done}/{total}"), on_wait=turn.progress)
        except (UnknownSessionError, AmbiguousSessionError) as exc:
            raise _unknown(ref or "", exc) from None

    def _turn(self, session: Session, question: str) -> types.CallToolResult:
        from taskweaver_lite.mcp.turn_files import TurnFiles

        written = TurnFiles(session.working_dir)
        session.add_listener(written)
        try:
            rnd = session.ask(question)
        except KeyboardInterrupt:
            return failed_answer(session.id, f"Cancelled. Session {session.id} and its variables are kept.", state="cancelled")
        except TaskWeaverError as exc:
            return failed_answer(session.id, f"This request failed: {exc} (session {session.id} is kept)")
        finally:
            session.remove_listener(written)
        return ask_result(session, rnd, written=written.names)

    async def variables(self, ctx: Any, ref: str) -> types.CallToolResult:
        """The variables of the session's kernel."""
        return await self._variables(ctx, ref)

    async def _variables(self, ctx: Any, ref: str) -> types.CallToolResult:
        """An open session's kernel says; a session not open here answers from the store: nothing is resumed, no cell runs."""

        def work(turn: Turn) -> types.CallToolResult:
            try:
                store = self.agent.workspace.store
                session_id = store.resolve(ref)
                entry = self.agent.open.get(session_id)
                if entry is None:
                    return variables_result(session_id, store.load(session_id).last_variables)
            except (UnknownSessionError, AmbiguousSessionError) as exc:
                raise _unknown(ref, exc) from None
            except TaskWeaverError as exc:
                raise _failed(exc) from None
            return variables_result(session_id, entry.session.executor.variables())

        return await on_thread(work, report=lambda number, text: ctx.session.report_progress(number, None, text))

    async def close_session(self, ctx: Any, ref: str) -> types.CallToolResult:
        """Close the session here now; it stays stored."""
        try:
            session_id, released = await anyio.to_thread.run_sync(self.agent.release, ref)
        except (UnknownSessionError, AmbiguousSessionError) as exc:
            raise _unknown(ref, exc) from None
        except TaskWeaverError as exc:
            raise _failed(exc) from None
        return closed_result(session_id, released)

    async def list_resources(self, ctx: Any, params: Any) -> types.ListResourcesResult:
        """What the open sessions' cells produced."""
        sessions = [entry.session for entry in list(self.agent.open.values())]
        return types.ListResourcesResult(resources=list_resources(sessions), ttl_ms=0)

    async def read_resource(self, ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        """One file a session's cells produced, as text or base64 (read on a worker thread: a stored session's needs the store)."""
        sessions = {entry.session.id: entry.session for entry in list(self.agent.open.values())}
        return await anyio.to_thread.run_sync(lambda: read_resource(str(params.uri), sessions, stored=self._stored_folder))

    def _stored_folder(self, session_id: str) -> Path | None:
        """The folder of a stored session that is not open here (its files are still resources), None if there is none."""
        try:
            resolved = self.agent.workspace.store.resolve(session_id)
        except (UnknownSessionError, AmbiguousSessionError):
            return None
        except TaskWeaverError as exc:
            raise _failed(exc) from None
        folder = self.agent.workspace.config.sessions_dir / resolved
        return folder if folder.is_dir() else None


def _unknown(ref: str, error: TaskWeaverError) -> MCPError:
    """A session id that names no session, or several: one line, without the store's path on this machine."""
    if isinstance(error, AmbiguousSessionError):
        return bad_input(str(error))
    return bad_input(f"no session {ref!r} here: call the sessions tool for the ids")


def _failed(error: TaskWeaverError) -> MCPError:
    """A call the project could not answer (it could not be opened, its store failed): one line, without this machine's paths."""
    return MCPError(code=types.INTERNAL_ERROR, message=for_client(" ".join(str(error).splitlines())))


def _json_result(data: dict[str, Any], *, text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=data)


def _error_result(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=for_client(text))], is_error=True)


_PID = re.compile(r"\s*\(pid \d+\)")
_PATH = re.compile(r"(?<![\w:/.])/(?:[^\s'\"():;,/]+/)+([^\s'\"():;,/]+)")


def for_client(text: str) -> str:
    """An error's words for an MCP host: this machine's paths cut to their last part, process ids left out."""
    return _PATH.sub(r"\1", _PID.sub("", text))


def refuse_confirm_mode(config: Config) -> None:
    """Nobody could answer "run, edit or skip?" before a cell runs: a project that asks it is refused rather than run unasked."""
    if config.execution.confirm:
        raise ConfigError(
            "execution.confirm: true asks a person at a terminal before each cell runs, and an MCP server has none: "
            "set it to false for this project, or start with --set execution.confirm=false"
        )


async def serve(project: LazyWorkspace) -> None:
    """Serve MCP on stdin and stdout until the client goes; every session opened is closed (and stays stored).

    `initialize`, `tools/list` and `resources/list` are answered without the project; the first call that needs it opens it.
    """
    agent = Agent(project)
    server = AgentServer(agent).lowlevel()
    try:
        async with bounded_stdio_server() as (read_stream, write_stream), anyio.create_task_group() as group:
            group.start_soon(release_idle_sessions, agent)
            await server.run(read_stream, write_stream, server.create_initialization_options())
            group.cancel_scope.cancel()
    finally:
        await anyio.to_thread.run_sync(agent.close)
