"""The session routes of the HTTP API: each one names a session, checks it is the caller's, and goes through the `Hub`.

    GET  /api/sessions                          stored sessions (the caller's), as `sessions --json`
    POST /api/sessions                          a new session -> {"id"} (429 past serve.max_sessions_per_user)
    POST /api/sessions/{id}/resume              make a stored one ready (one process: re-open it; 409 when open elsewhere)
    GET  /api/sessions/{id}                     its rounds as stored, and the id of its newest event, for a page (re)loading it
    POST /api/sessions/{id}/messages {"text"}   -> text/event-stream, ending with answer or error
    GET  /api/sessions/{id}/events              -> text/event-stream of its stored events, each with `id:`; Last-Event-ID resumes
    POST /api/sessions/{id}/stop                cancel the running request, like Ctrl-C (on whichever replica runs it)
    POST /api/sessions/{id}/files               multipart `file` -> like /load
    GET  /api/sessions/{id}/artifacts/{name}    a file the session produced (only from its folders, or the store)
    GET  /api/sessions/{id}/context             each role's last prompt, in tokens by part, against its budget; prompt tokens cached and not;
                                                how they are counted (`counted_with`)
    GET  /api/sessions/{id}/export?format=ipynb|md
    POST /api/sessions/{id}/experience          distil the session into tips (like /save) -> {"saved": [...]}
    GET  /api/sessions/{id}/experience          every tip, and the handcrafted files that could not be read
    DELETE /api/sessions/{id}/experience/{tip}  delete a stored tip (like /experience delete)

A session another user owns is, for the caller, not there: 404 on every route, absent from the list.
While the store is unreachable a route answers 503 with one line (no traceback anywhere). No answer
names a path on the server (`public_text`) or the store's address: a client learns nothing of where
things live. An event stream ends once the token or sign-in it was opened with stops working (checked
every third of `serve.lease_timeout`), and a user holds at most `serve.max_streams_per_user` of them here.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import mimetypes
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from taskweaver_lite.errors import GatewayError, KernelLimitReached, StoreError, StoreUnavailable, TaskWeaverError, UnknownSessionError
from taskweaver_lite.llm.client import usage_by_purpose
from taskweaver_lite.llm.counting import ModelTokenizer
from taskweaver_lite.records.event_json import round_json
from taskweaver_lite.records.model_calls import Usage
from taskweaver_lite.safety.workfiles import open_below
from taskweaver_lite.session.export import write_export
from taskweaver_lite.store.interface import StoredEvent
from taskweaver_lite.web.audit_trail import AdminVisits, admin_visit, record
from taskweaver_lite.web.fanout import POLL
from taskweaver_lite.web.hub import AtLimit, Hub, NotOpen, Stopping
from taskweaver_lite.web.live import Busy, LiveSession

Handler = Callable[[Request], Awaitable[Response]]
SessionHandler = Callable[[Request, Hub, str], Awaitable[Response]]
ARTIFACT_CHUNK = 1 << 20
STREAM_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
RECONNECT_MS = 1000  # what an EventSource waits before reconnecting (to any replica)
MAX_NAME_BYTES = 255  # the longest file name most file systems hold (NAME_MAX)
_log = logging.getLogger(__name__)


def api_routes(hub: Hub) -> list[Route]:
    """Every /api route over `hub`."""
    visits = AdminVisits()
    return [
        Route("/api/sessions", _sessions(hub), methods=["GET", "POST"]),
        Route("/api/sessions/{id}", _session(hub, _history, visits=visits)),
        Route("/api/sessions/{id}", _session(hub, _delete), methods=["DELETE"]),
        Route("/api/sessions/{id}/resume", _session(hub, _resume), methods=["POST"]),
        Route("/api/sessions/{id}/messages", _session(hub, _messages, visits=visits), methods=["POST"]),
        Route("/api/sessions/{id}/events", _session(hub, functools.partial(_events, streams=OpenStreams(hub.config.serve.max_streams_per_user)))),
        Route("/api/sessions/{id}/stop", _session(hub, _stop), methods=["POST"]),
        Route("/api/sessions/{id}/files", _session(hub, _files), methods=["POST"]),
        Route("/api/sessions/{id}/artifacts/{name}", _session(hub, _artifact)),
        Route("/api/sessions/{id}/context", _session(hub, _context)),
        Route("/api/sessions/{id}/export", _session(hub, _export, visits=visits)),
        Route("/api/sessions/{id}/experience", _session(hub, _experience), methods=["GET", "POST"]),
        Route("/api/sessions/{id}/experience/{tip}", _session(hub, _delete_tip), methods=["DELETE"]),
    ]


def owner_of_request(request: Request) -> str | None:
    """Whose sessions the caller sees: their user id; None for everyone's (an admin, or a server without users)."""
    user = request.scope.get("state", {}).get("user")
    if user is None or getattr(user, "admin", False):
        return None
    return str(user.id)


