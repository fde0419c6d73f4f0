"""What `GET /metrics` reports, in Prometheus's text format: one registry per server (replica).

Requests and latencies are counted by route template (`/api/sessions/{id}/messages`), never by
path, so a thousand sessions make no thousand series. Model calls and prompt tokens (cached and
not) are counted by role from the sessions' events, as the store records them; folds by role and
outcome; open sessions are those this replica holds in memory; lease takeovers are sessions taken
from a replica that stopped renewing its lease (it died or lost the store). Tokens are also counted
by user (the session's owner) and model, for a bill. The process's own CPU, memory and open files,
the Python version, and this program's version (`taskweaver_build_info`) come with every scrape.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from taskweaver_lite import __version__
from taskweaver_lite.records.events import Event, Folded, Listener, ModelCalled

try:  # pip install 'taskweaver-lite[team]'; without it the server runs and /metrics says what to install
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, PlatformCollector, ProcessCollector, generate_latest
except ImportError:  # pragma: no cover - the test environment has it
    CollectorRegistry = None  # type: ignore[assignment,misc]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MISSING = "# /metrics needs prometheus_client: pip install 'taskweaver-lite[team]'\n"
# Seconds: an answer is ~20 ms to a minute (a long cell); loading a session ~10 ms to seconds.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
FOLD_PREFIX = "compression_"


class Metrics:
    """The server's counters; `observe` is a session listener, `RequestMetrics` the middleware that times routes."""

    def __init__(self) -> None:
        self.available = CollectorRegistry is not None
        if not self.available:
            self._count_nothing()
            return
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("taskweaver_http_requests", "HTTP requests answered, by route, method and status", ["route", "method", "status"], registry=r)
        self.latency = Histogram(
            "taskweaver_http_request_seconds", "Time to a response's start (an event stream: its opening)", ["route", "method"], registry=r,
            buckets=_LATENCY_BUCKETS,
        )  # fmt: skip
        self.answers = Histogram("taskweaver_answer_seconds", "Time from a request's message to its answer", registry=r, buckets=_LATENCY_BUCKETS)
        self.model_calls = Counter("taskweaver_model_calls", "Chat-model calls, by role and outcome", ["role", "ok"], registry=r)
        self.prompt_tokens = Counter(
            "taskweaver_prompt_tokens", "Prompt tokens sent, by role; cache=cached: the server took them from its prefix cache", ["role", "cache"], registry=r
        )
        self.completion_tokens = Counter("taskweaver_completion_tokens", "Tokens the model generated, by role", ["role"], registry=r)
        self.folds = Counter("taskweaver_folds", "Rounds folded into a role's summary (ok=false: the fold failed)", ["role", "ok"], registry=r)
        self.open_sessions = Gauge("taskweaver_open_sessions", "Sessions this replica holds in memory", registry=r)
        self.running = Gauge("taskweaver_running_requests", "Requests this replica is answering now", registry=r)
        self.lease_takeovers = Counter("taskweaver_lease_takeovers", "Sessions taken over from a replica whose lease ran out", registry=r)
        self.lease_handovers = Counter(
            "taskweaver_lease_handovers", "Requests handed their session's lease by its previous request on this replica (no store round trip)", registry=r
        )
        self.session_loads = Histogram(
            "taskweaver_session_load_seconds", "Loading a session from the store into this replica (a takeover's cost)", registry=r, buckets=_LATENCY_BUCKETS
        )
        self.session_refreshes = Histogram(
            "taskweaver_session_refresh_seconds", "Bringing this replica's copy of a session up to date from the store (its kernel connection kept)",
            registry=r, buckets=_LATENCY_BUCKETS,
        )  # fmt: skip
        self.store_unavailable = Counter("taskweaver_store_unavailable", "Requests answered 503 because the store was unreachable", registry=r)
        self.tokens = Counter("taskweaver_tokens", "Tokens by user (the session's owner; - without users), model and kind (prompt, completion)",
                              ["user", "model", "kind"], registry=r)  # fmt: skip
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes, open files...
        PlatformCollector(registry=r)  # python_info: the interpreter's version
        Gauge("taskweaver_build_info", "This program's version (always 1)", ["version"], registry=r).labels(__version__).set(1)

    def _count_nothing(self) -> None:
        """Without prometheus_client: every metric a no-op, so the server runs the same."""
        for name in ("requests", "latency", "answers", "model_calls", "prompt_tokens", "completion_tokens", "folds", "open_sessions", "running",
                     "lease_takeovers", "lease_handovers", "session_loads", "session_refreshes", "store_unavailable", "tokens"):  # fmt: skip
            setattr(self, name, _Nothing())

    def listener(self, user: str | None) -> Listener:
        """The listener for a session of `user` (None: no users): `observe` with the owner named."""
        return functools.partial(self.observe, user=user)

    def observe(self, event: Event, *, user: str | None = None) -> None:
        """A session listener: model calls, tokens and folds by role; tokens also by user and model."""
        if isinstance(event, ModelCalled):
            model = event.model or "-"
            self.tokens.labels(user or "-", model, "prompt").inc(event.prompt_tokens)
            self.tokens.labels(user or "-", model, "completion").inc(event.completion_tokens)
            folding = event.purpose.startswith(FOLD_PREFIX)
            role = event.purpose.removeprefix(FOLD_PREFIX) + (" (fold)" if folding else "")
            self.model_calls.labels(role, str(event.ok).lower()).inc()
            self.prompt_tokens.labels(role, "cached").inc(event.cached_tokens)
            self.prompt_tokens.labels(role, "uncached").inc(max(event.prompt_tokens - event.cached_tokens, 0))
            self.completion_tokens.labels(role).inc(event.completion_tokens)
        elif isinstance(event, Folded):
            self.folds.labels(event.role, str(event.ok).lower()).inc()

    def render(self) -> bytes:
        """The text exposition of every metric (without prometheus_client: a comment saying what to install)."""
        if not self.available:
            return MISSING.encode()
        return bytes(generate_latest(self.registry))


class _Nothing:
    """A metric that counts nothing (prometheus_client is not installed)."""

    def labels(self, *_: Any) -> _Nothing:
        return self

    def inc(self, *_: Any) -> None:
        """Nothing."""

    def observe(self, *_: Any) -> None:
        """Nothing."""

    def set(self, *_: Any) -> None:
        """Nothing."""


class RequestMetrics:
    """ASGI middleware: counts each HTTP request and times it to its response's start, by route template."""

    def __init__(self, app: ASGIApp, metrics: Metrics, routes: Sequence[BaseRoute]) -> None:
        self._app = app
        self._metrics = metrics
        self._routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = time.monotonic()
        route, method = route_template(self._routes, scope), str(scope.get("method", ""))

        async def timed(message: Message) -> None:
            if message["type"] == "http.response.start":
                self._metrics.latency.labels(route, method).observe(time.monotonic() - started)
                self._metrics.requests.labels(route, method, str(message["status"])).inc()
            await send(message)

        await self._app(scope, receive, timed)


def route_template(routes: Sequence[BaseRoute], scope: Scope) -> str:
    """The template of the route a request goes to (`/api/sessions/{id}`): a label that never holds a session id."""
    for route in routes:
        match, _ = route.matches(scope)
        if match != Match.NONE:
            return str(getattr(route, "path", "?"))
    return "(no route)"
