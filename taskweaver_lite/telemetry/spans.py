"""What a tracer and a span promise (tracing.py opens spans through them; otel.py keeps them with OpenTelemetry).

Attribute values are OpenTelemetry's: text, booleans, numbers and lists of text. A site that traces
nothing holds `NO_SPAN`, which takes attributes and keeps none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Literal, Protocol

Attribute = str | bool | int | float | Sequence[str]
Attributes = Mapping[str, Attribute]
SpanKind = Literal["internal", "client", "server"]


class Span(Protocol):
    """One open span: more attributes as they become known."""

    def set(self, attributes: Attributes) -> None:
        """Add or replace attributes."""
        ...


class Tracer(Protocol):
    """Opens spans in the current trace (otel.py's is the one real tracer)."""

    content: bool  # tracing.content: prompts, replies, code and output may go into spans

    def span(self, name: str, *, attributes: Attributes, kind: SpanKind = "internal", carrier: Mapping[str, str] | None = None) -> AbstractContextManager[Span]:
        """A span, current until the block ends (failed with the error's class if it raises); `carrier`: headers whose traceparent it continues."""
        ...

    def flush(self, timeout: float = 10.0) -> bool:
        """Send the spans still queued; False when `timeout` seconds passed first."""
        ...


class _NoSpan:
    """What a site holds when nothing is traced."""

    def set(self, attributes: Attributes) -> None:
        """Nothing."""


NO_SPAN: Span = _NoSpan()
