"""The OpenTelemetry side of tracing (the `tracing` extra): a provider per receiver, spans, the traceparent.

Imported only when `tracing.enabled` is true (tracing.py's `tracer_for`). A process keeps one
provider per (endpoint, service name), made the first time a session asks for it and shut down at
exit, which sends what is still queued: every session of a server shares its exporter's thread and
connection. Spans leave in batches in the background, so a request never waits for the receiver;
a receiver that is down loses spans, never a request. The provider stays ours (OpenTelemetry's
global one is left to the program that embeds this package).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind as OtelSpanKind
from opentelemetry.trace import Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from taskweaver_lite.config.settings import TracingConfig
from taskweaver_lite.telemetry.spans import Attributes, Span, SpanKind

DEFAULT_SERVICE = "taskweaver-lite"
# Seconds one batch may take to send, retries included (OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT wins): the SDK's 10 s
# would hold a chat's exit that long when the receiver is down, for spans that are lost anyway.
EXPORT_TIMEOUT = 3.0
TIMEOUT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
TRACES_PATH = "/v1/traces"  # OTLP/HTTP's path under a receiver's base URL
_KINDS = {"internal": OtelSpanKind.INTERNAL, "client": OtelSpanKind.CLIENT, "server": OtelSpanKind.SERVER}
_PROPAGATOR = TraceContextTextMapPropagator()
_providers: dict[tuple[str | None, str], TracerProvider] = {}
_providers_lock = threading.Lock()


def tracer(settings: TracingConfig, *, exporter: SpanExporter | None = None) -> OtelTracer:
    """A tracer sending to `settings.endpoint` (null: OTEL_EXPORTER_OTLP_ENDPOINT); `exporter`: another one (tests, benches)."""
    service = settings.service_name or os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE
    if exporter is not None:
        return OtelTracer(_provider(exporter, service=service), content=settings.content)
    with _providers_lock:
        key = (settings.endpoint, service)
        if key not in _providers:
            timeout = None if any(name in os.environ for name in TIMEOUT_VARIABLES) else EXPORT_TIMEOUT
            _providers[key] = _provider(OTLPSpanExporter(endpoint=traces_url(settings.endpoint), timeout=timeout), service=service)
        return OtelTracer(_providers[key], content=settings.content)


def traces_url(endpoint: str | None) -> str | None:
    """The OTLP/HTTP traces address under a base URL (None: the exporter reads OTEL_EXPORTER_OTLP_*ENDPOINT itself)."""
    if endpoint is None:
        return None
    base = endpoint.rstrip("/")
    return base if base.endswith(TRACES_PATH) else base + TRACES_PATH


def _provider(exporter: SpanExporter, *, service: str) -> TracerProvider:
    # A receiver that is down: one line when a batch is given up, not one per retry (they would break into a chat's screen).
    logging.getLogger("opentelemetry.exporter.otlp").setLevel(logging.ERROR)
    # Which replica sent a span: its machine and process (a trace of a session that moved between replicas shows where each part ran).
    instance = f"{socket.gethostname()}:{os.getpid()}"
    resource = Resource.create({"service.name": service, "service.version": _version(), "service.instance.id": instance, "host.name": socket.gethostname()})
    provider = TracerProvider(resource=resource)  # shut down at exit (the SDK's default), which sends the last batch
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _version() -> str:
    try:
        return version("taskweaver-lite")
    except PackageNotFoundError:
        return "unknown"


class OtelTracer:
    """`Tracer` over an OpenTelemetry provider."""

    def __init__(self, provider: TracerProvider, *, content: bool) -> None:
        self.provider = provider
        self.content = content
        self._tracer = provider.get_tracer("taskweaver_lite", _version())

    @contextmanager
    def span(self, name: str, *, attributes: Attributes, kind: SpanKind = "internal", carrier: Mapping[str, str] | None = None) -> Iterator[Span]:
        """A span, current until the block ends; an error marks it failed with its class (its message only with content on)."""
        parent = _PROPAGATOR.extract(carrier) if carrier is not None else None
        with self._tracer.start_as_current_span(
            name, context=parent, kind=_KINDS[kind], attributes=attributes, record_exception=False, set_status_on_exception=False
        ) as span:
            try:
                yield _OtelSpan(span)
            except BaseException as exc:
                span.set_attribute("error.type", type(exc).__qualname__)
                span.set_status(Status(StatusCode.ERROR, str(exc) if self.content else None))
                if self.content:
                    span.record_exception(exc)
                raise

    def flush(self, timeout: float = 10.0) -> bool:
        """Send the spans still queued; False when `timeout` seconds passed first."""
        return bool(self.provider.force_flush(int(timeout * 1000)))


class _OtelSpan:
    """`Span` over an OpenTelemetry span."""

    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def set(self, attributes: Attributes) -> None:
        """Add or replace attributes."""
        self._span.set_attributes(attributes)
