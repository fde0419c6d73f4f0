"""This agent for editors: an Agent Client Protocol agent (Zed, JetBrains, Neovim, JupyterLab's chat).

`taskweaver-lite acp -p PROJECT` speaks ACP on its standard input and output through the official
Python SDK. The editor starts it and talks to it:

- `initialize`: it declares `loadSession` (stored sessions are resumed), text prompts with links
  to files, and MCP servers run by a command;
- `session/new`: a new stored session, whose id is the ACP session id. Its kernel starts at once,
  in the sandbox as always; the editor's folder (`cwd`) is lent to it read-only and the editor's
  MCP servers join that session's `mcp.servers` (folders.py says when either is left out);
- `session/prompt`: one chat turn (the Planner, the CodeGenerator, the kernel, compression, the
  store), streamed as it happens (updates.py): the answer, the plan, each cell as an `execute`
  tool call with its code and output, a reasoning model's thinking;
- `session/cancel`: Ctrl-C: the running cell is interrupted, the turn ends `cancelled`, the session
  and its variables stay;
- `session/load`: a stored session resumed (its cells re-run to rebuild its variables) and its
  history sent back as updates;
- with `execution.confirm: true`, each cell is first asked for with `session/request_permission`
  (run it once, run every cell of this session, or not): a rejected cell does not run, and the
  CodeGenerator is told the user declined it.

Bad input (an unknown session, an empty or overlong prompt, a folder that is not one) is a JSON-RPC
error of one line, and nothing is stored for it. At most `acp.max_open_sessions` sessions keep
their kernels, opening ones counted: to open another, the one idle longest is closed first (it stays
stored, and is reopened when prompted again); while every one is answering, a session that would
open another is refused in one line naming the setting (an editor waiting on it would show nothing).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import unquote, urlsplit

from acp import PROTOCOL_VERSION, Agent, Client, RequestError, run_agent, update_agent_message_text
from acp.schema import (
    AgentCapabilities,
    AllowedOutcome,
    Implementation,
    InitializeResponse,
    LoadSessionResponse,
    McpCapabilities,
    NewSessionResponse,
    PermissionOption,
    PromptCapabilities,
    PromptResponse,
    StopReason,
    ToolCallUpdate,
)
from acp.stdio import stdio_streams

from taskweaver_lite import __version__
from taskweaver_lite.acp.folders import EditorSettings, FolderError, editor_settings
from taskweaver_lite.acp.turn import Outbox, TurnThread, ask_client
from taskweaver_lite.acp.updates import TurnUpdates, Update, code_content, history_updates
from taskweaver_lite.errors import ConfigError, TaskWeaverError, UnknownSessionError
from taskweaver_lite.safety.bounded_lines import CHUNK_BYTES, MAX_LINE_BYTES, BoundedLines, overlong_error, overlong_message
from taskweaver_lite.session.lazy_workspace import LazyWorkspace

# `initialize` is answered before any of these is imported: the config's, the session's and the kernel's
# modules come with the first session/new or session/load, which opens the project (session/lazy_workspace.py).
if TYPE_CHECKING:
    from taskweaver_lite.config.settings import Config
    from taskweaver_lite.records.conversation import Round
    from taskweaver_lite.safety.confirm import CellChoice
    from taskweaver_lite.session.session import Session
    from taskweaver_lite.session.workspace import Workspace

# The longest prompt taken, its links and embedded files included (larger files: link them, the code reads them).
MAX_PROMPT_CHARS = 20_000
# Seconds a turn gets to stop its cell and store its failed round when the connection goes.
STOP_WAIT = 30.0
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
AT_LIMIT = -32000  # JSON-RPC's range for a server's own errors: every open session is answering
FOLDER_NOTE = "The user's folder {folder} (open in their editor) is readable by the code at that path, read-only."
ALLOW_ONCE, ALLOW_ALWAYS, REJECT = "allow_once", "allow_always", "reject_once"
PERMISSION_OPTIONS = [
    PermissionOption(option_id=ALLOW_ONCE, name="Run this cell", kind="allow_once"),
    PermissionOption(option_id=ALLOW_ALWAYS, name="Run every cell of this session", kind="allow_always"),
    PermissionOption(option_id=REJECT, name="Do not run it", kind="reject_once"),
]
log = logging.getLogger(__name__)
_T = TypeVar("_T")


def bad_input(message: str) -> RequestError:
    """Invalid params, with one line for the person behind the editor."""
    return RequestError(INVALID_PARAMS, one_line(message))


def one_line(text: str) -> str:
    """`text` on one line (a config error names file, line and key over several)."""
    return " ".join(text.split())


class CellPermission:
    """`execution.confirm` in an editor: each cell asked for with session/request_permission, from the turn's thread."""

    def __init__(self, agent: EditorAgent) -> None:
        self._agent = agent
        self.session_id = ""
        self.updates: TurnUpdates | None = None  # the running turn's: the cell's tool call is announced there
        self.run_all = False  # "Run every cell of this session" was chosen

    def __call__(self, code: str) -> CellChoice:
        """Run, or skip (the CodeGenerator hears the user declined); a cancel while asking is KeyboardInterrupt."""
        from taskweaver_lite.safety.confirm import CellChoice

        if self.run_all or self.updates is None:
            return CellChoice.run(code)
        call_id = self.updates.announce(code)
        option = ask_client(self._agent.loop, self._agent.permission(self.session_id, call_id, code))
        if option == ALLOW_ALWAYS:
            self.run_all = True
        return CellChoice.run(code) if option in (ALLOW_ONCE, ALLOW_ALWAYS) else CellChoice.skip(code)


