"""MCP over HTTP: `serve` answers MCP's Streamable HTTP transport at `/mcp` with the tools of `taskweaver-lite mcp`.

An MCP host reaches a team's service the way the page does: each request carries the user's
`Authorization: Bearer <token>` (checked by the server's guard before it gets here: no token is
401), and the tools run on the server's `Hub`, so everything the HTTP API promises holds here too:

- a session belongs to the user who made it; another user's id is "not found" (a protocol error,
  as for an id that does not exist), and `sessions` lists the caller's own;
- `serve.max_sessions_per_user` counts the sessions `ask` makes, as `POST /api/sessions` does;
- on replicas, each `ask` takes the session's lease for its turn and frees it after, so the next
  `ask` of the same session may land on any replica, with the kernel's variables.

The transport is stateless: each POST stands alone, no MCP session lives in one replica's memory,
and no routing needs to be sticky. A request that ends before its answer (the host cancelled it,
or hung up) stops the turn like Stop on the page; the session and its variables stay. `variables`
reads what the store holds after the session's last cell (it never runs anything in a kernel), and
the resources are the caller's sessions' files: those of this replica's folders, and the plots any
replica stored (a PostgreSQL store keeps their bytes).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from taskweaver_lite.errors import AmbiguousSessionError, StoreUnavailable, TaskWeaverError, UnknownSessionError
from taskweaver_lite.mcp.resources import (
    MAX_LISTED_PER_SESSION,
    MAX_RESOURCE_BYTES,
    mime_type,
    read_resource,
    resource_contents,
    resource_parts,
    resource_uri,
    session_files,
    too_large,
)
from taskweaver_lite.mcp.server import ACTIVITY, STOP_WAIT, ToolServer, ask_result, bad_input, closed_result, failed_answer, variables_result
from taskweaver_lite.mcp.turn_files import TurnFiles
from taskweaver_lite.records.conversation import Round
from taskweaver_lite.web.api import STORE_DOWN, owner_of_request, public_text, user_of_request
from taskweaver_lite.web.hub import AtLimit, Hub, Stopping
from taskweaver_lite.web.live import Busy, LiveSession, Turn

PATH = "/mcp"
LISTED_SESSIONS = 20  # the caller's newest sessions whose files `resources/list` offers


class TeamServer(ToolServer):
    """The MCP tools over a `serve` process's `Hub`, for whoever the request's token names."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    async def ask(self, ctx: Any, question: str, ref: str | None) -> types.CallToolResult:
        """One turn under the session's lease (on replicas), its events read as progress; a cancel stops it."""
        loop = asyncio.get_running_loop()
        try:
            session_id, turn, written = await asyncio.to_thread(self._start, _request(ctx), question, ref, loop)
        except (UnknownSessionError, AmbiguousSessionError):
            raise _no_such_session(ref or "") from None
        except (AtLimit, Busy, Stopping, TaskWeaverError) as exc:
            return failed_answer(ref, self._said(exc))
        return await self._follow(ctx, session_id, turn, written)

    def _start(self, request: Request, question: str, ref: str | None, loop: asyncio.AbstractEventLoop) -> tuple[str, Turn, list[TurnFiles]]:
        if ref is None:
            session_id = self.hub.new(owner=user_of_request(request))
        else:
            session_id = self._own(request, ref)
            if self.hub.replica is None and self.hub.get(session_id) is None:
                self.hub.resume(session_id, owner=owner_of_request(request))  # one process alone: re-opened here first
        written: list[TurnFiles] = []  # made once the session's copy here is current (a replica may load it)

        def note_files(live: LiveSession) -> TurnFiles:
            written.append(TurnFiles(live.session.working_dir))
            return written[-1]

        return session_id, self.hub.ask(session_id, question, loop=loop, listener=note_files), written

    async def _follow(self, ctx: Any, session_id: str, turn: Turn, written: list[TurnFiles]) -> types.CallToolResult:
        """The turn's events until its end: activity as progress lines; then the answer (or why there is none)."""
        seen = _Seen()
        try:
            async for batch in turn.batches():
                for item in batch:
                    line = seen.take(item)
                    if line is not None:
                        with contextlib.suppress(Exception):  # progress is advisory: the answer still goes out
                            await ctx.session.report_progress(seen.lines, None, line)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True), anyio.move_on_after(STOP_WAIT):
                await asyncio.to_thread(self.hub.stop, session_id)
                async for _ in turn.batches():  # until the round is stored as cancelled
                    pass
            raise
        rnd = self._round(session_id, seen.round)
        live = self.hub.get(session_id)
        if seen.error is None and rnd is not None and live is not None:
            return ask_result(live.session, rnd, written=[name for files in written for name in files.names])
        message = public_text(seen.error or "no answer", self.hub)
        state = "cancelled" if message.startswith("Stopped") else "failed"
        return failed_answer(session_id, message, state=state)

    def _round(self, session_id: str, index: int | None) -> Round | None:
        live = self.hub.get(session_id)
        if live is None or index is None:
            return None
        return next((rnd for rnd in live.session.conversation.rounds if rnd.index == index), None)

    async def stored_sessions(self, ctx: Any) -> list[dict[str, Any]]:
        """The caller's stored sessions (everyone's for an admin), newest first."""
        owner = owner_of_request(_request(ctx))
        try:
            rows = await asyncio.to_thread(self.hub.parts.store.list_sessions, owner=owner)
        except StoreUnavailable:
            raise MCPError(code=types.INTERNAL_ERROR, message=STORE_DOWN) from None
        return [row.to_dict() for row in rows]

    async def variables(self, ctx: Any, ref: str) -> types.CallToolResult:
        """The variables after the session's last cell, as stored: no kernel is asked, no lease taken, nothing runs."""
        request = _request(ctx)

        def stored() -> types.CallToolResult:
            session_id = self._own(request, ref)
            return variables_result(session_id, self.hub.parts.store.load(session_id).last_variables)

        try:
            return await asyncio.to_thread(stored)
        except (UnknownSessionError, AmbiguousSessionError):
            raise _no_such_session(ref) from None
        except StoreUnavailable:
            raise MCPError(code=types.INTERNAL_ERROR, message=STORE_DOWN) from None

    async def close_session(self, ctx: Any, ref: str) -> types.CallToolResult:
        """Let go of the session on this server now (it stays stored); a replica, which holds none between answers, drops its copy."""
        request = _request(ctx)

        def release() -> types.CallToolResult:
            session_id = self._own(request, ref)
            try:
                return closed_result(session_id, "closed" if self.hub.release(session_id) else "not open")
            except Busy:
                return closed_result(session_id, "answering")

        try:
            return await asyncio.to_thread(release)
        except (UnknownSessionError, AmbiguousSessionError):
            raise _no_such_session(ref) from None

    async def list_resources(self, ctx: Any, params: Any) -> types.ListResourcesResult:
        """The files of the caller's newest sessions: those in this replica's folders, and the plots the store keeps."""
        owner = owner_of_request(_request(ctx))
        found = await asyncio.to_thread(self._resources, owner)
        return types.ListResourcesResult(resources=found, ttl_ms=0)

    def _resources(self, owner: str | None) -> list[types.Resource]:
        store = self.hub.parts.store
        found: dict[str, types.Resource] = {}
        for entry in store.list_sessions(owner=owner)[:LISTED_SESSIONS]:
            live = self.hub.get(entry.id)
            files = session_files(live.session) if live is not None else _folder_files(self.hub.config.sessions_dir / entry.id / "artifacts")
            for kind, path in files:
                with contextlib.suppress(OSError):
                    uri = resource_uri(entry.id, kind, path.name)
                    found[uri] = types.Resource(
                        uri=uri, name=path.name, mime_type=mime_type(path.name), size=path.stat().st_size, description=f"session {entry.id}"
                    )
            for name in store.file_names(entry.id, "artifact")[:MAX_LISTED_PER_SESSION] if store.keeps_files else []:
                uri = resource_uri(entry.id, "artifacts", name)
                found.setdefault(uri, types.Resource(uri=uri, name=name, mime_type=mime_type(name), description=f"session {entry.id}"))
        return list(found.values())

    async def read_resource(self, ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        """One file of one of the caller's sessions: from this replica's folders, else (a plot) from the store."""
        uri = str(params.uri)
        request = _request(ctx)
        return await asyncio.to_thread(self._read, request, uri)

    def _read(self, request: Request, uri: str) -> types.ReadResourceResult:
        session_id, kind, name = resource_parts(uri)
        try:
            session_id = self._own(request, session_id)
        except (UnknownSessionError, AmbiguousSessionError):
            raise _missing(uri, f"no session {session_id!r} of yours on this server (call the sessions tool)") from None
        live = self.hub.get(session_id)
        sessions = {session_id: live.session} if live is not None else {}
        folder = self.hub.config.sessions_dir / session_id
        try:
            return read_resource(uri, sessions, stored=lambda _: folder if folder.is_dir() else None)
        except MCPError:
            data = self.hub.parts.store.file(session_id, "artifact", name) if kind == "artifacts" and self.hub.parts.store.keeps_files else None
            if data is None:
                raise
        if len(data) > MAX_RESOURCE_BYTES:
            raise too_large(uri, name, len(data))
        return resource_contents(uri, name, data)

    def _own(self, request: Request, ref: str) -> str:
        """The id of the caller's session `ref` names (any session for an admin, or without users); UnknownSessionError otherwise."""
        return self.hub.parts.store.resolve(ref.strip(), owner=owner_of_request(request))

    def _said(self, exc: Exception) -> str:
        """What the host is told when a turn could not start (never the store's address or a server path)."""
        if isinstance(exc, StoreUnavailable):
            return STORE_DOWN
        return public_text(str(exc), self.hub)


class _Seen:
    """What a turn's events said so far: the round, the error if one came, the progress lines sent."""

    def __init__(self) -> None:
        self.round: int | None = None
        self.error: str | None = None
        self.lines = 0

    def take(self, item: dict[str, Any]) -> str | None:
        """Note one event; the progress line it makes, if any."""
        kind = item["type"]
        if kind == "round_started":
            self.round = item["round"]
        elif kind == "error":
            self.error = str(item["message"])
        elif kind == "status":
            self.lines += 1
            activity = str(item["activity"])
            return ACTIVITY.get(activity, activity)
        return None


def _folder_files(folder: Path) -> list[tuple[str, Path]]:
    """("artifacts", file) for each regular file directly in `folder` (none when it is not there)."""
    try:
        return [("artifacts", path) for path in sorted(folder.iterdir()) if path.is_file() and not path.is_symlink()][:MAX_LISTED_PER_SESSION]
    except OSError:
        return []


def _request(ctx: Any) -> Request:
    """The HTTP request an MCP message came in (its scope holds the user the guard found)."""
    request = ctx.request
    assert isinstance(request, Request), "an MCP message on /mcp always comes with its HTTP request"
    return request


def _no_such_session(ref: str) -> MCPError:
    """Another user's session and one that does not exist are told apart by nothing."""
    return bad_input(f"session {ref!r} was not found: call the sessions tool for the ids of yours")


def _missing(uri: str, why: str) -> MCPError:
    # -32002: the MCP specification's code for a resource that is not found.
    return MCPError(code=-32002, message=f"{uri}: {why}")


class McpEndpoint:
    """`/mcp` on a `serve` app: the SDK's Streamable HTTP transport, stateless, over a `TeamServer`; run it inside the app's lifespan."""

    def __init__(self, hub: Hub) -> None:
        self.server = TeamServer(hub)
        self.manager = StreamableHTTPSessionManager(self.server.lowlevel(), stateless=True)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The transport's task group, for the app's life."""
        async with self.manager.run():
            yield

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("method") != "POST":
            # Stateless: no stream of its own to hold open (a GET would hang there, unbounded), no MCP session to end.
            answer = JSONResponse({"error": "This MCP endpoint takes POST alone: it is stateless, with no stream or session of its own."}, status_code=405)
            answer.headers["Allow"] = "POST"
            await answer(scope, receive, send)
            return
        await self.manager.handle_request(scope, receive, send)
