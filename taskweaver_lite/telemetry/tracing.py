"""Tracing: each request one trace, with its model calls, cells and folds as spans, sent over OTLP/HTTP.

The rules, whoever calls:

- Off (`tracing.enabled: false`, the default), nothing of OpenTelemetry is imported and a traced site
  costs one context-variable read: `active()` answers None and the site takes its untraced path.
- A request opens the trace: `turn` (Session.ask: a chat message, an API message, an eval case's
  turn) makes its tracer the active one for everything the request calls, and its span the parent
  of theirs. `serve` opens a server span first that continues the W3C `traceparent` a request carries.
- Work handed to another thread (a fold, serve's request thread) runs in a copy of the handing
  thread's context (`carried`): the same tracer, the same trace. A thread started bare is untraced.
- Model calls follow OpenTelemetry's GenAI conventions (`chat <model>`, `gen_ai.*`), with the role
  that made the call in `taskweaver.role` (`<role> (fold)` for a fold's call). A role's reply is an
  `invoke_agent <alias>` span, a cell a `cell` span, a fold a `fold <role>` span.
- Prompts, replies, code and cell output go into spans only with `tracing.content: true`; otherwise
  spans hold names, sizes, token counts, outcomes and an error's class, never its message.

What a tracer and a span promise is `spans.py`; the OpenTelemetry side (provider, exporter) is `otel.py`, imported on first use.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from taskweaver_lite.errors import ConfigError
from taskweaver_lite.telemetry.spans import NO_SPAN, Attribute, Attributes, Span, Tracer

if TYPE_CHECKING:
    from taskweaver_lite.config.settings import TracingConfig
    from taskweaver_lite.records.events import Folded
    from taskweaver_lite.records.execution import ExecutionResult
    from taskweaver_lite.records.model_calls import Completion, Message

INSTALL_HINT = "pip install 'taskweaver-lite[tracing]'"
FOLD_PURPOSE = "compression_"  # a fold's model calls are made for purpose compression_<role>
PROVIDER = "openai"  # every model is reached over the OpenAI-compatible Chat Completions API

P = ParamSpec("P")
R = TypeVar("R")
_active: contextvars.ContextVar[Tracer | None] = contextvars.ContextVar("taskweaver_lite_tracer", default=None)


def tracer_for(settings: TracingConfig) -> Tracer | None:
    """The tracer `settings` ask for, or None with tracing off; ConfigError when the `tracing` extra is missing."""
    if not settings.enabled:
        return None
    try:
        from taskweaver_lite.telemetry import otel
    except ImportError as exc:
        missing = exc.name or "opentelemetry"
        raise ConfigError(f"tracing.enabled needs the OpenTelemetry SDK ({missing} is not installed): {INSTALL_HINT}, or set tracing.enabled: false") from exc
    return otel.tracer(settings)


def active() -> Tracer | None:
    """The tracer of the request this thread works for, or None (tracing off, or no request)."""
    return _active.get()


def carried(target: Callable[P, R]) -> Callable[P, R]:
    """`target`, to run on another thread in a copy of this thread's context now: in the same request's trace."""
    context = contextvars.copy_context()

    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        # A copy per run: one context cannot be entered by two threads at once (a fold starting the next).
        return context.copy().run(target, *args, **kwargs)

    return run


def turn(tracer: Tracer | None, *, session_id: str, request: str) -> AbstractContextManager[Span]:
    """A request's span, the root of its trace (or the child of the server span that continued a traceparent)."""
    return _NOTHING if tracer is None else _turn(tracer, session_id=session_id, request=request)


@contextmanager
def _turn(tracer: Tracer, *, session_id: str, request: str) -> Iterator[Span]:
    attributes: dict[str, Attribute] = {"taskweaver.session.id": session_id}
    if tracer.content:
        attributes["taskweaver.request"] = request
    token = _active.set(tracer)
    try:
        with tracer.span("turn", attributes=attributes) as span:
            yield span
    finally:
        _active.reset(token)


@contextmanager
def served(tracer: Tracer, *, name: str, headers: Mapping[str, str], attributes: Attributes) -> Iterator[Span]:
    """An HTTP request's server span, continuing the `traceparent` among `headers`; the tracer is active within."""
    token = _active.set(tracer)
    try:
        with tracer.span(name, attributes=attributes, kind="server", carrier=headers) as span:
            yield span
    finally:
        _active.reset(token)


def role_reply(*, alias: str, key: str) -> AbstractContextManager[Span]:
    """A role answering one post of the turn (an agent invocation, in GenAI's words)."""
    tracer = _active.get()
    if tracer is None:
        return _NOTHING
    attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": alias, "taskweaver.role": key}
    return tracer.span(f"invoke_agent {alias}", attributes=attributes)


def role_of(purpose: str) -> str:
    """`taskweaver.role` of a call made for `purpose`: the role's key, or `<role> (fold)` for its folds."""
    return f"{purpose.removeprefix(FOLD_PURPOSE)} (fold)" if purpose.startswith(FOLD_PURPOSE) else purpose


