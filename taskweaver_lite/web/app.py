"""The HTTP API and the page (CONTRACT §8): Starlette routes over the server's `Hub` of open sessions.

    GET  /                                      the page (static/index.html; no build step)
    GET  /api/sessions                          stored sessions, as `sessions --json`
    POST /api/sessions                          a new session -> {"id"}
    POST /api/sessions/{id}/resume              re-open a stored one (409 when open elsewhere)
    GET  /api/sessions/{id}                     its rounds, for a page (re)loading it
    POST /api/sessions/{id}/messages {"text"}   -> text/event-stream, ending with answer or error
    POST /api/sessions/{id}/stop                cancel the running request, like Ctrl-C
    POST /api/sessions/{id}/files               multipart `file` -> like /load
    GET  /api/sessions/{id}/artifacts/{name}    a file the session produced (only from its folders)
    GET  /api/sessions/{id}/context             each role's last prompt, in tokens by part, against its budget; prompt tokens cached and not
    GET  /api/sessions/{id}/export?format=ipynb|md
    POST /api/sessions/{id}/experience          distil the session into tips (like /save) -> {"saved": [...]}
    GET  /api/sessions/{id}/experience          every tip, and the handcrafted files that could not be read
    DELETE /api/sessions/{id}/experience/{tip}  delete a stored tip (like /experience delete)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import mimetypes
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from taskweaver_lite.config import Config
from taskweaver_lite.errors import TaskWeaverError, UnknownSessionError
from taskweaver_lite.llm.client import Usage, usage_by_purpose
from taskweaver_lite.store.database import stored_sessions
from taskweaver_lite.store.export import write_export
from taskweaver_lite.web.access_log import AccessLog, AccessLogMiddleware
from taskweaver_lite.web.auth import COOKIE, Access
from taskweaver_lite.web.events import round_json
from taskweaver_lite.web.hub import Busy, Hub, LiveSession
from taskweaver_lite.workfiles import open_below

STATIC = files("taskweaver_lite.web") / "static"
Handler = Callable[[Request], Awaitable[Response]]
ARTIFACT_CHUNK = 1 << 20


# What each route answers: the docs site's HTTP API page is generated from the routes and these
# lines (reference.py), and its build fails for a route that has none.
ROUTES_ABOUT = {
    ("GET", "/"): "the page (HTML); with `?token=...` it signs the browser in (an HttpOnly cookie) and drops the token from the address",
    ("GET", "/static/{name}"): "the page's own scripts, styles and vendored libraries",
    ("GET", "/api/sessions"): "the stored sessions, newest first, as `sessions --json`",
    ("POST", "/api/sessions"): 'a new session (its kernel starts in the background): `{"id": ...}`',
    ("GET", "/api/sessions/{id}"): (
        "an open session's rounds, posts and loads (what the page shows on reload), `session.suggested_requests`, and `folders`: "
        "the working and artifacts folders whose files the artifacts route serves"
    ),
    ("POST", "/api/sessions/{id}/resume"): "re-opens a stored session here (its cells replayed); 409 with the reason when it is open elsewhere",
    ("POST", "/api/sessions/{id}/messages"): (
        '`{"text": ...}`, answered as `text/event-stream`: `round_started`, `status`, `delta` (the fields of a streaming reply read '
        "so far), `output` (what a cell prints, as it prints), `post` (with `code` and `execution`: outcome, stdout, error, `html`, "
        'artifact links), `folded`, `file_loaded`, `round_ended`; the last event is `{"type": "answer", "text": ...}` (sent when the '
        "terminal would print it; pieces of a streamed reply that wait to be sent are merged into the latest) or "
        '`{"type": "error", "message": ...}` (also after an answer, should storing its round fail)'
    ),
    ("POST", "/api/sessions/{id}/stop"): "cancels the running request like Ctrl-C (the cell is interrupted, the variables stay)",
    ("POST", "/api/sessions/{id}/files"): (
        "multipart, field `file`: like `/load`, into the working folder, at most `session.max_upload_bytes` (413 past it)"
    ),
    ("GET", "/api/sessions/{id}/artifacts/{name}"): (
        "a file the session produced, by bare name, only from its artifacts and working folders, never through a link (plots as `image/png`)"
    ),
    ("GET", "/api/sessions/{id}/context"): "each role's last prompt by part against its budget, and its cached and uncached tokens (as `/context`)",
    ("GET", "/api/sessions/{id}/export"): "`?format=ipynb` or `?format=md`: the session as a notebook or Markdown, as `export`",
    ("GET", "/api/sessions/{id}/experience"): "every experience tip (stored and handcrafted) and the tip files that could not be read, as `/experience`",
    ("POST", "/api/sessions/{id}/experience"): (
        'like `/save`: the session distilled into tips, `{"saved": [tips]}`; 400 with the reason when the model\'s reply is unusable '
        "(nothing is stored)"
    ),
    ("DELETE", "/api/sessions/{id}/experience/{tip}"): "deletes a stored tip, as `/experience delete ID`",
}


def build_app(config: Config, access: Access, *, log: AccessLog | None = None, preload: Sequence[Path] = ()) -> Starlette:
    """The server's application; its sessions close when it shuts down; `log` gets a line per request; `preload` goes into each new session."""
    hub = Hub(config, preload=preload)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(hub.close)

    routes = [
        Route("/", _page(access)),
        Route("/static/{name}", _static),
        Route("/api/sessions", _sessions(hub), methods=["GET", "POST"]),
        Route("/api/sessions/{id}", _with(hub, _history)),
        Route("/api/sessions/{id}/resume", _resume(hub), methods=["POST"]),
        Route("/api/sessions/{id}/messages", _with(hub, _messages), methods=["POST"]),
        Route("/api/sessions/{id}/stop", _with(hub, _stop), methods=["POST"]),
        Route("/api/sessions/{id}/files", _with(hub, _files(hub)), methods=["POST"]),
        Route("/api/sessions/{id}/artifacts/{name}", _with(hub, _artifact)),
        Route("/api/sessions/{id}/context", _with(hub, _context)),
        Route("/api/sessions/{id}/export", _export(config)),
        Route("/api/sessions/{id}/experience", _with(hub, _experience), methods=["GET", "POST"]),
        Route("/api/sessions/{id}/experience/{tip}", _with(hub, _delete_tip), methods=["DELETE"]),
    ]
    logging = [Middleware(AccessLogMiddleware, log=log)] if log is not None else []  # outermost: refusals are logged too
    app = Starlette(routes=routes, middleware=[*logging, Middleware(_Guard, access=access)], lifespan=lifespan)
    app.state.hub = hub
    return app


