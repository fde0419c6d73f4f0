"""The chat-model seam: `ChatModel.complete(messages) -> Completion`, and the openai-SDK client.

Roles and compression only see `ChatModel`; `OpenAIChatModel` is the real one. It keeps a
`CallRecord` of every call (tokens, latency, outcome) and turns each SDK failure into one
`LLMError` subclass whose message names the host or model and the setting that fixes it.
Reading the JSON inside replies is `replies.py`'s job.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypedDict
from urllib.parse import urlsplit

from taskweaver_lite.errors import (
    LLMAuthError,
    LLMContextTooLongError,
    LLMError,
    LLMModelNotFoundError,
    LLMRateLimitError,
    LLMUnreachableError,
    TaskWeaverError,
)

if TYPE_CHECKING:
    from taskweaver_lite.config import LLMConfig


class Message(TypedDict):
    """One chat message as the Chat Completions API takes it."""

    role: Literal["system", "user", "assistant"]
    content: str


@dataclass(frozen=True)
class Completion:
    """A model's reply and what it cost."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    latency: float
    finish_reason: str | None = None
    usage_reported: bool = True  # False when the endpoint sent no usage numbers (the counts are 0, not measured)


class ChatModel(Protocol):
    """Anything that answers a list of chat messages with text."""

    def complete(self, messages: Sequence[Message], *, purpose: str, max_tokens: int | None = None) -> Completion:
        """Answer `messages` in at most `max_tokens` tokens (default: llm.reply_reserve).

        `purpose` names the caller: planner, code_generator, compression_planner, compression_code_generator.
        """
        ...


@dataclass(frozen=True)
class CallRecord:
    """One model call as it happened: what was sent, what came back, what it cost."""

    purpose: str
    prompt_tokens: int
    completion_tokens: int
    latency: float
    ok: bool
    error: str | None
    messages: tuple[Message, ...]
    reply: str | None
    # False when the endpoint sent no usage numbers, so the token counts above are 0, not measured.
    usage_reported: bool = True


@dataclass(frozen=True)
class Usage:
    """Model calls and their tokens, summed: the one usage figure (session, /info, store)."""

    calls: int = 0
    failed_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls_without_usage: int = 0

    @property
    def total_tokens(self) -> int:
        """Prompt and completion tokens together."""
        return self.prompt_tokens + self.completion_tokens

    def plus(self, completion: Completion | None) -> Usage:
        """These totals with one more call: its completion, or None for a failed call."""
        if completion is None:
            return replace(self, calls=self.calls + 1, failed_calls=self.failed_calls + 1)
        return Usage(
            calls=self.calls + 1,
            failed_calls=self.failed_calls,
            prompt_tokens=self.prompt_tokens + completion.prompt_tokens,
            completion_tokens=self.completion_tokens + completion.completion_tokens,
            calls_without_usage=self.calls_without_usage + (not completion.usage_reported),
        )


class MeteredModel:
    """Any `ChatModel`, metered: sums usage and reports every call (ok or failed) to `on_call`.

    The one place usage is counted. Safe to call from several threads (the roles and the folds).
    """

    def __init__(self, inner: ChatModel, *, on_call: Callable[[CallRecord], None] | None = None, usage: Usage = Usage()) -> None:
        self.inner = inner
        self._on_call = on_call
        self._lock = threading.Lock()
        self._usage = usage

    def complete(self, messages: Sequence[Message], *, purpose: str, max_tokens: int | None = None) -> Completion:
        """Forward to the inner model, then count the call."""
        started = time.perf_counter()
        try:
            completion = self.inner.complete(messages, purpose=purpose, max_tokens=max_tokens)
        except TaskWeaverError as exc:
            failed = CallRecord(
                purpose, 0, 0, time.perf_counter() - started, ok=False, error=str(exc), messages=tuple(messages), reply=None, usage_reported=False
            )
            self._count(None, failed)
            raise
        record = CallRecord(
            purpose,
            completion.prompt_tokens,
            completion.completion_tokens,
            completion.latency,
            ok=True,
            error=None,
            messages=tuple(messages),
            reply=completion.text,
            usage_reported=completion.usage_reported,
        )
        self._count(completion, record)
        return completion

    def usage(self) -> Usage:
        """Totals so far."""
        with self._lock:
            return self._usage

    def _count(self, completion: Completion | None, record: CallRecord) -> None:
        with self._lock:
            self._usage = self._usage.plus(completion)
        if self._on_call is not None:
            self._on_call(record)


