"""A chat completion as real servers send it: the body read against a deadline, then read tolerantly.

The openai SDK trusts a 200 reply: a cut-off body ends in a JSONDecodeError, and a body that drips
in a byte at a time never times out, since its timeout is per read. So the client reads the body
here, against one deadline, and turns it into text, token counts and a finish reason; or into
`BrokenReply` (the server had a bad moment: worth a retry) or `OddReply` (a complete answer that is
not a chat completion we can read: a retry would get the same).

A streamed completion (`read_stream`) is read the same way, event by event: each piece of text
goes to a sink as it arrives (reasoning apart from the reply), and a stream that ends before its
finish reason or `[DONE]` is a `BrokenReply`, so it is retried whole. A server that ignores
`stream` and sends one JSON body is read as if we had not asked.

Servers differ in what they send: `content` as a list of text parts, `usage` numbers as strings,
or no `usage` at all. Those are read, not refused.
"""

from __future__ import annotations

import email.utils
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Piece = Literal["content", "reasoning"]
PieceSink = Callable[[Piece, str], None]

# A chat reply is kilobytes; a body past this is a broken or hostile server, not a long answer.
MAX_BODY_BYTES = 64 * 2**20
_PREVIEW_CHARS = 40


class BrokenReply(Exception):
    """The body broke off, came too slowly, or is not JSON: a server failure worth retrying."""

    def __init__(self, reason: str, *, timed_out: bool = False) -> None:
        super().__init__(reason)
        self.timed_out = timed_out


class OddReply(Exception):
    """A complete body that is not a chat completion this client can read: retrying will not help."""


@dataclass(frozen=True)
class ReplyFields:
    """What a chat completion says: the text, the token counts the server reported, why it stopped."""

    text: str
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str | None
    cached_tokens: int = 0  # prompt tokens the server reused from its cache (0 when it does not say)
    llama_timings: bool = False  # the reply carried llama.cpp's `timings`: the server is llama.cpp's


def read_body(chunks: Iterable[bytes], *, deadline: float, limit: int = MAX_BODY_BYTES) -> bytes:
    """The whole body from `chunks`; BrokenReply once `deadline` (time.monotonic) passes or it breaks off."""
    body = bytearray()
    try:
        for chunk in chunks:
            body += chunk
            if len(body) > limit:
                raise BrokenReply(f"sent a reply body over {limit // 2**20} MB")
            if time.monotonic() > deadline:
                raise BrokenReply(f"was still sending its reply at the deadline ({len(body):,} bytes so far)", timed_out=True)
    except BrokenReply:
        raise
    except Exception as exc:  # httpx or httpx2 by SDK version: no common base class to name
        raise BrokenReply(f"broke off its reply after {len(body):,} bytes ({type(exc).__name__})") from exc
    return bytes(body)


def read_completion(body: bytes) -> ReplyFields:
    """The fields of a chat completion body; BrokenReply if it is not JSON, OddReply if not a completion."""
    try:
        data = json.loads(body)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both
        raise _not_json(body) from None
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices:
        raise OddReply(f"did not answer with a chat completion{_error_in(data)}")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise OddReply("answered with a chat completion whose first choice has no message")
    usage = data.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    finish_reason = choice.get("finish_reason")
    return ReplyFields(
        text=_content_text(message.get("content")),
        prompt_tokens=_token_count(usage.get("prompt_tokens")),
        completion_tokens=_token_count(usage.get("completion_tokens")),
        finish_reason=finish_reason if isinstance(finish_reason, str) else None,
        cached_tokens=cached_tokens(usage, data.get("timings")),
        llama_timings=isinstance(data.get("timings"), dict),
    )


def read_stream(chunks: Iterable[bytes], *, deadline: float, on_piece: PieceSink, limit: int = MAX_BODY_BYTES) -> ReplyFields:
    """The fields of a streamed chat completion (server-sent events), each text piece sent to `on_piece` as it comes."""
    stream = _StreamState(on_piece)
    buffer = b""
    try:
        for chunk in chunks:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                stream.line(line)
            if stream.size + len(buffer) > limit:
                raise BrokenReply(f"sent a streamed reply over {limit // 2**20} MB")
            if time.monotonic() > deadline:
                raise BrokenReply(f"was still streaming its reply at the deadline ({stream.size:,} bytes so far)", timed_out=True)
    except (BrokenReply, OddReply):
        raise
    except Exception as exc:  # httpx's errors by SDK version: no common base class to name
        raise BrokenReply(f"broke off its streamed reply after {stream.characters:,} characters ({type(exc).__name__})") from exc
    stream.line(buffer)
    return stream.fields()


