"""An OTLP/HTTP trace receiver on 127.0.0.1 for tests and benches: it keeps every span it is sent, decoded.

It takes what OpenTelemetry's exporter sends to `<url>/v1/traces` (protobuf, gzip or not), answers
as a collector does, and keeps the raw bodies too, so a test can say that a text went nowhere on the
wire. The tests that read spans back from a receiver nobody here wrote use Arize Phoenix instead
(tests/test_tracing_phoenix.py); this one is for the quick tier and for `bench/turn_bench.py`.
Needs the `tracing` extra (opentelemetry-proto comes with its exporter).
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

TRACES_PATH = "/v1/traces"


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as it arrived: ids in hex, attributes decoded to Python values."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root
    kind: int  # OTLP's SpanKind number: 1 internal, 2 server, 3 client
    attributes: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error
    service: str
    resource: dict[str, Any] = field(default_factory=dict)  # the sending process's attributes (service.instance.id...)


class OtlpReceiver:
    """`with OtlpReceiver() as receiver:` spans sent to `receiver.url` land in `receiver.spans`."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.bodies: list[bytes] = []  # each request's body as it came (decompressed)
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self._receive))
        # A short poll keeps the stop quick: shutdown waits for the loop's next look at its flag (half a second by default).
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="otlp-receiver", daemon=True)

    @property
    def url(self) -> str:
        """The base address to give `tracing.endpoint`."""
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def wait_for(self, name: str, *, timeout: float = 15.0) -> list[ReceivedSpan]:
        """The spans received once one named `name` is among them; AssertionError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if any(span.name == name for span in self.spans):
                    return list(self.spans)
            time.sleep(0.05)
        raise AssertionError(f"no span named {name!r} reached the receiver in {timeout:g} s; got {[s.name for s in self.spans]}")

    def _receive(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans = []
        for resource_spans in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                spans += [
                    ReceivedSpan(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        kind=span.kind,
                        attributes={kv.key: _value(kv.value) for kv in span.attributes},
                        status_code=span.status.code,
                        service=str(resource.get("service.name", "")),
                        resource=resource,
                    )
                    for span in scope_spans.spans
                ]
        with self._lock:
            self.bodies.append(body)
            self.spans.extend(spans)


def _value(value: AnyValue) -> Any:
    """An OTLP attribute value as Python: str, bool, int, float or a list of them."""
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, which) if which else None


def _handler(receive: Callable[[bytes], None]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != TRACES_PATH:
                self.send_error(404)
                return
            receive(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: a test's output is its own."""

    return Handler
