"""Each API request a server span, continuing the W3C `traceparent` the caller sent (with tracing on).

The span is named after the route's template (`POST /api/sessions/{id}/messages`), so a trace
viewer groups requests by what they did, not by session; it lasts until the response's last byte,
which for a message is the turn's end. The turn the request starts runs on its own thread in a copy
of this context (web/live.py), so its spans stay children of this one. The page, its files,
`/healthz` and `/metrics` are not traced: probes and scrapes would bury the requests.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from taskweaver_lite.telemetry import tracing
from taskweaver_lite.telemetry.spans import Tracer
from taskweaver_lite.web.metrics import route_template

TRACED_PREFIX = "/api/"


class TraceMiddleware:
    """ASGI middleware: a server span around every `/api/` request, its parent the request's `traceparent` if any."""

    def __init__(self, app: ASGIApp, tracer: Tracer, routes: Sequence[BaseRoute]) -> None:
        self._app = app
        self._tracer = tracer
        self._routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith(TRACED_PREFIX):
            await self._app(scope, receive, send)
            return
        method, route = str(scope.get("method", "")), route_template(self._routes, scope)
        headers = {key.decode("latin-1"): value.decode("latin-1") for key, value in scope.get("headers", [])}
        attributes = {"http.request.method": method, "http.route": route, "url.path": str(scope.get("path", ""))}
        with tracing.served(self._tracer, name=f"{method} {route}", headers=headers, attributes=attributes) as span:

            async def answered(message: Message) -> None:
                if message["type"] == "http.response.start":
                    span.set({"http.response.status_code": int(message["status"])})
                    user = scope.get("state", {}).get("user")
                    if user is not None:  # who asked, by name (set by the sign-in check before the route ran)
                        span.set({"enduser.id": str(getattr(user, "name", user))})
                await send(message)

            await self._app(scope, receive, answered)