def user_of_request(request: Request) -> str | None:
    """The caller's user id (None without users): the owner of the sessions they make (an id: a name may be given again to someone else)."""
    user = request.scope.get("state", {}).get("user")
    return None if user is None else str(user.id)


def error(status: int, message: str) -> JSONResponse:
    """A JSON error answer: {"error": message}."""
    return JSONResponse({"error": message}, status_code=status)


def answer_failure(exc: Exception, *, hub: Hub | None = None) -> JSONResponse:
    """The HTTP answer to an error a route met: 404, 409, 429, 503 or 400, with its one line (with `hub`: no server path in it)."""
    said = str(exc) if hub is None else public_text(str(exc), hub)
    if isinstance(exc, UnknownSessionError):
        return error(404, NO_SUCH_SESSION)  # not the store's message: it names the store (its host, role and database, or its file)
    if isinstance(exc, NotOpen):
        return error(404, said)
    if isinstance(exc, Busy):
        return error(409, said)
    if isinstance(exc, Stopping):
        return error(503, said)
    if isinstance(exc, AtLimit):
        return error(429, said)
    if isinstance(exc, StoreUnavailable):
        return error(503, STORE_DOWN)
    if isinstance(exc, KernelLimitReached):  # the gateway's own words: the user, the count and gateway.max_kernels_per_user
        return error(429, said)
    if isinstance(exc, GatewayError):  # the service's own part is down or refused the replica: not the request's fault
        return error(503, GATEWAY_DOWN)
    return error(400, said)


STORE_DOWN = "The session store is unreachable, so nothing was done; try again shortly."
GATEWAY_DOWN = "The kernel gateway cannot run the session's kernel now, so nothing was done; try again shortly."


def store_down(exc: StoreError) -> str:
    """The one line the log gets while the store cannot be reached (a client gets STORE_DOWN: the store's own words name its host)."""
    return f"{STORE_DOWN[:-1]} ({' '.join(str(exc).split())})."


def _sessions(hub: Hub) -> Handler:
    async def sessions(request: Request) -> Response:
        try:
            if request.method == "POST":
                made = await asyncio.to_thread(hub.new, owner=user_of_request(request))
                return JSONResponse({"id": made})
            rows = await asyncio.to_thread(hub.parts.store.list_sessions, owner=owner_of_request(request))
        except (AtLimit, Stopping, TaskWeaverError) as exc:
            return _failed(hub, exc)
        return JSONResponse([row.to_dict() for row in rows])

    return sessions


def _session(hub: Hub, handler: SessionHandler, *, visits: AdminVisits | None = None) -> Handler:
    """A route about one session: 404 unless it is stored and the caller's; errors answered as `answer_failure` says.

    With `visits`, an admin using it on another user's session is written to the audit trail (once an hour per session).
    """

    async def route(request: Request) -> Response:
        session_id = request.path_params["id"]
        owner = owner_of_request(request)
        try:
            if (owner is not None or hub.replica is not None) and not _held_for(hub, session_id, owner):
                await asyncio.to_thread(_check_owner, hub, session_id, owner)
            if visits is not None and owner is None and request.scope.get("state", {}).get("user") is not None:
                await asyncio.to_thread(admin_visit, hub.parts.store, request, session_id, visits)
            return await handler(request, hub, session_id)
        except (AtLimit, Busy, NotOpen, Stopping, TaskWeaverError) as exc:
            return _failed(hub, exc)

    return route