class _StreamState:
    """What a stream has said so far: text, finish reason, usage, and whether it ended properly."""

    def __init__(self, on_piece: PieceSink) -> None:
        self._on_piece = on_piece
        self._text: list[str] = []
        self._finish: str | None = None
        self._usage: dict[str, Any] = {}
        self._timings: Any = None
        self._done = False
        self._events = 0
        self.size = 0

    def line(self, raw: bytes) -> None:
        """One line of the event stream: only `data:` lines carry anything."""
        self.size += len(raw) + 1
        line = raw.strip()
        if not line.startswith(b"data:"):
            return  # blank separators, comments (': keep-alive'), `event:` names
        data = line[5:].strip()
        if data == b"[DONE]":
            self._done = True
            return
        try:
            event = json.loads(data)
        except ValueError:
            raise BrokenReply(f"sent a stream event that is not JSON: {data[:_PREVIEW_CHARS]!r}") from None
        self._events += 1
        self._event(event)

    def _event(self, event: Any) -> None:
        if not isinstance(event, dict):
            raise OddReply("streamed an event that is not a chat completion chunk")
        if "error" in event:  # some servers report a failure mid-stream as an event
            raise BrokenReply(f"reported an error in the middle of its streamed reply{_error_in(event)}")
        usage = event.get("usage")
        if isinstance(usage, dict):
            self._usage = usage
        if isinstance(event.get("timings"), dict):
            self._timings = event["timings"]
        choices = event.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        delta = choice.get("delta")
        if isinstance(delta, dict):
            self._delta(delta)
        finish = choice.get("finish_reason")
        if isinstance(finish, str):
            self._finish = finish

    def _delta(self, delta: dict[str, Any]) -> None:
        # vLLM and DeepSeek send `reasoning_content`, Ollama and OpenRouter `reasoning`: never the reply.
        for key in ("reasoning_content", "reasoning"):
            thought = delta.get(key)
            if isinstance(thought, str) and thought:
                self._on_piece("reasoning", thought)
        content = delta.get("content")
        text = _content_text(content) if content is not None else ""
        if text:
            self._text.append(text)
            self._on_piece("content", text)

    @property
    def characters(self) -> int:
        """Characters of the reply's content received so far."""
        return sum(map(len, self._text))

    def fields(self) -> ReplyFields:
        """The whole reply; BrokenReply when the stream stopped before saying it was done."""
        if self._events == 0:
            raise BrokenReply("ended its streamed reply before sending any event")
        if not self._done and self._finish is None:
            raise BrokenReply(f"broke off its streamed reply after {self.characters:,} characters")
        return ReplyFields(
            text="".join(self._text),
            prompt_tokens=_token_count(self._usage.get("prompt_tokens")),
            completion_tokens=_token_count(self._usage.get("completion_tokens")),
            finish_reason=self._finish,
            cached_tokens=cached_tokens(self._usage, self._timings),
            llama_timings=self._timings is not None,
        )


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the server asks to wait before the next request (`retry-after-ms`, `Retry-After`), if it says."""
    millis = _number(headers.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _number(value)
    if seconds is not None:
        return seconds
    try:  # the other form the standard allows: an HTTP date
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, IndexError):
        return None


def _not_json(body: bytes) -> Exception:
    start = body.lstrip()[:1]
    if start == b"<":  # a web page: api_base points at a site, not an API
        return OddReply("answered with a web page, not a chat completion")
    preview = body[:_PREVIEW_CHARS].decode("utf-8", "replace")
    cut = " (cut off?)" if start in (b"{", b"[") else ""
    return BrokenReply(f"sent a reply that is not valid JSON{cut}: {len(body):,} bytes starting {preview!r}")


def _error_in(data: Any) -> str:
    """A server error sent inside a 200 reply, as a short suffix for the message."""
    error = data.get("error") if isinstance(data, dict) else None
    detail = error.get("message") if isinstance(error, dict) else error
    if not isinstance(detail, str) or not detail.strip():
        return ""
    flat = " ".join(detail.split())
    return f" (it said: {flat[:200]})"


def _content_text(content: Any) -> str:
    """Message content as text: a string, a list of text parts (joined), or nothing (a refusal, a tool call)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = (part.get("text") if isinstance(part, dict) else part for part in content)
        return "".join(part for part in parts if isinstance(part, str))
    raise OddReply(f"answered with message content that is {type(content).__name__}, not text")


def cached_tokens(usage: dict[str, Any], timings: Any) -> int:
    """Prompt tokens the server took from its cache: OpenAI's `usage.prompt_tokens_details.cached_tokens`
    (vLLM and SGLang send it too), else llama.cpp's `timings.cache_n`; 0 when neither says."""
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and (count := _token_count(details.get("cached_tokens"))) is not None:
        return count
    if isinstance(timings, dict) and (count := _token_count(timings.get("cache_n"))) is not None:
        return count
    return 0


def _token_count(value: Any) -> int | None:
    """A usage number as servers send it (int, float, numeric string); None when absent or unreadable."""
    if isinstance(value, bool):
        return None
    number = _number(value) if isinstance(value, str) else value
    if isinstance(number, (int, float)) and math.isfinite(number) and number >= 0:
        return int(number)
    return None


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None
