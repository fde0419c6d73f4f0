"""The web server's application: the page, the service routes, and the session API (`api.py`).

    GET  /                  the page (static/index.html; no build step); the sign-in page while the request has no valid token
    POST /sign-in           the sign-in form: a valid token gets a signed, expiring cookie (never the token itself)
    POST /sign-out          ends that sign-in in the store (its cookie is refused from then on) and drops the cookie
    GET  /healthz           200 when the store and the kernel gateway answer, else 503 naming what is down (no token)
    GET  /metrics           Prometheus text format (metrics.py), behind the same token rule as the API, or serve.metrics_token
    /api/...                the sessions (api.py), over the server's `Hub` of sessions
    /mcp                    MCP's Streamable HTTP transport with the tools of `taskweaver-lite mcp`, over the same Hub (mcp_endpoint.py)

One server alone keeps its sessions in the project's SQLite file (or a PostgreSQL store marked
`serve.single_replica`). With a PostgreSQL store and a kernel gateway it is one replica of several
(replica.py): leases in the store, events fanned out by LISTEN/NOTIFY (fanout.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import html
import importlib
import logging
import mimetypes
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

if TYPE_CHECKING:
    from taskweaver_lite.web.mcp_endpoint import McpEndpoint

from taskweaver_lite.config.settings import Config
from taskweaver_lite.errors import StoreError
from taskweaver_lite.session.workspace import Workspace
from taskweaver_lite.store.interface import AuditEntry, Store
from taskweaver_lite.telemetry import tracing
from taskweaver_lite.web.access_log import AccessLog, AccessLogMiddleware
from taskweaver_lite.web.admin import admin_routes
from taskweaver_lite.web.api import api_routes, error
from taskweaver_lite.web.auth import COOKIE, NEEDS_A_USER, NEEDS_THE_TOKEN, Access, Refusal, same_origin_form, same_origin_link, too_many_refused
from taskweaver_lite.web.connections import BodyLimit
from taskweaver_lite.web.fanout import Fanout
from taskweaver_lite.web.hub import Hub, ServerParts
from taskweaver_lite.web.metrics import CONTENT_TYPE, Metrics, RequestMetrics
from taskweaver_lite.web.replica import check_gateway_client, check_replica_setup, is_replica
from taskweaver_lite.web.sign_in import SignInKey, SignIns
from taskweaver_lite.web.trace_context import TraceMiddleware

STATIC = files("taskweaver_lite.web") / "static"
_log = logging.getLogger(__name__)
Handler = Callable[[Request], Awaitable[Response]]
HEALTH_TIMEOUT = 3.0  # seconds the gateway gets to answer /healthz's question
# Answered without a token: a load balancer's probe, the sign-in and sign-out forms, single sign-on's way out and back.
OPEN = frozenset({"/healthz", "/sign-in", "/sign-out", "/oidc/sign-in", "/oidc/callback"})
METRICS = "/metrics"
MCP_PATH = "/mcp"
MCP_REFUSED = -32001  # the JSON-RPC error code of a request /mcp refuses before any MCP is read (no token, a bad one, too many)


# What each route answers: the docs site's HTTP API page is generated from the routes and these
# lines (reference.py), and its build fails for a route that has none.
ROUTES_ABOUT = {
    ("GET", "/"): (
        "the page (HTML); the sign-in page (401) to a browser that has not signed in; on a server started with one token (`--token`, "
        "`--demo`), `?token=...` opened from outside any site (the link `serve` prints) signs the browser in as `POST /sign-in` does and drops "
        "the token from the address; the link from another site, or a user's token in the address, gets the sign-in page and no cookie"
    ),
    ("POST", "/sign-in"): (
        "the sign-in form (`token`, form-encoded): a valid token gets an HttpOnly cookie holding a signed value that runs out after "
        "`serve.sign_in_hours` (never the token; `Secure` over TLS) and a redirect to the page; any other gets the sign-in page again (401)"
    ),
    (
        "POST",
        "/sign-out",
    ): "ends the browser's sign-in in the store (its cookie is refused from then on, by every replica), drops the cookie, and goes back to the sign-in page",
    ("GET", "/oidc/sign-in"): (
        "with `serve.oidc`: to the OpenID Connect provider (authorization code with PKCE), the state kept in a short-lived sealed cookie"
    ),
    ("GET", "/oidc/callback"): (
        "the provider's answer: the code exchanged, the ID token checked, the person let in by `serve.oidc.allowed_domains` and "
        "`allowed_groups` (added at their first sign-in, unless removed; admin by `admin_groups`), then the sign-in cookie and the page"
    ),
    ("GET", "/admin"): "the admin page (HTML): users, sessions with their owners, kernels per user, usage per user, the audit trail",
    ("GET", "/api/me"): "the caller: `{name, admin, users}` (`users`: whether the server has users)",
    ("POST", "/api/me/token"): "a new token for the caller, shown once (`{name, token}`); their old one and its sign-ins stop at once",
    ("GET", "/api/admin/users"): "admins only: every user, as `users list --json`",
    ("POST", "/api/admin/users"): 'admins only: `{"name", "admin", "expires_days"}` adds a user: `{name, token}` (the token shown once)',
    ("POST", "/api/admin/users/{name}/{action}"): (
        'admins only: `rotate` (a new token, shown once), `promote`, `demote`, `expire` (`{"days": N}`, null for never), as `users` does'
    ),
    ("DELETE", "/api/admin/users/{name}"): "admins only: removes the user (their sessions stay)",
    ("GET", "/api/admin/sessions"): "admins only: every session with its owner",
    ("GET", "/api/admin/kernels"): "admins only: the gateway's kernels (or the sessions open here), each with its session and owner",
    ("GET", "/api/admin/usage"): "admins only: per user, sessions, cells, the seconds cells ran, and per model the calls and tokens",
    ("GET", "/api/admin/audit"): "admins only: the latest `?limit=N` (200) entries of the audit trail, oldest first, as `audit --json`",
    ("GET", "/static/{name}"): "the page's own scripts, styles and vendored libraries",
    ("GET", "/api/sessions"): "the stored sessions, newest first, as `sessions --json`",
    ("POST", "/api/sessions"): (
        'a new session (its kernel starts in the background): `{"id": ...}`; 429 with the reason when the user already has '
        "`serve.max_sessions_per_user` sessions"
    ),
    ("GET", "/api/sessions/{id}"): (
        "a session's rounds, posts and loads (what the page shows on reload), whether it is busy, its last event's id, "
        "`session.suggested_requests`, and `folders`: the working and artifacts folders whose files the artifacts route serves"
    ),
    ("DELETE", "/api/sessions/{id}"): (
        "deletes the session for good: its rounds, files, kernel and the tips saved from it (`sessions --delete`); 409 while it answers a request"
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
    ("POST", "/api/sessions/{id}/files"): ("multipart, field `file`: like `/load`, into the working folder, at most `session.max_upload_bytes` (413 past it)"),
    ("GET", "/api/sessions/{id}/artifacts/{name}"): (
        "a file the session produced, by bare name, only from its artifacts and working folders, never through a link (plots as `image/png`)"
    ),
    ("GET", "/api/sessions/{id}/context"): "each role's last prompt by part against its budget, and its cached and uncached tokens (as `/context`)",
    ("GET", "/api/sessions/{id}/export"): "`?format=ipynb` or `?format=md`: the session as a notebook or Markdown, as `export`",
    ("GET", "/api/sessions/{id}/experience"): "every experience tip (stored and handcrafted) and the tip files that could not be read, as `/experience`",
    ("POST", "/api/sessions/{id}/experience"): (
        'like `/save`: the session distilled into tips, `{"saved": [tips]}`; 400 with the reason when the model\'s reply is unusable (nothing is stored)'
    ),
    ("DELETE", "/api/sessions/{id}/experience/{tip}"): "deletes a stored tip, as `/experience delete ID`",
    ("GET", "/api/sessions/{id}/events"): (
        "`text/event-stream` of the session's events as they are stored, whichever server runs its request, each with an `id:`; "
        "a client that reconnects with `Last-Event-ID` (or `?after=ID`) gets what it missed"
    ),
    ("POST", "/mcp"): (
        "MCP's Streamable HTTP transport (stateless: any replica answers any request) with the tools and resources of "
        "`taskweaver-lite mcp`; the caller's token names the user whose sessions the tools see (another user's session is not found)"
    ),
    ("GET", "/mcp"): "405: this MCP endpoint is stateless and opens no stream of its own (answers come on each POST)",
    ("DELETE", "/mcp"): "405: there is no MCP session to end (the sessions the tools make are stored; `close_session` releases one)",
    ("GET", "/healthz"): "200 when the store and the kernel gateway answer, else 503 naming what is down (no token needed)",
    ("GET", "/metrics"): (
        "Prometheus text: requests and latencies by route, model calls, prompt tokens cached and uncached by role, folds, "
        "open and running sessions, lease takeovers, tokens by user and model, the process and the version (behind the same token rule as "
        "the API, or `serve.metrics_token`, which opens this route alone and is checked without the store)"
    ),
}


def build_app(config: Config, access: Access, *, log: AccessLog | None = None, preload: Sequence[Path] = ()) -> Starlette:
    """The server's application; its sessions close when it shuts down; `log` gets a line per request; `preload` goes into each new session.

    ConfigError when a PostgreSQL store would get local kernels on a server that may have replicas.
    """
    check_replica_setup(config)
    check_gateway_client(config)  # before any session or /healthz would need it
    workspace = Workspace(config)  # the project opened once: its store, roles and plugins serve every session here
    parts = ServerParts(workspace=workspace, metrics=Metrics(), fanout=Fanout())
    hub = Hub(config, parts, preload=preload)
    key = SignInKey.load(config.sign_in_key_path, explicit=config.serve.sign_in_key_file is not None)
    replaced = hub.parts.store.sign_in_key_check(key.check())
    if replaced is not None:
        _log.warning(
            "this server signs sign-ins with another key (%s) than the last server started on this store: sign-ins made on one are refused "
            "by the other; give every replica the same file (serve.sign_in_key_file)",
            key.path,
        )
    sign_ins = SignIns(hub.parts.store, key, config.serve.sign_in_hours)
    access = access.with_users(hub.parts.store, settings=config.serve, sign_ins=sign_ins)  # the store's users, once it has any
    notices = workspace.store.notices()  # None on the SQLite file
    if notices is not None and is_replica(config):
        hub.join_replicas(notices)

    mcp = _Mcp(hub)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await mcp.close()
        hub.stop_taking()
        await asyncio.to_thread(hub.close)
        hub.parts.fanout.close()
        workspace.close()

    sso: list[Route] = []
    if config.serve.oidc is not None:
        from taskweaver_lite.web.oidc import Provider, oidc_routes

        sso = oidc_routes(Provider(config.serve.oidc), access, key, functools.partial(_sign_in_page, access))
    routes = [
        *sso,
        Route("/", _page(access)),
        Route("/sign-in", _sign_in(access), methods=["POST"]),
        Route("/sign-out", _sign_out(access), methods=["POST"]),
        Route("/static/{name}", _static),
        Route("/healthz", _health(hub)),
        Route(METRICS, _metrics(hub)),
        *api_routes(hub),
        *admin_routes(hub, _admin_page, access),
        Route(MCP_PATH, mcp, methods=["GET", "POST", "DELETE"]),
    ]
    logging = [Middleware(AccessLogMiddleware, log=log)] if log is not None else []  # outermost: refusals are logged too
    timing = Middleware(RequestMetrics, metrics=hub.parts.metrics, routes=routes)
    scraper = config.serve.metrics_token.get_secret_value() if config.serve.metrics_token is not None else None
    guard = Middleware(_Guard, access=access, metrics_token=scraper)
    tracer = tracing.tracer_for(config.tracing)  # None with tracing off: no middleware, no cost
    traced = [Middleware(TraceMiddleware, tracer=tracer, routes=routes)] if tracer is not None else []
    app = Starlette(
        routes=routes, middleware=[*logging, timing, *traced, guard, Middleware(BodyLimit, config=config, jsonrpc=(MCP_PATH, MCP_REFUSED))], lifespan=lifespan
    )
    app.state.hub = hub
    return app


class _Mcp:
    """`/mcp` over `hub`, the MCP SDK loaded and its transport started by the first request to reach it.

    A server nobody asks over MCP never imports the SDK: about half a second of CPU off every
    replica's start. The transport then runs, in a task of its own, for the rest of the app's life.
    Without the SDK (the `mcp` extra), `/mcp` says how to get it.
    """

    def __init__(self, hub: Hub) -> None:
        self._hub = hub
        self._endpoint: McpEndpoint | None = None
        self._problem = ""  # why /mcp cannot answer, once its start failed
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._task is None:  # the first request starts it; the task outlives that request (and its cancellation)
            self._task = asyncio.create_task(self._run(), name="mcp-transport")
        await self._ready.wait()
        if self._endpoint is None:
            await error(501 if self._problem == _NO_MCP_SDK else 503, self._problem)(scope, receive, send)
            return
        await self._endpoint(scope, receive, send)

    async def _run(self) -> None:
        try:
            try:
                module = await asyncio.to_thread(importlib.import_module, "taskweaver_lite.web.mcp_endpoint")
            except ImportError:
                self._problem = _NO_MCP_SDK
                return
            endpoint: McpEndpoint = module.McpEndpoint(self._hub)
            async with endpoint.running():
                self._endpoint = endpoint
                self._ready.set()
                await self._stop.wait()
        except Exception:  # noqa: BLE001 - whatever stopped it, /mcp must answer saying so, not leave its requests waiting
            _log.exception("/mcp could not start")
            self._problem = "This server's MCP transport could not start (its log says why), so /mcp does not answer; restart serve."
        finally:
            self._endpoint = None
            self._ready.set()

    async def close(self) -> None:
        """Stop the transport, if a request started it (the app's lifespan, as the server stops)."""
        self._stop.set()
        if self._task is not None:
            await self._task


_NO_MCP_SDK = "This server has no MCP SDK, so /mcp does not answer: install the mcp extra (pip install '.[mcp]' in a checkout), then restart serve."


class _Guard:
    """Every request passes `Access` first (a plain ASGI middleware: event streams pass through untouched)."""

    def __init__(self, app: ASGIApp, access: Access, metrics_token: str | None = None) -> None:
        self._app = app
        self._access = access
        self._metrics_token = metrics_token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not _open(scope) and not self._scraper(scope):
            request = Request(scope)
            refused = await self._access.check(request)
            if refused is not None:
                # A person opening the page without a sign-in is shown the sign-in page, not sent JSON.
                signing_in = refused.status == 401 and request.url.path == "/" and request.method == "GET"
                problem = None if refused.message in (NEEDS_A_USER, NEEDS_THE_TOKEN) else refused.message  # not signed in yet: nothing went wrong
                if signing_in:
                    answer = _sign_in_page(self._access, problem)
                else:
                    answer = mcp_refusal(refused) if request.url.path == MCP_PATH else refusal(refused)
                await answer(scope, receive, send)
                return
            scope.setdefault("state", {})["client_address"] = self._access.proxies.client_address(request)  # for the audit trail
            # An event stream asks, while it runs, whether the credential it was opened with still holds.
            scope.setdefault("state", {})["still_allowed"] = functools.partial(self._access.still_allowed, request)
        await self._app(scope, receive, send)

    def _scraper(self, scope: Scope) -> bool:
        """Whether this is GET /metrics with serve.metrics_token (checked here, without the store: it answers while the store is down)."""
        if self._metrics_token is None or scope.get("path") != METRICS:
            return False
        header = Request(scope).headers.get("authorization", "")
        offered = header[7:].strip() if header.lower().startswith("bearer ") else ""
        return hmac.compare_digest(offered.encode(), self._metrics_token.encode())


def _open(scope: Scope) -> bool:
    """Answered without a token: the probe, the sign-in and sign-out forms, the page's static files, and `/?token=` (checked by the page)."""
    path = scope.get("path", "")
    return path in OPEN or path.startswith("/static/") or (path == "/" and b"token=" in scope.get("query_string", b""))


def refusal(refused: Refusal) -> Response:
    """A refusal as a JSON error answer (with Retry-After for a 429)."""
    answer = error(refused.status, refused.message)
    if refused.retry_after is not None:
        answer.headers["Retry-After"] = str(refused.retry_after)
    return answer


def mcp_refusal(refused: Refusal) -> Response:
    """A refusal on /mcp: the same status and line, as a JSON-RPC error an MCP client shows (with the Bearer challenge on a 401)."""
    answer = JSONResponse({"jsonrpc": "2.0", "id": None, "error": {"code": MCP_REFUSED, "message": refused.message}}, status_code=refused.status)
    if refused.status == 401:
        answer.headers["WWW-Authenticate"] = 'Bearer realm="taskweaver-lite"'
    if refused.retry_after is not None:
        answer.headers["Retry-After"] = str(refused.retry_after)
    return answer


def _page(access: Access) -> Handler:
    async def page(request: Request) -> Response:
        offered = request.query_params.get("token")
        if offered is not None and access.uses_tokens:
            refused = same_origin_link(request)
            if refused is None and access.users_in_force():
                refused = "A user's token is never taken from the address (it would stay in proxies' logs and the browser's history): paste it below."
            if refused is not None:
                return _sign_in_page(access, refused)
            return await _signed_in(access, request, offered)
        if offered is not None:  # a server that needs no token: the address is only made clean
            return RedirectResponse("/", status_code=303)
        return Response((STATIC / "index.html").read_text(encoding="utf-8"), media_type="text/html", headers=_PAGE_HEADERS)

    return page


async def _admin_page(_: Request) -> Response:
    """The admin page: its data comes from /api/admin/... (for admins only)."""
    return Response((STATIC / "admin.html").read_text(encoding="utf-8"), media_type="text/html", headers=_PAGE_HEADERS)


def _sign_in(access: Access) -> Handler:
    async def sign_in(request: Request) -> Response:
        refused = same_origin_form(request)
        if refused is not None:
            return refusal(refused)
        async with request.form(max_files=0, max_fields=2) as form:
            offered = form.get("token")
        return await _signed_in(access, request, offered if isinstance(offered, str) else "")

    return sign_in


async def _signed_in(access: Access, request: Request, offered: str) -> Response:
    """A valid token: the sign-in cookie and the page (a redirect, so the token leaves the address); else the sign-in page again, no cookie."""
    address = access.proxies.client_address(request)
    wait = access.failures.held_back(address, offered.strip())
    if wait is not None:
        return refusal(too_many_refused(address, wait))
    try:
        made = await asyncio.to_thread(access.sign_in, offered.strip())
    except StoreError:
        return refusal(Refusal(503, "The session store cannot be reached, so the token cannot be checked; try again shortly."))
    if made is None:
        access.failures.failed(address)
        entry = AuditEntry(at=time.time(), actor="-", action="token-refused", target="on the sign-in page", source=address)
        await asyncio.to_thread(access.audit, entry)
        return _sign_in_page(access, "That token is not valid here: check it, or ask an administrator for a new one.")
    value, who = made
    access.failures.passed(offered.strip())
    await asyncio.to_thread(access.audit, AuditEntry(at=time.time(), actor=who, action="sign-in", target=who, source=address, detail="token"))
    return signed_in_answer(access, request, value)


def signed_in_answer(access: Access, request: Request, value: str, *, to: str = "/") -> Response:
    """The redirect to the page that sets the sign-in cookie (HttpOnly, SameSite=Strict, Secure over TLS), good for `serve.sign_in_hours`."""
    response = RedirectResponse(to, status_code=303)
    seconds = round(access.sign_in_hours * 3600)
    response.set_cookie(COOKIE, value, max_age=seconds, httponly=True, samesite="strict", secure=access.proxies.is_https(request))
    return response


def _sign_out(access: Access) -> Handler:
    async def sign_out(request: Request) -> Response:
        refused = same_origin_form(request)
        if refused is not None:
            return refusal(refused)
        value = request.cookies.get(COOKIE, "")
        if value and access.sign_ins is not None:
            try:
                ended = await asyncio.to_thread(access.sign_ins.end, value)
            except StoreError:
                return refusal(Refusal(503, "The session store cannot be reached, so the sign-in cannot be ended; try again shortly."))
            if ended is not None:
                who = ended.user.name if ended.user is not None else "-"
                entry = AuditEntry(at=time.time(), actor=who, action="sign-out", target=who, source=access.proxies.client_address(request))
                await asyncio.to_thread(access.audit, entry)
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(COOKIE, httponly=True, samesite="strict", secure=access.proxies.is_https(request))
        return response

    return sign_out


def _sign_in_page(access: Access, problem: str | None = None) -> Response:
    """The sign-in page (401), speaking of a user's own token when the server has users, else of the server's one token."""
    text = (STATIC / "signin.html").read_text(encoding="utf-8")
    who = _SIGN_IN_USERS if access.users_in_force() else _SIGN_IN_TOKEN
    sso = f'<p><a class="sso" id="sso" href="/oidc/sign-in">Sign in with {html.escape(access.sso_label)}</a></p>' if access.sso_label else ""
    text = text.replace("{{who}}", who).replace("{{problem}}", f'<p class="problem">{html.escape(problem)}</p>' if problem else "")
    text = text.replace("{{sso}}", sso)
    return HTMLResponse(text, status_code=401, headers=_PAGE_HEADERS)


_SIGN_IN_USERS = (
    "<p>This server knows each person by a token of their own. Paste yours: the one "
    "<code>taskweaver-lite users add</code> printed when an administrator added you (or gave you since).</p>"
)
_SIGN_IN_TOKEN = (
    "<p>This server needs its token: the value given with <code>--token</code> or the "
    "<code>TASKWEAVER_LITE_TOKEN</code> environment variable. Paste it here, or open the link <code>serve</code> printed when it started.</p>"
)


# The page loads nothing from elsewhere; a cell's HTML is shown in a sandboxed frame without scripts.
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; frame-src 'self' data:; object-src 'none'",
    "X-Content-Type-Options": "nosniff",
    # same-origin: the page's own forms and requests carry its Origin (with no-referrer a browser sends `Origin: null`, which
    # the same-origin rule must refuse), while a link followed to another site carries nothing of this one's address.
    "Referrer-Policy": "same-origin",
}