def _failed(hub: Hub, exc: Exception) -> JSONResponse:
    if isinstance(exc, StoreUnavailable):
        hub.parts.metrics.store_unavailable.inc()
        _log.warning("%s", store_down(exc))  # one line, no traceback
    elif isinstance(exc, KernelLimitReached):
        _log.warning("the kernel gateway refused a kernel: %s", exc)
    elif isinstance(exc, GatewayError):
        _log.warning("%s", " ".join(str(exc).split()))  # the operator's line names the gateway; the client's does not
    return answer_failure(exc, hub=hub)


def public_text(text: str, hub: Hub) -> str:
    """`text` with every path under the server's folders (the project, the sessions, the temporary folder) cut to its last part."""
    roots = {str(hub.config.project_dir.resolve()), str(hub.config.project_dir), str(hub.config.sessions_dir), tempfile.gettempdir(), str(Path.home())}
    pattern = "|".join(re.escape(root.rstrip("/")) for root in sorted(roots, key=len, reverse=True) if root.strip("/"))
    return re.sub(rf"(?:{pattern})(?=/|\b)[^\s'\"`,;()]*", lambda m: m.group(0).rstrip("/").rsplit("/", 1)[-1] or "…", text)


def _held_for(hub: Hub, session_id: str, owner: str | None) -> bool:
    """Whether this server holds the session for `owner` (any owner when None): nothing to ask the store, on the loop.

    A session's owner never changes, and one deleted on another replica is found gone as its next
    request takes it up.
    """
    live = hub.get(session_id)
    return live is not None and (owner is None or live.session.owner == owner)


def _check_owner(hub: Hub, session_id: str, owner: str | None) -> None:
    """UnknownSessionError unless the session is stored and (when `owner` is given) theirs (the store asked unless `_held_for`)."""
    if _held_for(hub, session_id, owner):
        return
    store = hub.parts.store
    try:
        found = store.resolve(session_id, owner=owner)
    except UnknownSessionError:
        hub.forget_if_deleted(session_id)
        raise
    if found != session_id:
        raise UnknownSessionError(session_id, store=store.where)


NO_SUCH_SESSION = "No such session: GET /api/sessions lists yours."


async def _delete(request: Request, hub: Hub, session_id: str) -> Response:
    await asyncio.to_thread(_check_owner, hub, session_id, owner_of_request(request))  # the exact id, never a start of one
    owner = await asyncio.to_thread(hub.parts.store.owner_of, session_id)
    await asyncio.to_thread(hub.delete, session_id, owner=owner_of_request(request))
    names = {user.id: user.name for user in await asyncio.to_thread(hub.parts.store.users)} if owner is not None else {}
    await asyncio.to_thread(record, hub.parts.store, request, "session-deleted", session_id, f"owner {names.get(owner, owner)}" if owner else "")
    return JSONResponse({"deleted": session_id})


async def _resume(_: Request, hub: Hub, session_id: str) -> Response:
    resumed = await asyncio.to_thread(hub.resume, session_id)
    return JSONResponse({"id": resumed})


async def _history(_: Request, hub: Hub, session_id: str) -> Response:
    live = hub.get(session_id) if hub.replica is None else None
    if live is not None:
        rounds, loads, busy = live.session.conversation.rounds, live.session.loads, live.busy
    else:
        stored = await asyncio.to_thread(hub.parts.store.load, session_id)
        rounds, loads = stored.rounds, list(stored.loads)
        busy = hub.replica is not None and await asyncio.to_thread(hub.parts.store.lease, session_id) is not None
    last_event = await asyncio.to_thread(hub.parts.store.last_event_id, session_id)
    shown = [round_json(r, session_id=session_id) for r in rounds]
    # The folders the artifacts route serves from, as the end of a path (never where they are on this machine):
    # the page links a path an answer names that passes through one of them.
    return JSONResponse(
        {
            "id": session_id,
            "rounds": shown,
            "loads": [{"name": load.name, "after_round": load.after_round} for load in loads],
            "busy": busy,
            "last_event": last_event,
            "suggested_requests": hub.config.session.suggested_requests,
            "folders": [f"{session_id}/cwd", f"{session_id}/artifacts", session_id],
        }
    )