@dataclass
class EditorSession:
    """A session open for the editor: what it was opened with, its running turn, and its permission (with execution.confirm)."""

    session: Session
    cwd: str
    servers: list[Any]
    permission: CellPermission | None = None
    turn: TurnThread[Round] | None = None


class EditorAgent:
    """The ACP agent: the sessions it opened, by id (the one idle longest first), over one project.

    The project's config is read and its workspace opened by the first `session/new` or
    `session/load` (`LazyWorkspace`, on a worker thread), not before `initialize` is answered; an
    opening that fails answers that request with the reason, and the next one tries again.
    """

    def __init__(self, project: LazyWorkspace) -> None:
        """`project`: with the command's --set values, stored with each new session so that `chat --resume` applies them again."""
        self.project = project
        self.overrides = list(project.overrides)
        self.open: OrderedDict[str, EditorSession] = OrderedDict()
        self._opening = 0  # sessions being opened or resumed now, each counted against acp.max_open_sessions
        self.closed: dict[str, tuple[str, list[Any]]] = {}  # sessions closed for room: their folder and servers, to reopen them
        self._client: Client | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outbox: Outbox[tuple[str, Update]] | None = None

    def on_connect(self, conn: Client) -> None:
        """The client's side of the connection: updates and permission requests go to it."""
        self._client = conn
        self._loop = asyncio.get_running_loop()
        self._outbox = Outbox(self._loop, lambda item: conn.session_update(session_id=item[0], update=item[1]))

    async def initialize(self, protocol_version: int, client_capabilities: Any = None, client_info: Any = None, **_: Any) -> InitializeResponse:
        """What this agent does: load sessions, text prompts with file links, MCP servers run by a command."""
        capabilities = AgentCapabilities(
            load_session=True,
            prompt_capabilities=PromptCapabilities(image=False, audio=False, embedded_context=False),
            mcp_capabilities=McpCapabilities(http=False, sse=False),
        )
        info = Implementation(name="taskweaver-lite", title="TaskWeaver Lite", version=__version__)
        return InitializeResponse(protocol_version=min(protocol_version, PROTOCOL_VERSION), agent_capabilities=capabilities, agent_info=info)

    @property
    def workspace(self) -> Workspace:
        """The project's workspace, once `_opened()` opened it."""
        opened = self.project.opened
        assert opened is not None, "a request that needs the project awaits _opened() first"
        return opened

    async def _opened(self) -> Workspace:
        """The project's workspace, opened now (on a thread) if no request has yet; an error of one line if it cannot be."""
        return await self._blocking(self.project.get, failure="The project could not be opened")

    async def authenticate(self, method_id: str, **_: Any) -> None:
        """Nothing to sign in to: the model's key is the project's."""
        return None

    async def new_session(self, cwd: str, mcp_servers: list[Any] | None = None, **_: Any) -> NewSessionResponse:
        """A new stored session for the editor's folder, its kernel starting."""
        servers = list(mcp_servers or [])
        await self._opened()
        config, settings = self._config(cwd, servers)

        def opened() -> EditorSession:
            permission = CellPermission(self) if config.execution.confirm else None
            session = self.workspace.reconfigured(config).new_session(confirm=permission)
            self.workspace.store.save_overrides(session.id, self.overrides)
            if settings.lent is not None:
                session.note(FOLDER_NOTE.format(folder=settings.lent))
            return EditorSession(session, cwd, servers, permission=permission)

        entry = await self._opening_one(opened, failure="The session could not be opened")
        return NewSessionResponse(session_id=entry.session.id)

    async def load_session(self, cwd: str, session_id: str, mcp_servers: list[Any] | None = None, **_: Any) -> LoadSessionResponse:
        """A stored session resumed (unless open here already), its history sent back as updates before the answer."""
        await self._opened()
        entry = self.open.get(session_id) or await self._resume(session_id, cwd, list(mcp_servers or []))
        for update in history_updates(entry.session.conversation.rounds):
            self._send(session_id, update)
        await self._flush()
        return LoadSessionResponse()

    async def prompt(self, prompt: list[Any], session_id: str, **_: Any) -> PromptResponse:
        """One chat turn, streamed; ends `end_turn`, or `cancelled` after a cancel (the session stays)."""
        text = prompt_text(prompt)
        entry = await self._entry(session_id)
        if entry.turn is not None:
            raise bad_input(f"session {session_id} is answering another prompt: cancel it or wait for its answer")
        session, permission = entry.session, entry.permission
        updates = TurnUpdates(lambda update: self._send(session_id, update), show_reasoning=session.config.llm.show_reasoning)
        session.add_listener(updates.listen)
        if permission is not None:
            permission.session_id, permission.updates = session_id, updates
        turn = entry.turn = TurnThread(self.loop, lambda: session.ask(text), executor=session.executor).start()
        stop: StopReason = "end_turn"
        try:
            rnd = await asyncio.shield(turn.result)
            if rnd.state == "failed":
                self._send(session_id, update_agent_message_text(f"This request failed: {rnd.error or 'no answer'}"))
        except KeyboardInterrupt:
            stop = "cancelled"
        except TaskWeaverError as exc:  # the model or the kernel failed: the round is stored failed, the session goes on
            self._send(session_id, update_agent_message_text(f"This request failed: {exc} (the session is kept)"))
        except asyncio.CancelledError:  # the connection is going: the turn stops as on a cancel
            turn.cancel()
            await asyncio.wait([turn.result], timeout=STOP_WAIT)
            raise
        finally:
            session.remove_listener(updates.listen)
            entry.turn = None
            if permission is not None:
                permission.updates = None
        await self._flush()
        return PromptResponse(stop_reason=stop)

    async def cancel(self, session_id: str, **_: Any) -> None:
        """Stop the session's running turn as Ctrl-C does (nothing when none runs)."""
        entry = self.open.get(session_id)
        if entry is not None and entry.turn is not None:
            entry.turn.cancel()

    async def permission(self, session_id: str, call_id: str, code: str) -> str:
        """The option the person chose for one cell; a cancelled request is the turn's cancel (KeyboardInterrupt)."""
        await self._flush()  # the cell's tool call reaches the editor before the question about it
        assert self._client is not None
        asked = ToolCallUpdate(tool_call_id=call_id, kind="execute", status="pending", content=[code_content(code)], raw_input={"code": code})
        try:
            response = await self._client.request_permission(session_id=session_id, tool_call=asked, options=PERMISSION_OPTIONS)
        except RequestError as exc:  # the editor could not ask: the cell is not run
            log.warning("The editor could not ask about a cell (%s): it is not run", exc)
            return REJECT
        if not isinstance(response.outcome, AllowedOutcome):
            raise KeyboardInterrupt  # the prompt was cancelled while the person was being asked
        return response.outcome.option_id

    def _config(self, cwd: str, servers: list[Any], *, remembered: Sequence[str] = ()) -> tuple[Config, EditorSettings]:
        """The project's config with this command's --set values, a resumed session's, and the editor's folder and servers."""
        from taskweaver_lite.config.file import load_config

        project = self.workspace.config.project_dir
        try:
            base = load_config(project, [*remembered, *self.overrides]) if remembered else self.workspace.config
            settings = editor_settings(base, cwd=cwd, servers=servers)
            config = load_config(project, [*remembered, *self.overrides, *settings.overrides]) if settings.overrides else base
        except FolderError as exc:
            raise bad_input(str(exc)) from None
        except ConfigError as exc:
            raise bad_input(f"The editor's settings do not fit the project's config: {exc}") from None
        for notice in settings.notices:
            print(notice, file=sys.stderr)
        return config, settings

    async def _resume(self, session_id: str, cwd: str, servers: list[Any]) -> EditorSession:
        """A stored session opened here with its variables rebuilt; bad input when there is no such session."""
        try:
            found = self.workspace.store.resolve(session_id)
        except UnknownSessionError:
            found = None
        if found != session_id:  # an ACP session id is a whole id, never 'last' or a prefix
            raise bad_input(f"no session {session_id!r} in this project (session/new starts one)")
        config, _ = self._config(cwd, servers, remembered=self.workspace.remembered_overrides(session_id))

        def resumed() -> EditorSession:
            permission = CellPermission(self) if config.execution.confirm else None
            session, _ = self.workspace.reconfigured(config).resume_session(session_id, confirm=permission)
            return EditorSession(session, cwd, servers, permission=permission)

        entry = await self._opening_one(resumed, failure=f"Session {session_id} could not be resumed")
        self.closed.pop(session_id, None)
        return entry

    async def _entry(self, session_id: str) -> EditorSession:
        """The open session `session_id` names; one closed for room is reopened; bad input for others."""
        entry = self.open.get(session_id)
        if entry is not None:
            self.open.move_to_end(session_id)
            return entry
        if session_id in self.closed:
            cwd, servers = self.closed[session_id]
            return await self._resume(session_id, cwd, servers)
        raise bad_input(f"no open session {session_id!r}: start one with session/new, or resume a stored one with session/load")

    async def _opening_one(self, open_it: Callable[[], EditorSession], *, failure: str) -> EditorSession:
        """A session opened by `open_it` (on a thread) once there is room for it, and kept open."""
        await self._room()
        try:
            entry = await self._blocking(open_it, failure=failure)
        finally:
            self._opening -= 1
        self.open[entry.session.id] = entry
        return entry

    async def _room(self) -> None:
        """Room for one more open session, counted as opening: the idle longest closed first (they stay stored); refused while all answer."""
        limit = self.workspace.config.acp.max_open_sessions
        while len(self.open) + self._opening >= limit:
            idle = next((key for key, kept in self.open.items() if kept.turn is None), None)
            if idle is None:
                raise RequestError(
                    AT_LIMIT,
                    f"the {limit} sessions this agent keeps open (acp.max_open_sessions) are all answering: "
                    "wait for one to finish or stop one, then open this thread again",
                )
            closing = self.open.pop(idle)
            self.closed[idle] = (closing.cwd, closing.servers)
            await asyncio.to_thread(closing.session.close)
        self._opening += 1

    async def _blocking(self, work: Callable[[], _T], *, failure: str) -> _T:
        """`work` (opening, resuming: the store, a kernel, cells re-run) on a thread; its failure is an error of one line."""

        from taskweaver_lite.kernel.executor import close_thread_loop

        def run() -> _T:
            try:
                return work()
            finally:
                close_thread_loop()  # the kernel client's loop of this thread

        try:
            return await asyncio.to_thread(run)
        except TaskWeaverError as exc:  # open in another program, a kernel that cannot start
            raise RequestError(INTERNAL_ERROR, one_line(f"{failure}: {exc}")) from None

    def _send(self, session_id: str, update: Update) -> None:
        if self._outbox is not None:
            self._outbox.put((session_id, update))

    async def _flush(self) -> None:
        if self._outbox is not None:
            await self._outbox.flush()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The protocol's event loop (known once the client connected)."""
        assert self._loop is not None, "on_connect comes first"
        return self._loop

    def close(self) -> None:
        """Close every open session (each stays stored)."""
        entries, self.open = list(self.open.values()), OrderedDict()
        for entry in entries:
            if entry.turn is not None:
                entry.turn.cancel()
            entry.session.close()