class _Guard:
    """Every request passes `Access` first (a plain ASGI middleware: event streams pass through untouched)."""

    def __init__(self, app: ASGIApp, access: Access) -> None:
        self._app = app
        self._access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            request = Request(scope)
            offered = request.query_params.get("token")
            # The page with the right token in its address sets the cookie and drops the token from the address.
            opening = request.url.path == "/" and self._access.token is not None and offered == self._access.token
            refused = None if opening else self._access.problem(request)
            if refused is not None:
                # A person opening the page without the token is told how to sign in, not sent JSON.
                signing_in = refused[0] == 401 and request.url.path == "/" and request.method == "GET"
                answer = _sign_in_page() if signing_in else _error(*refused)
                await answer(scope, receive, send)
                return
        await self._app(scope, receive, send)


def _page(access: Access) -> Handler:
    async def page(request: Request) -> Response:
        offered = request.query_params.get("token")
        if offered is not None and access.token is not None:
            response: Response = RedirectResponse("/", status_code=303)
            response.set_cookie(COOKIE, offered, httponly=True, samesite="strict")
            return response
        return Response((STATIC / "index.html").read_text(encoding="utf-8"), media_type="text/html", headers=_PAGE_HEADERS)

    return page


def _sign_in_page() -> Response:
    text = (STATIC / "signin.html").read_text(encoding="utf-8")
    return Response(text, status_code=401, media_type="text/html", headers=_PAGE_HEADERS)