async def _messages(request: Request, hub: Hub, session_id: str) -> Response:
    body = await _json(request)
    text = body.get("text") if isinstance(body, dict) else None
    if not isinstance(text, str) or not text.strip():
        return error(400, 'Send {"text": "..."} with the request.')
    loop = asyncio.get_running_loop()
    # A replica takes the session's lease, and perhaps loads the session, first: off the loop, unless it is handed the lease here.
    turn = hub.ask(session_id, text, loop=loop) if hub.replica is None else hub.ask_at_once(session_id, text, loop=loop)
    if turn is None:
        turn = await asyncio.to_thread(hub.ask, session_id, text, loop=loop)

    async def stream() -> AsyncIterator[str]:
        if turn.since is not None:  # where a client that loses this stream picks up the session's stored events (GET .../events)
            yield f"id: {turn.since}\n\n"
        async for batch in turn.batches():  # one write for what arrived together
            shown = [{**item, "message": public_text(item["message"], hub)} if item["type"] == "error" else item for item in batch]
            yield "".join(f"data: {json.dumps(item, ensure_ascii=False)}\n\n" for item in shown)

    return StreamingResponse(stream(), media_type="text/event-stream", headers=STREAM_HEADERS)


async def _events(request: Request, hub: Hub, session_id: str, *, streams: OpenStreams) -> Response:
    """The session's stored events from after Last-Event-ID (or ?after=), then each as it is stored, until the client leaves."""
    offered = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
    try:
        after = int(offered)
    except ValueError:
        return error(400, "Last-Event-ID (or ?after=) is the id of the last event received, a whole number.")
    holder = user_of_request(request) or ""
    if not streams.take(holder):
        return error(
            429, f"You have {streams.limit} event streams open on this server, the most serve.max_streams_per_user allows: close a tab, or wait for one to end."
        )
    stream = _event_stream(hub, session_id, after, still_allowed=_still_allowed(request))
    return _HeldStream(stream, release=functools.partial(streams.give_back, holder))


class OpenStreams:
    """The event streams each user holds open on this server, at most `limit` each."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, holder: str) -> bool:
        """One more stream for `holder`; False when they already hold `limit`."""
        with self._lock:
            if self._open.get(holder, 0) >= self.limit:
                return False
            self._open[holder] = self._open.get(holder, 0) + 1
            return True

    def give_back(self, holder: str) -> None:
        """A stream of `holder`'s has ended."""
        with self._lock:
            left = self._open.get(holder, 0) - 1
            if left > 0:
                self._open[holder] = left
            else:
                self._open.pop(holder, None)


class _HeldStream(StreamingResponse):
    """An event stream that gives its place back however it ends (the client leaving, the server stopping)."""

    def __init__(self, stream: AsyncIterator[str], *, release: Callable[[], None]) -> None:
        super().__init__(stream, media_type="text/event-stream", headers=STREAM_HEADERS)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


Check = Callable[[], Awaitable[bool]]


def _still_allowed(request: Request) -> Check:
    """Whether the request's token or sign-in still holds (the guard puts the question in its scope; always yes without one)."""
    asked: Check | None = request.scope.get("state", {}).get("still_allowed")

    async def yes() -> bool:
        return True

    return asked or yes