def prompt_text(blocks: Sequence[Any]) -> str:
    """The request a prompt's content makes: its text, each linked file named by its path; bad input otherwise."""
    parts: list[str] = []
    for block in blocks:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource_link":
            parts.append(f"(the file {file_path(block.uri)})")
        elif kind == "resource" and hasattr(block.resource, "text"):
            parts.append(f"The file {file_path(block.resource.uri)}:\n{block.resource.text}")
        else:
            raise bad_input(f"a prompt takes text and links to files, not {kind or 'this'} content")
    text = "\n\n".join(part for part in parts if part.strip()).strip()
    if not text.strip():
        raise bad_input("the prompt is empty: write a request")
    if len(text) > MAX_PROMPT_CHARS:
        raise bad_input(f"the prompt has {len(text):,} characters; at most {MAX_PROMPT_CHARS:,} are taken (link large files rather than pasting them)")
    return text


def file_path(uri: str) -> str:
    """A file:// address as the path the kernel reads; other addresses as they are."""
    parts = urlsplit(uri)
    return unquote(parts.path) if parts.scheme == "file" else uri


class BoundedStreamReader(asyncio.StreamReader):
    """The editor's lines as the SDK reads them (`readuntil`), each at most MAX_LINE_BYTES (safety/bounded_lines.py).

    The SDK would gather a line of any length in memory; this one is read from `wire` in chunks and
    a line past the limit is dropped as it streams, answered on `writer` with one JSON-RPC error (id null).
    """

    def __init__(self, wire: asyncio.StreamReader, writer: asyncio.StreamWriter, *, limit: int = MAX_LINE_BYTES) -> None:
        super().__init__()
        self._writer = writer
        self._lines = BoundedLines(lambda: wire.read(CHUNK_BYTES), on_overlong=self._overlong, limit=limit)

    async def readuntil(self, separator: Any = b"\n") -> bytes:
        """The next line (`separator` is the SDK's newline); IncompleteReadError with the rest at the end, as a StreamReader's."""
        line = await self._lines.next_line()
        if not line.endswith(b"\n"):
            raise asyncio.IncompleteReadError(line, None)
        return line

    async def _overlong(self) -> None:
        print(f"taskweaver-lite: {overlong_message(self._lines.limit)}", file=sys.stderr, flush=True)
        self._writer.write(overlong_error(self._lines.limit))  # one write: whole, between the SDK's own messages
        await self._writer.drain()


async def serve(project: LazyWorkspace) -> None:
    """Speak ACP on stdin and stdout until the editor closes them; every session opened is closed (and stays stored).

    Only the protocol reaches standard output: whatever else this process (a role, a library)
    prints goes to standard error, which editors keep as the agent's log.
    """
    protocol = os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = os.fdopen(protocol, "w")
    try:
        reader, writer = await stdio_streams()
    except ValueError:  # asyncio takes pipes, sockets and terminals only
        raise ConfigError(
            "taskweaver-lite acp talks to an editor over pipes: let the editor start it (see the 'In your editor' page), "
            "rather than running it with its input or output in a file"
        ) from None
    finally:
        sys.stdout = sys.stderr
    agent = EditorAgent(project)
    try:
        # The SDK's Agent protocol lists every method; those left out here are answered 'method not found' by its router.
        await run_agent(cast(Agent, agent), writer, BoundedStreamReader(reader, writer))
    finally:
        await asyncio.to_thread(agent.close)