async def _static(request: Request) -> Response:
    name = request.path_params["name"]
    resource = STATIC / name
    if "/" in name or name.startswith(".") or not resource.is_file():
        return error(404, f"No file {name!r}.")
    kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
    return Response(resource.read_bytes(), media_type=kind, headers={"X-Content-Type-Options": "nosniff"})


def _health(hub: Hub) -> Handler:
    async def health(_: Request) -> Response:
        checks = await asyncio.gather(asyncio.to_thread(_store_health, hub.parts.store), asyncio.to_thread(_gateway_health, hub.config))
        down = {name: problem for name, problem in checks if problem}
        body = {"status": "ok" if not down else "down", "store": down.get("store", "ok"), "kernel_gateway": down.get("kernel_gateway", "ok")}
        if hub.config.execution.kernel_gateway is None:
            body["kernel_gateway"] = "not used"
        if hub.stopping:
            body["status"], down["server"] = "stopping", "stopping"
        if down:
            body["message"] = "Down: " + "; ".join(f"{name} ({problem})" for name, problem in down.items())
        return JSONResponse(body, status_code=503 if down else 200)

    return health


def _store_health(store: Store) -> tuple[str, str]:
    try:
        store.ping()
    except StoreError as exc:
        return "store", " ".join(str(exc).split())
    return "store", ""


def _gateway_health(config: Config) -> tuple[str, str]:
    gateway = config.execution.kernel_gateway
    if gateway is None:
        return "kernel_gateway", ""
    import requests

    headers = gateway.request_headers()
    try:
        answer = requests.get(f"{gateway.url}/api", headers=headers, timeout=HEALTH_TIMEOUT, verify=gateway.validate_cert)
    except requests.RequestException as exc:
        return "kernel_gateway", f"{gateway.url} does not answer ({type(exc).__name__})"
    return "kernel_gateway", "" if answer.ok else f"{gateway.url} answered HTTP {answer.status_code}"


def _metrics(hub: Hub) -> Handler:
    async def metrics(_: Request) -> Response:
        hub.parts.metrics.running.set(hub.running())
        return Response(hub.parts.metrics.render(), media_type=CONTENT_TYPE)

    return metrics