async def _event_stream(hub: Hub, session_id: str, after: int, *, still_allowed: Check) -> AsyncIterator[str]:
    yield f"retry: {RECONNECT_MS}\n\n"
    every = hub.config.serve.lease_timeout / 3  # a revoked token's streams end within the lease renewal period, on every replica
    next_check = time.monotonic() + every
    following = hub.parts.fanout.following(session_id)  # this replica hears the session's writes while the stream lasts
    try:
        while not hub.stopping:  # a replica that stops ends its streams: the clients reconnect to another, missing nothing
            if time.monotonic() >= next_check:
                if not await still_allowed():
                    yield ": the token or sign-in this stream was opened with no longer works\n\n"
                    return
                next_check = time.monotonic() + every
            if not following.on:  # before the store is read: whatever is written after that read wakes the stream
                await asyncio.to_thread(following.start)
            with hub.parts.fanout.waiter(session_id) as signal:
                try:
                    entries: list[StoredEvent] = await asyncio.to_thread(hub.parts.store.events_after, session_id, after)
                except StoreError:
                    yield ": the session store is unreachable; waiting for it\n\n"
                    await asyncio.sleep(1.0)
                    continue
                if entries:
                    after = entries[-1].id
                    yield "".join(f"id: {entry.id}\ndata: {json.dumps(entry.data, ensure_ascii=False)}\n\n" for entry in entries)
                    continue
                try:
                    await asyncio.wait_for(signal.wait(), min(POLL, max(next_check - time.monotonic(), 0.01)))
                except asyncio.TimeoutError:
                    yield ": keep-alive\n\n"
    finally:
        following.end()


async def _stop(_: Request, hub: Hub, session_id: str) -> Response:
    return JSONResponse({"stopped": await asyncio.to_thread(hub.stop, session_id)})


async def _files(request: Request, hub: Hub, session_id: str) -> Response:
    limit = hub.config.session.max_upload_bytes
    declared = int(request.headers.get("content-length") or 0)
    if declared > limit + 64 * 1024:  # the multipart envelope on top of the file
        return error(413, f"The file is larger than session.max_upload_bytes ({limit:,} bytes).")
    async with request.form(max_files=1, max_fields=4) as form:
        received = form.get("file")
        if not isinstance(received, UploadFile) or not received.filename:
            return error(400, "Send the file as multipart form data in the field `file`.")
        name = Path(received.filename.replace("\\", "/")).name
        if not name or name.startswith(".") or len(name.encode()) > MAX_NAME_BYTES or not name.isprintable():
            return error(400, f"{received.filename[:80]!r} is not a usable file name: printable, not starting with '.', at most {MAX_NAME_BYTES} bytes.")
        folder = Path(tempfile.mkdtemp(dir=_uploads_root(hub, session_id)))
        try:
            target = folder / name
            with target.open("wb") as out:
                await asyncio.to_thread(shutil.copyfileobj, received.file, out)
            if target.stat().st_size > limit:
                return error(413, f"The file is larger than session.max_upload_bytes ({limit:,} bytes).")
            loaded = await asyncio.to_thread(_load_file, hub, session_id, target)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return JSONResponse({"name": loaded, "text": f"Loaded {loaded} into the working folder."})


def _uploads_root(hub: Hub, session_id: str) -> Path:
    folder = hub.config.sessions_dir / session_id / "uploads"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _load_file(hub: Hub, session_id: str, path: Path) -> str:
    with hub.using(session_id) as live:
        return live.session.load_file(path).name


async def _artifact(request: Request, hub: Hub, session_id: str) -> Response:
    name = request.path_params["name"]
    if Path(name).name != name or name in ("", ".", ".."):
        return error(404, "No such artifact.")
    kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
    headers = {"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox"}
    path = _local_artifact(hub, session_id, name)
    try:
        # Opened once, no link followed, checked and served from that descriptor: a kernel swapping
        # the file for a link between a check and an open by name gets nothing out of it.
        fd, info = await asyncio.to_thread(open_below, path.parent, path.name)
    except OSError:
        stored = await asyncio.to_thread(hub.parts.store.file, session_id, "artifact", name) if hub.parts.store.keeps_files else None
        if stored is None:
            return error(404, f"No artifact {name!r} in this session.")
        return Response(stored, media_type=kind, headers=headers)
    return StreamingResponse(_chunks(fd, info.st_size), media_type=kind, headers={**headers, "Content-Length": str(info.st_size)})


def _local_artifact(hub: Hub, session_id: str, name: str) -> Path:
    """Where this replica would have the artifact: its executor's artifacts, else the session's working folder."""
    live = hub.get(session_id)
    if live is not None:
        try:
            return live.session.executor.artifact(name)
        except KeyError:
            return live.session.working_dir / name  # a file a cell wrote into the working folder
    return hub.config.sessions_dir / session_id / "artifacts" / name