class OpenAIChatModel:
    """`ChatModel` over the openai SDK: its retries and timeouts, one clear error per failure.

    Safe to call from several threads at once. It counts nothing itself: wrap it in `MeteredModel`.
    """

    def __init__(self, config: LLMConfig) -> None:
        import openai  # here, not at module level: it costs ~0.4 s and `--help` must not pay it

        self._config = config
        base_url = config.api_base or os.environ.get("OPENAI_BASE_URL") or None
        self.base_url = (base_url or _OPENAI_BASE_URL).rstrip("/")
        self.host = urlsplit(self.base_url).netloc or self.base_url
        key = (config.api_key.get_secret_value() if config.api_key is not None else "") or os.environ.get(
            "OPENAI_API_KEY", ""
        )
        if not key:
            if self.host == urlsplit(_OPENAI_BASE_URL).netloc:
                raise LLMAuthError(
                    f"no API key for {self.base_url}: set llm.api_key in taskweaver_config.yaml "
                    "or the OPENAI_API_KEY environment variable"
                )
            key = _LOCAL_SERVER_KEY  # Ollama, vLLM, LM Studio... accept any key
        self._key = key
        self._client = openai.OpenAI(
            api_key=key,
            base_url=self.base_url,
            timeout=config.timeout,
            max_retries=config.max_retries,
        )

    def complete(self, messages: Sequence[Message], *, purpose: str, max_tokens: int | None = None) -> Completion:
        """Send one Chat Completions request; raise an `LLMError` subclass when it fails."""
        import openai
        from openai.types.chat import ChatCompletion

        # max_tokens enforces the room the prompt budget left free for the answer (reply_reserve for
        # the roles; a fold asks for less, sized to its summary, and its prompt may use the rest).
        limit = self._config.reply_reserve if max_tokens is None else max_tokens
        request: dict[str, Any] = {"model": self._config.model, "messages": list(messages), "max_tokens": limit}
        if self._config.json_mode:
            request["response_format"] = {"type": "json_object"}
        started = time.perf_counter()
        try:
            # `post` rather than `chat.completions.create`: the same request, retries and errors, but
            # without the SDK re-walking every message as a TypedDict (milliseconds per call on long prompts).
            response = self._client.post("/chat/completions", body=request, cast_to=ChatCompletion)
        except openai.OpenAIError as exc:
            raise self._translate(exc) from exc
        latency = time.perf_counter() - started
        choices = getattr(response, "choices", None)
        if not choices:
            # A wrong api_base often lands on a web page or another API that answers 200.
            raise LLMError(
                f"{self.base_url} did not answer with a chat completion; check llm.api_base (for most servers it ends in /v1)"
            )
        text = choices[0].message.content or ""
        usage = response.usage
        return Completion(
            text=text,
            prompt_tokens=usage.prompt_tokens if usage is not None else 0,
            completion_tokens=usage.completion_tokens if usage is not None else 0,
            latency=latency,
            finish_reason=choices[0].finish_reason,
            usage_reported=usage is not None,
        )

    def close(self) -> None:
        """Release the HTTP connections."""
        self._client.close()

    def _translate(self, exc: Exception) -> LLMError:
        """One message per failure, naming the host or model and the setting that fixes it."""
        import openai

        model = self._config.model
        retries = self._config.max_retries
        retried = f"after {retries} {'retry' if retries == 1 else 'retries'}" if retries else "with retries off"
        if isinstance(exc, openai.APITimeoutError):
            return LLMUnreachableError(
                f"the model endpoint at {self.host} did not answer within {self._config.timeout:g} s ({retried}); "
                "check the server, or raise llm.timeout"
            )
        if isinstance(exc, openai.APIConnectionError):
            return LLMUnreachableError(
                f"cannot reach the model endpoint at {self.host} ({_cause(exc)}, {retried}); "
                "check llm.api_base or OPENAI_BASE_URL and that the server is running"
            )
        if not isinstance(exc, openai.APIStatusError):
            return LLMError(f"the call to {self.host} failed: {self._scrub(str(exc))}")
        detail = self._scrub(_server_message(exc))
        if isinstance(exc, (openai.AuthenticationError, openai.PermissionDeniedError)):
            return LLMAuthError(f"the API key was refused by {self.host}; check llm.api_key or OPENAI_API_KEY")
        if isinstance(exc, openai.NotFoundError):
            if "model" in detail.lower() or exc.code == "model_not_found":
                return LLMModelNotFoundError(
                    f"the model '{model}' is not served by {self.host} ({detail}); check llm.model"
                )
            return LLMError(
                f"{self.base_url}/chat/completions was not found on {self.host} (HTTP 404: {detail}); "
                "check llm.api_base (for most servers it ends in /v1)"
            )
        if isinstance(exc, openai.RateLimitError):
            if exc.code == "insufficient_quota":
                return LLMRateLimitError(f"the account behind the API key has no quota left at {self.host} ({detail})")
            return LLMRateLimitError(
                f"{self.host} kept answering 'rate limited' (HTTP 429, {retried}): {detail}; "
                "wait a moment and try again, or raise llm.max_retries"
            )
        lowered = detail.lower()
        if exc.status_code in (400, 413, 422) and any(words in lowered for words in _CONTEXT_WORDS):
            return LLMContextTooLongError(
                f"the prompt is longer than model '{model}' accepts at {self.host} ({detail}); "
                "set llm.context_window to the model's real context size so prompts are compressed to fit"
            )
        if exc.status_code in (400, 422) and "response_format" in lowered:
            return LLMError(
                f"{self.host} does not accept response_format=json_object for model '{model}' ({detail}); "
                "run with --set llm.json_mode=false (or set llm.json_mode: false in taskweaver_config.yaml)"
            )
        return LLMError(f"the model endpoint at {self.host} answered HTTP {exc.status_code}: {detail}")

    def _scrub(self, text: str) -> str:
        """Servers sometimes echo the key back; it must never reach the screen or a log."""
        if len(self._key) < _MIN_SCRUBBED_KEY or self._key == _LOCAL_SERVER_KEY:
            return text  # too short to mask without garbling ordinary words
        return text.replace(self._key, "***")


_OPENAI_BASE_URL = "https://api.openai.com/v1"
_LOCAL_SERVER_KEY = "not-needed"
_MIN_SCRUBBED_KEY = 6
_CONTEXT_WORDS = (
    "context length",
    "context_length",
    "context window",
    "maximum context",
    "too many tokens",
    "prompt is too long",
    "input is too long",
    "exceeds the model",
)
_DETAIL_CHARS = 300


def _server_message(exc: Any) -> str:
    body = exc.body
    message = body.get("message") if isinstance(body, dict) else None
    if not isinstance(message, str) or not message.strip():
        message = body if isinstance(body, str) and body.strip() else exc.message
    flat = " ".join(str(message).split())
    return flat[:_DETAIL_CHARS] + ("..." if len(flat) > _DETAIL_CHARS else "")


def _cause(exc: BaseException) -> str:
    """The innermost reason for a connection failure, in a few words."""
    inner: BaseException = exc
    while inner.__cause__ is not None:
        inner = inner.__cause__
    text = str(inner).lower()
    if "refused" in text:
        return "connection refused"
    if "name or service" in text or "nodename" in text or "getaddrinfo" in text:
        return "unknown host name"
    return " ".join(str(inner).split())[:120] or type(inner).__name__