@contextmanager
def model_call(tracer: Tracer, *, purpose: str, model: str, messages: Sequence[Message], max_tokens: int | None) -> Iterator[ModelCall]:
    """A chat call as a GenAI client span; the caller hands the completion to `ModelCall.finished`."""
    attributes: dict[str, Attribute] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.system": PROVIDER,  # the older name of gen_ai.provider.name, which many receivers still read
        "gen_ai.request.model": model,
        "taskweaver.role": role_of(purpose),
    }
    if max_tokens is not None:
        attributes["gen_ai.request.max_tokens"] = max_tokens
    if tracer.content:
        attributes["gen_ai.input.messages"] = _messages_json(messages)
    with tracer.span(f"chat {model}" if model else "chat", attributes=attributes, kind="client") as span:
        yield ModelCall(span, content=tracer.content)


class ModelCall:
    """An open model-call span, told the reply once it is in."""

    def __init__(self, span: Span, *, content: bool) -> None:
        self._span = span
        self._content = content

    def finished(self, completion: Completion) -> None:
        """Record the reply's token counts (cached prompt tokens included), its model and why it stopped."""
        attributes: dict[str, Attribute] = {
            "gen_ai.usage.input_tokens": completion.prompt_tokens,
            "gen_ai.usage.output_tokens": completion.completion_tokens,
            "gen_ai.usage.cache_read.input_tokens": completion.cached_tokens,
        }
        if completion.model:
            attributes["gen_ai.response.model"] = completion.model
        if completion.finish_reason:
            attributes["gen_ai.response.finish_reasons"] = [completion.finish_reason]
        if self._content:
            attributes["gen_ai.output.messages"] = _messages_json([{"role": "assistant", "content": completion.text}])
        self._span.set(attributes)


@contextmanager
def cell(tracer: Tracer, *, session_id: str, code: str) -> Iterator[Cell]:
    """One cell run by the kernel; the caller hands its result to `Cell.finished`."""
    attributes: dict[str, Attribute] = {"taskweaver.session.id": session_id, "taskweaver.cell.lines": code.count("\n") + 1}
    if tracer.content:
        attributes["taskweaver.cell.code"] = code
    with tracer.span("cell", attributes=attributes) as span:
        yield Cell(span, content=tracer.content)


class Cell:
    """An open cell span, told what the cell did."""

    def __init__(self, span: Span, *, content: bool) -> None:
        self._span = span
        self._content = content

    def finished(self, result: ExecutionResult) -> None:
        """Record the outcome: success, the error's class, a time-out, an interrupt, a kernel that died."""
        attributes: dict[str, Attribute] = {"taskweaver.cell.success": result.success}
        if result.execution_count is not None:
            attributes["taskweaver.cell.execution_count"] = result.execution_count
        if result.error is not None:
            attributes["taskweaver.cell.error"] = result.error.name
        flags = {"timed_out": result.timed_out, "interrupted": result.interrupted, "kernel_died": result.kernel_died}
        attributes.update({f"taskweaver.cell.{name}": True for name, value in flags.items() if value})
        if self._content:
            attributes["taskweaver.cell.output"] = "\n".join(part for part in (result.stdout, result.stderr, result.result or "") if part)
            if result.error is not None:
                attributes["taskweaver.cell.error_message"] = result.error.value
        self._span.set(attributes)


def fold(*, role: str, first_round: int, last_round: int) -> AbstractContextManager[Fold]:
    """A fold of a role's rounds into its summary (on the fold's thread, in the context `carried` brought)."""
    tracer = _active.get()
    return _NO_FOLD if tracer is None else _fold(tracer, role=role, first_round=first_round, last_round=last_round)


@contextmanager
def _fold(tracer: Tracer, *, role: str, first_round: int, last_round: int) -> Iterator[Fold]:
    attributes: dict[str, Attribute] = {
        "taskweaver.role": f"{role} (fold)",
        "taskweaver.fold.first_round": first_round,
        "taskweaver.fold.last_round": last_round,
    }
    with tracer.span(f"fold {role}", attributes=attributes) as span:
        yield Fold(span)


class Fold:
    """An open fold span, told how the fold went."""

    def __init__(self, span: Span) -> None:
        self._span = span

    def finished(self, events: Sequence[Folded]) -> None:
        """Record whether every step of the fold landed and the summary's tokens before and after."""
        if not events:
            return
        self._span.set(
            {
                "taskweaver.fold.ok": all(event.ok for event in events),
                "taskweaver.fold.tokens_before": events[0].tokens_before,
                "taskweaver.fold.tokens_after": events[-1].tokens_after,
            }
        )


_NOTHING = nullcontext(NO_SPAN)  # what a site enters when nothing is traced (nullcontext holds no state: one serves all)
_NO_FOLD = nullcontext(Fold(NO_SPAN))


def _messages_json(messages: Sequence[Message]) -> str:
    """Chat messages in the GenAI conventions' shape: a role and text parts, as one JSON string."""
    shaped = [{"role": m["role"], "parts": [{"type": "text", "content": m["content"]}]} for m in messages]
    return json.dumps(shaped, ensure_ascii=False, default=str)