async def _chunks(fd: int, size: int) -> AsyncIterator[bytes]:
    """The `size` bytes of the open file `fd`, in pieces; the descriptor is closed at the end (or on a dropped client)."""
    try:
        while size > 0 and (chunk := await asyncio.to_thread(os.read, fd, min(ARTIFACT_CHUNK, size))):
            size -= len(chunk)
            yield chunk
    finally:
        os.close(fd)


async def _context(_: Request, hub: Hub, session_id: str) -> Response:
    return JSONResponse({"roles": await asyncio.to_thread(_context_of, hub, session_id)})


def _context_of(hub: Hub, session_id: str) -> list[dict[str, Any]]:
    live = hub.get(session_id) if hub.replica is None else None
    if live is not None:
        return _roles(live)
    with hub.using(session_id) as current:
        return _roles(current)


def _roles(live: LiveSession) -> list[dict[str, Any]]:
    roles = []
    by_purpose = usage_by_purpose(live.session.usage_by_model())
    for context in live.session.contexts().values():
        # Prompt tokens of this process's calls, with what the servers took from their prefix caches.
        calls, folds = by_purpose.get(context.role, Usage()), by_purpose.get(f"compression_{context.role}", Usage())
        tokens = {
            "prompt_tokens": calls.prompt_tokens,
            "cached_tokens": calls.cached_tokens,
            "uncached_tokens": calls.uncached_tokens,
            "fold_prompt_tokens": folds.prompt_tokens,
            "fold_cached_tokens": folds.cached_tokens,
            # How its prompts are counted: the server's tokenizer, or llm.tokenizer times a ratio ('' for a model in this process).
            "counted_with": context.tokenizer.describe() if isinstance(context.tokenizer, ModelTokenizer) else "",
        }
        report = context.report()
        if report is None:
            roles.append({"role": context.label, "budget": context.budget, "total": 0, "parts": {}, **tokens})
            continue
        shown = {"budget": report.budget, "total": report.cost.total, "parts": dict(report.parts()), "folded_through": report.folded_through}
        roles.append({"role": context.label, **shown, **tokens})
    return roles


async def _experience(request: Request, hub: Hub, session_id: str) -> Response:
    if request.method == "POST":
        saved = await asyncio.to_thread(_save_experience, hub, session_id)
        return JSONResponse({"saved": saved})
    return JSONResponse(await asyncio.to_thread(_tips, hub, session_id))


def _save_experience(hub: Hub, session_id: str) -> list[dict[str, Any]]:
    with hub.using(session_id) as live:
        return [tip.to_dict() for tip in live.save_experience()]


def _tips(hub: Hub, session_id: str) -> dict[str, Any]:
    with hub.using(session_id) as live:
        experience = live.session.experience
        return {"tips": [tip.to_dict() for tip in experience.all()], "problems": experience.problems(), "enabled": live.session.config.experience.enabled}


async def _delete_tip(request: Request, hub: Hub, session_id: str) -> Response:
    def delete() -> dict[str, Any]:
        with hub.using(session_id) as live:
            return live.session.experience.delete(request.path_params["tip"]).to_dict()

    return JSONResponse({"deleted": await asyncio.to_thread(delete)})


async def _export(request: Request, hub: Hub, session_id: str) -> Response:
    fmt = request.query_params.get("format", "ipynb")
    if fmt not in ("ipynb", "md"):
        return error(400, "format is ipynb or md.")
    folder = Path(tempfile.mkdtemp())
    target = folder / f"{session_id}.{fmt}"
    try:
        await asyncio.to_thread(write_export, hub.config, session_id, fmt=fmt, target=target, owner=owner_of_request(request))
        data = target.read_bytes()
    except UnknownSessionError:
        return error(404, NO_SUCH_SESSION)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    kind = "application/x-ipynb+json" if fmt == "ipynb" else "text/markdown; charset=utf-8"
    return Response(data, media_type=kind, headers={"Content-Disposition": f'attachment; filename="{target.name}"'})


async def _json(request: Request) -> Any:
    try:
        return await request.json()
    except ValueError:
        return None