# The page loads nothing from elsewhere; a cell's HTML is shown in a sandboxed frame without scripts.
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; frame-src 'self' data:; object-src 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


async def _static(request: Request) -> Response:
    name = request.path_params["name"]
    resource = STATIC / name
    if "/" in name or name.startswith(".") or not resource.is_file():
        return _error(404, f"No file {name!r}.")
    kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
    return Response(resource.read_bytes(), media_type=kind, headers={"X-Content-Type-Options": "nosniff"})


def _sessions(hub: Hub) -> Handler:
    async def sessions(request: Request) -> Response:
        if request.method == "POST":
            live = await asyncio.to_thread(hub.new)
            return JSONResponse({"id": live.id})
        return JSONResponse(await asyncio.to_thread(_stored_sessions, hub.config))

    return sessions


def _stored_sessions(config: Config) -> list[dict[str, Any]]:
    return [row.to_dict() for row in stored_sessions(config.store_path)]


def _resume(hub: Hub) -> Handler:
    async def resume(request: Request) -> Response:
        try:
            live = await asyncio.to_thread(hub.resume, request.path_params["id"])
        except Busy as exc:
            return _error(409, str(exc))
        except UnknownSessionError as exc:
            return _error(404, str(exc))
        return JSONResponse({"id": live.id})

    return resume


def _with(hub: Hub, handler: Callable[[Request, LiveSession], Awaitable[Response]]) -> Handler:
    """A route about one open session: 404 (with what to do) when it is not open here."""

    async def route(request: Request) -> Response:
        live = hub.get(request.path_params["id"])
        if live is None:
            return _error(404, "This session is not open in this server: resume it first (POST .../resume).")
        try:
            return await handler(request, live)
        except Busy as exc:
            return _error(409, str(exc))
        except TaskWeaverError as exc:
            return _error(400, str(exc))

    return route


async def _history(_: Request, live: LiveSession) -> Response:
    rounds = [round_json(r, session_id=live.id) for r in live.session.conversation.rounds]
    loads = [{"name": load.name, "after_round": load.after_round} for load in live.session.loads]
    # The folders the artifacts route serves from: the page links a path in them that an answer names.
    folders = [str(live.session.working_dir), str(live.session.working_dir.parent / "artifacts")]
    suggested = live.session.config.session.suggested_requests
    return JSONResponse({"id": live.id, "rounds": rounds, "loads": loads, "busy": live.busy, "suggested_requests": suggested, "folders": folders})


async def _messages(request: Request, live: LiveSession) -> Response:
    body = await _json(request)
    text = body.get("text") if isinstance(body, dict) else None
    if not isinstance(text, str) or not text.strip():
        return _error(400, 'Send {"text": "..."} with the request.')
    turn = live.ask(text)

    async def stream() -> AsyncIterator[str]:
        async for batch in turn.batches():  # one write for what arrived together
            yield "".join(f"data: {json.dumps(item, ensure_ascii=False)}\n\n" for item in batch)

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


async def _stop(_: Request, live: LiveSession) -> Response:
    return JSONResponse({"stopped": live.stop()})


def _files(hub: Hub) -> Callable[[Request, LiveSession], Awaitable[Response]]:
    async def upload(request: Request, live: LiveSession) -> Response:
        limit = hub.config.session.max_upload_bytes
        declared = int(request.headers.get("content-length") or 0)
        if declared > limit + 64 * 1024:  # the multipart envelope on top of the file
            return _error(413, f"The file is larger than session.max_upload_bytes ({limit:,} bytes).")
        async with request.form(max_files=1, max_fields=4) as form:
            received = form.get("file")
            if not isinstance(received, UploadFile) or not received.filename:
                return _error(400, "Send the file as multipart form data in the field `file`.")
            name = Path(received.filename.replace("\\", "/")).name
            if not name or name.startswith("."):
                return _error(400, f"{received.filename!r} is not a usable file name.")
            folder = Path(tempfile.mkdtemp(dir=hub.upload_dir(live)))
            try:
                target = folder / name
                with target.open("wb") as out:
                    await asyncio.to_thread(shutil.copyfileobj, received.file, out)
                if target.stat().st_size > limit:
                    return _error(413, f"The file is larger than session.max_upload_bytes ({limit:,} bytes).")
                loaded = await asyncio.to_thread(live.session.load_file, target)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        return JSONResponse({"name": loaded.name, "text": f"Loaded {loaded.name} into the working folder."})

    return upload


async def _artifact(request: Request, live: LiveSession) -> Response:
    name = request.path_params["name"]
    if Path(name).name != name or name in ("", ".", ".."):
        return _error(404, "No such artifact.")
    try:
        path = live.session.executor.artifact(name)
    except KeyError:
        path = live.session.working_dir / name  # a file a cell wrote into the working folder
    try:
        # Opened once, no link followed, checked and served from that descriptor: a kernel swapping
        # the file for a link between a check and an open by name gets nothing out of it.
        fd, info = await asyncio.to_thread(open_below, path.parent, path.name)
    except OSError:
        return _error(404, f"No artifact {name!r} in this session.")
    kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
    headers = {"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox", "Content-Length": str(info.st_size)}
    return StreamingResponse(_chunks(fd, info.st_size), media_type=kind, headers=headers)


async def _chunks(fd: int, size: int) -> AsyncIterator[bytes]:
    """The `size` bytes of the open file `fd`, in pieces; the descriptor is closed at the end (or on a dropped client)."""
    try:
        while size > 0 and (chunk := await asyncio.to_thread(os.read, fd, min(ARTIFACT_CHUNK, size))):
            size -= len(chunk)
            yield chunk
    finally:
        os.close(fd)


async def _context(_: Request, live: LiveSession) -> Response:
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
        }
        report = context.report()
        if report is None:
            roles.append({"role": context.label, "budget": context.budget, "total": 0, "parts": {}, **tokens})
            continue
        parts = dict(report.parts())
        roles.append(
            {"role": context.label, "budget": report.budget, "total": report.cost.total, "parts": parts, "folded_through": report.folded_through, **tokens}
        )
    return JSONResponse({"roles": roles})


async def _experience(request: Request, live: LiveSession) -> Response:
    if request.method == "POST":
        saved = await asyncio.to_thread(live.save_experience)
        return JSONResponse({"saved": [tip.to_dict() for tip in saved]})
    experience = live.session.experience
    tips, problems = await asyncio.to_thread(lambda: (experience.all(), experience.problems()))
    return JSONResponse({"tips": [tip.to_dict() for tip in tips], "problems": problems, "enabled": live.session.config.experience.enabled})


async def _delete_tip(request: Request, live: LiveSession) -> Response:
    tip = await asyncio.to_thread(live.session.experience.delete, request.path_params["tip"])
    return JSONResponse({"deleted": tip.to_dict()})


def _export(config: Config) -> Handler:
    async def export(request: Request) -> Response:
        fmt = request.query_params.get("format", "ipynb")
        if fmt not in ("ipynb", "md"):
            return _error(400, "format is ipynb or md.")
        session_id = request.path_params["id"]
        folder = Path(tempfile.mkdtemp())
        target = folder / f"{session_id}.{fmt}"
        try:
            await asyncio.to_thread(write_export, config, session_id, fmt=fmt, target=target)
            data = target.read_bytes()
        except TaskWeaverError as exc:
            return _error(404, str(exc))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        kind = "application/x-ipynb+json" if fmt == "ipynb" else "text/markdown; charset=utf-8"
        return Response(data, media_type=kind, headers={"Content-Disposition": f'attachment; filename="{target.name}"'})

    return export


async def _json(request: Request) -> Any:
    try:
        return await request.json()
    except ValueError:
        return None


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)
