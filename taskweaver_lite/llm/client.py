"""The chat-model seam: `ChatModel.complete(messages) -> Completion`, and the openai-SDK client.

Roles and compression only see `ChatModel`; `OpenAIChatModel` is the real one. It keeps a
`CallRecord` of every call (tokens, latency, outcome) and turns each SDK failure into one
`LLMError` subclass whose message names the host or model and the setting that fixes it.
The retries are its own (the SDK's are off), so a broken reply body is retried like an HTTP 500,
a server's `Retry-After` is honoured or refused by our rule, and messages count the real requests.
Credentials inside `llm.api_base` never reach a message. With `llm.stream` each request streams,
and the text reaches the caller's `on_delta` as it arrives: a `start` delta opens every request
(a retry's included, so what was shown of a broken stream is known to be void), then `content` and
`reasoning` pieces; reasoning never becomes part of the reply's text. A call that reads JSON names its
schema, which `llm.structured` turns into the request's `response_format` (`structured.py`, stepping
down for the session when the endpoint refuses it). Reading the JSON inside replies is `replies.py`'s
job; reading the completion around it, `completions.py`'s.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from taskweaver_lite.errors import (
    LLMAuthError,
    LLMContextTooLongError,
    LLMError,
    LLMModelNotFoundError,
    LLMRateLimitError,
    LLMUnreachableError,
    TaskWeaverError,
)
from taskweaver_lite.llm.completions import BrokenReply, OddReply, Piece, PieceSink, ReplyFields, read_body, read_completion, read_stream, retry_after
from taskweaver_lite.llm.counting import ModelTokenizer, RatioBook, ServerTokens, model_tokenizer
from taskweaver_lite.llm.prompt_cache import PromptCache, read_props
from taskweaver_lite.llm.replies import ReplySchema
from taskweaver_lite.llm.structured import ResponseFormat, refusal_names_it
from taskweaver_lite.llm.tokens import Tokenizer
from taskweaver_lite.records.model_calls import CallRecord, Completion, Delta, Message, Usage
from taskweaver_lite.telemetry import tracing

if TYPE_CHECKING:
    from taskweaver_lite.config.settings import LLMConfig


DeltaSink = Callable[[Delta], None]


class ChatModel(Protocol):
    """Anything that answers a list of chat messages with text, and says what else it can do.

    Besides `complete`, every model declares its optional abilities: a model that keys a prompt cache
    takes the session and the sharing of its keys (`scope_cache`, `share_cache`), one that knows the
    name it asks for says it (`model_name`), one that holds connections releases them (`close`). A
    model without them inherits `ModelDefaults`; a model that wraps another passes each on.
    """

    def complete(
        self, messages: Sequence[Message], *, purpose: str, max_tokens: int | None = None, on_delta: DeltaSink | None = None, schema: ReplySchema | None = None
    ) -> Completion:
        """Answer `messages` in at most `max_tokens` tokens (default: llm.reply_reserve).

        `purpose` names the caller: planner, code_generator, compression_planner, compression_code_generator.
        A model that streams sends the reply's pieces to `on_delta` as they come; others may never call it.
        `schema` is the JSON object the caller reads the reply as (None: prose); a model that can
        constrain its replies to it does (`llm.structured`), others may ignore it.
        """
        ...

    def model_name(self, purpose: str) -> str:
        """The model name calls for `purpose` ask for ('' when it cannot say: a scripted model)."""
        ...

    def scope_cache(self, name: str) -> None:
        """The session the calls that follow belong to (a model that keys no prompt cache ignores it)."""
        ...

    def share_cache(self, purpose: str, owner: str) -> None:
        """Send `purpose`'s calls to `owner`'s cache key or slot (a fold that opens with its role's prompt)."""
        ...

    def close(self) -> None:
        """Release what the model holds (its HTTP connections)."""
        ...

    def tokenizer(self, purpose: str) -> Tokenizer | None:
        """What counts prompts for `purpose` in the model's own tokens (None: `llm.tokenizer`, offline, as the model counts)."""
        ...


class ModelDefaults:
    """The optional abilities of a model that has none: no prompt cache to key, no model name to say, nothing to close."""

    def model_name(self, purpose: str) -> str:
        """'': this model cannot say."""
        return ""

    def scope_cache(self, name: str) -> None:
        """Nothing to key."""

    def share_cache(self, purpose: str, owner: str) -> None:
        """Nothing to share."""

    def close(self) -> None:
        """Nothing to release."""

    def tokenizer(self, purpose: str) -> Tokenizer | None:
        """None: this model counts as `llm.tokenizer` does."""
        return None


class RoutedModel:
    """One `ChatModel` made of several: each call goes to the model for its purpose (a model per role)."""

    def __init__(self, by_purpose: Mapping[str, ChatModel], *, default: ChatModel) -> None:
        self._by_purpose = dict(by_purpose)
        self._default = default

    def route(self, purpose: str) -> ChatModel:
        """The model that answers calls for `purpose`."""
        return self._by_purpose.get(purpose, self._default)

    def model_name(self, purpose: str) -> str:
        """The model name calls for `purpose` ask for."""
        return self.route(purpose).model_name(purpose)

    def complete(
        self, messages: Sequence[Message], *, purpose: str, max_tokens: int | None = None, on_delta: DeltaSink | None = None, schema: ReplySchema | None = None
    ) -> Completion:
        """Forward to the model for `purpose`."""
        return self.route(purpose).complete(messages, purpose=purpose, max_tokens=max_tokens, on_delta=on_delta, schema=schema)

    def scope_cache(self, name: str) -> None:
        """Name the session for every distinct model."""
        for model in self._distinct():
            model.scope_cache(name)

    def share_cache(self, purpose: str, owner: str) -> None:
        """Send `purpose`'s calls to `owner`'s cache key or slot, in every distinct model."""
        for model in self._distinct():
            model.share_cache(purpose, owner)

    def tokenizer(self, purpose: str) -> Tokenizer | None:
        """The tokenizer of the model for `purpose`."""
        return self.route(purpose).tokenizer(purpose)

    def close(self) -> None:
        """Close every distinct model."""
        for model in self._distinct():
            model.close()

    def _distinct(self) -> list[ChatModel]:
        """Each model once, though it answers several purposes."""
        return list({id(m): m for m in (*self._by_purpose.values(), self._default)}.values())


def usage_by_purpose(by_model: Mapping[tuple[str, str], Usage]) -> dict[str, Usage]:
    """`MeteredModel.usage_by_model` summed over models: one figure per role and per role's folds."""
    summed: dict[str, Usage] = {}
    for (purpose, _), part in by_model.items():
        before = summed.get(purpose, Usage())
        summed[purpose] = Usage(
            calls=before.calls + part.calls,
            failed_calls=before.failed_calls + part.failed_calls,
            prompt_tokens=before.prompt_tokens + part.prompt_tokens,
            completion_tokens=before.completion_tokens + part.completion_tokens,
            calls_without_usage=before.calls_without_usage + part.calls_without_usage,
            cached_tokens=before.cached_tokens + part.cached_tokens,
        )
    return summed


class MeteredModel:
    """Any `ChatModel`, metered: sums usage and reports every call (ok or failed) to `on_call`.

    The one place usage is counted, in all and per purpose and model (for /info). Safe to call from
    several threads (the roles and the folds).
    """

    def __init__(self, inner: ChatModel, *, on_call: Callable[[CallRecord], None] | None = None, usage: Usage = Usage()) -> None:
        self.inner = inner
        self._on_call = on_call
        self._lock = threading.Lock()
        self._usage = usage
        self._by_model: dict[tuple[str, str], Usage] = {}

    def complete(
        self, messages: Sequence[Message], *, purpose: str, max_tokens: int | None = None, on_delta: DeltaSink | None = None, schema: ReplySchema | None = None
    ) -> Completion:
        """Forward to the inner model, then count the call; within a traced request, the call is a GenAI span."""
        tracer = tracing.active()
        if tracer is None:
            return self._metered(messages, purpose=purpose, max_tokens=max_tokens, on_delta=on_delta, schema=schema)
        model = self.inner.model_name(purpose)
        with tracing.model_call(tracer, purpose=purpose, model=model, messages=messages, max_tokens=max_tokens) as call:
            completion = self._metered(messages, purpose=purpose, max_tokens=max_tokens, on_delta=on_delta, schema=schema)
            call.finished(completion)
        return completion

    def _metered(
        self, messages: Sequence[Message], *, purpose: str, max_tokens: int | None, on_delta: DeltaSink | None, schema: ReplySchema | None
    ) -> Completion:
        started = time.perf_counter()
        try:
            completion = self.inner.complete(messages, purpose=purpose, max_tokens=max_tokens, on_delta=on_delta, schema=schema)
        except TaskWeaverError as exc:
            failed = CallRecord(
                purpose,
                0,
                0,
                time.perf_counter() - started,
                ok=False,
                error=str(exc),
                messages=tuple(messages),
                reply=None,
                usage_reported=False,
                model=self.inner.model_name(purpose),
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
            model=completion.model or self.inner.model_name(purpose),
            cached_tokens=completion.cached_tokens,
        )
        self._count(completion, record)
        return completion

    def model_name(self, purpose: str) -> str:
        """The inner model's."""
        return self.inner.model_name(purpose)

    def scope_cache(self, name: str) -> None:
        """Pass on to the inner model."""
        self.inner.scope_cache(name)

    def share_cache(self, purpose: str, owner: str) -> None:
        """Pass on to the inner model."""
        self.inner.share_cache(purpose, owner)

    def close(self) -> None:
        """Close the inner model."""
        self.inner.close()

    def tokenizer(self, purpose: str) -> Tokenizer | None:
        """The inner model's."""
        return self.inner.tokenizer(purpose)

    def usage(self) -> Usage:
        """Totals so far."""
        with self._lock:
            return self._usage

    def count_from(self, usage: Usage) -> None:
        """Take `usage` as the totals so far (what the store counted, with calls made elsewhere); the per-model sums stay this process's."""
        with self._lock:
            self._usage = usage

    def usage_by_model(self) -> dict[tuple[str, str], Usage]:
        """This process's calls summed per (purpose, model name), in the order first seen."""
        with self._lock:
            return dict(self._by_model)

    def _count(self, completion: Completion | None, record: CallRecord) -> None:
        with self._lock:
            self._usage = self._usage.plus(completion)
            key = (record.purpose, record.model)
            self._by_model[key] = self._by_model.get(key, Usage()).plus(completion)
        if self._on_call is not None:
            self._on_call(record)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """The process's one TLS context: loading the system's certificates costs tens of milliseconds of CPU,
    and a server resumes sessions (and makes their clients) all day."""
    return ssl.create_default_context()


@functools.cache
def _http_client_type() -> Any:
    """The SDK's default HTTP client that closes its connections when dropped unclosed, as the SDK's own does."""
    import openai

    class Client(openai.DefaultHttpxClient):
        def __del__(self) -> None:
            with contextlib.suppress(Exception):
                if not self.is_closed:
                    self.close()

    return Client


@dataclass(frozen=True)
class SettingHints:
    """Where the user sets what a failed call points at, as its message names it (a JSON project names its file and variables)."""

    api_key: str = "llm.api_key in taskweaver_config.yaml or the OPENAI_API_KEY environment variable"
    api_base: str = "llm.api_base or OPENAI_BASE_URL"
    model: str = "llm.model"


class OpenAIChatModel:
    """`ChatModel` over the openai SDK: retries, an overall deadline per request, one clear error per failure.

    Safe to call from several threads at once. It counts nothing itself: wrap it in `MeteredModel`.
    """

    def __init__(self, config: LLMConfig, *, hints: SettingHints | None = None, ratios: RatioBook | None = None) -> None:
        """`hints` name where each setting a failure points at is set (default: a YAML project's keys);
        `ratios`: where the token ratios measured for models are kept across sessions."""
        import openai  # here, not at module level: it costs ~0.4 s and `--help` must not pay it

        self._config = config
        self._hints = hints = hints or SettingHints()
        self._base_url = base_url = (config.api_base or os.environ.get("OPENAI_BASE_URL") or _OPENAI_BASE_URL).rstrip("/")
        self.url = redact_url(base_url)  # the only form of the address that may reach a message
        self.host = urlsplit(self.url).netloc.rpartition("@")[2] or self.url
        key = (config.api_key.get_secret_value() if config.api_key is not None else "") or os.environ.get("OPENAI_API_KEY", "")
        if not key:
            if self.host == urlsplit(_OPENAI_BASE_URL).netloc:
                raise LLMAuthError(f"no API key for {self.url}: set {hints.api_key}")
            key = _LOCAL_SERVER_KEY  # Ollama, vLLM, LM Studio... accept any key
        self._secrets = tuple(secret for secret in (key, *url_secrets(base_url)) if len(secret) >= _MIN_SCRUBBED_KEY and secret != _LOCAL_SERVER_KEY)
        # What calls that read JSON ask for; under `auto` it steps down for this client's life (the session) when refused.
        self.response_format = ResponseFormat(config.structured)
        self.prompt_cache = PromptCache(
            mode=config.prompt_cache, kind=config.server_kind, api_base=base_url, props=lambda api_base: read_props(api_base, api_key=key)
        )
        self._key = key
        known = config.server_kind if config.server_kind in ("llama.cpp", "vllm") else None
        self.counter = model_tokenizer(
            tokenizer=config.tokenizer,
            api_base=self.url,
            model=config.model,
            server_kind=config.server_kind,
            counting=config.token_counting,
            server=self._server_tokens(known) if known else None,
            book=ratios,
            probe=self._probe_server if config.server_kind == "auto" else None,
        )
        self._client = openai.OpenAI(
            api_key=key,
            base_url=base_url,
            timeout=config.timeout,
            max_retries=0,  # ours, in `complete`: the SDK's cannot retry a broken body or count requests for us
            http_client=_http_client_type()(verify=_tls_context()),
        )

    def complete(
        self, messages: Sequence[Message], *, purpose: str, max_tokens: int | None = None, on_delta: DeltaSink | None = None, schema: ReplySchema | None = None
    ) -> Completion:
        """Send one Chat Completions request, retrying server failures; raise an `LLMError` subclass when it fails."""
        # max_tokens enforces the room the prompt budget left free for the answer (reply_reserve for
        # the roles; a fold asks for less, sized to its summary, and its prompt may use the rest).
        limit = self._config.reply_reserve if max_tokens is None else max_tokens
        request: dict[str, Any] = {"model": self._config.model, "messages": list(messages), "max_tokens": limit}
        constraint = self.response_format.for_call(schema)
        if constraint is not None:
            request["response_format"] = constraint
        if self._config.stream:
            request["stream"] = True
            request["stream_options"] = {"include_usage": True}  # else streamed replies carry no token counts
        hints = self.prompt_cache.hints(purpose, opening=str(messages[0].get("content", "")) if messages else "")
        request.update(hints)
        started = time.perf_counter()
        made = 0
        while True:
            made += 1
            if on_delta is not None and self._config.stream:
                on_delta(Delta("start"))
            try:
                fields = self._request(request, on_delta)
            except _Failure as failure:
                if self._drop_refused_hint(failure, request, hints):
                    continue
                if "stream_options" in request and _refuses(failure.cause, "stream_options"):
                    del request["stream_options"]  # older servers stream but know no options: no usage, then
                    continue
                if "response_format" in request and _refuses_format(failure.cause) and self.response_format.step_down(request["response_format"]):
                    # Many local servers (older llama.cpp, some vLLM models) refuse one or the other: the
                    # prompts ask for JSON anyway and replies are repaired, so ask again with less, at once.
                    request.pop("response_format")
                    constraint = self.response_format.for_call(schema)
                    if constraint is not None:
                        request["response_format"] = constraint
                    continue
                self._pause_or_raise(failure, made)
                continue
            self.prompt_cache.learn(llama_timings=fields.llama_timings)
            self._calibrate(messages, fields, limit=limit, purpose=purpose)
            return Completion(
                model=self._config.model,
                text=fields.text,
                prompt_tokens=fields.prompt_tokens or 0,
                completion_tokens=fields.completion_tokens or 0,
                latency=time.perf_counter() - started,
                finish_reason=fields.finish_reason,
                usage_reported=fields.prompt_tokens is not None and fields.completion_tokens is not None,
                cached_tokens=min(fields.cached_tokens, fields.prompt_tokens or 0),
            )

    def _calibrate(self, messages: Sequence[Message], fields: ReplyFields, *, limit: int, purpose: str) -> None:
        """Set the server's count of this request against ours; a reply with llama.cpp's timings makes its server count from now on."""
        if fields.prompt_tokens:
            allowed = self._config.context_window - limit - self._config.margin
            self.counter.observe(messages, server_tokens=fields.prompt_tokens, allowed=allowed, what=f"a {purpose} request")
        if fields.llama_timings and self.counter.server is None:
            self.counter.use_server(self._server_tokens("llama.cpp"))

    def _server_tokens(self, kind: str) -> ServerTokens:
        return ServerTokens("vllm" if kind == "vllm" else "llama.cpp", api_base=self._base_url, api_key=self._key, model=self._config.model)

    def _probe_server(self) -> ServerTokens | None:
        """A server of unknown kind that answers llama.cpp's `GET /props` counts with llama.cpp's tokenizer."""
        props = read_props(self._base_url, api_key=self._key)
        llama = props is not None and any(name in props for name in ("total_slots", "default_generation_settings", "chat_template"))
        return self._server_tokens("llama.cpp") if llama else None

    def tokenizer(self, purpose: str) -> ModelTokenizer:
        """What counts this model's prompts in its own tokens."""
        return self.counter

    def _drop_refused_hint(self, failure: _Failure, request: dict[str, Any], hints: Mapping[str, Any]) -> bool:
        """A cache hint is worth nothing to a server that refuses it: leave it out of this request and the rest."""
        refused = next((name for name in hints if name in request and _refuses(failure.cause, name)), None)
        if refused is None:
            return False
        self.prompt_cache.refuse(refused)
        del request[refused]
        return True

    def model_name(self, purpose: str) -> str:
        """The model every call asks for (`llm.model`)."""
        return self._config.model

    def scope_cache(self, name: str) -> None:
        """Name the session whose calls follow: the prompt cache keys are per session and purpose."""
        self.prompt_cache.scope(name)

    def share_cache(self, purpose: str, owner: str) -> None:
        """`purpose`'s calls go to `owner`'s cache key or slot (a fold that opens with its role's prompt)."""
        self.prompt_cache.share(purpose, owner)

    def close(self) -> None:
        """Release the HTTP connections."""
        self._client.close()
        self.counter.close()

    def _request(self, request: dict[str, Any], on_delta: DeltaSink | None) -> ReplyFields:
        """One HTTP request, its body read within llm.timeout in all; `_Failure` says whether to retry."""
        import openai
        from openai.types.chat import ChatCompletion, ChatCompletionChunk

        deadline = time.monotonic() + self._config.timeout
        try:
            # `post` rather than `chat.completions.create`: the same request and errors, without the SDK
            # re-walking every message as a TypedDict (milliseconds per call on long prompts). `stream=True`
            # with a stream class is the SDK's public way to hand back the body unread (JSON or SSE): we read it.
            stream = self._client.post(
                "/chat/completions",
                body=request,
                cast_to=ChatCompletion,
                stream=True,
                stream_cls=openai.Stream[ChatCompletionChunk],
            )
        except openai.APIStatusError as exc:
            raise _Failure(exc, retryable=_worth_retrying(exc), wait=retry_after(exc.response.headers)) from exc
        except openai.APIConnectionError as exc:  # timeouts included
            raise _Failure(exc, retryable=True) from exc
        except openai.OpenAIError as exc:
            raise _Failure(exc, retryable=False) from exc
        response = stream.response
        try:
            if "text/event-stream" in response.headers.get("content-type", ""):
                return read_stream(response.iter_bytes(), deadline=deadline, on_piece=_piece_sink(on_delta))
            return read_completion(read_body(response.iter_bytes(), deadline=deadline))
        except BrokenReply as exc:
            raise _Failure(exc, retryable=True) from exc
        except OddReply as exc:
            raise _Failure(exc, retryable=False) from exc
        finally:
            response.close()

    def _pause_or_raise(self, failure: _Failure, made: int) -> None:
        """Wait before the next request, or raise the failure's `LLMError` when there is to be none."""
        longest = self._config.timeout
        if failure.retryable and failure.wait is not None and failure.wait > longest:
            raise self._refuse_wait(failure, made, longest) from failure.cause
        if not failure.retryable or made > self._config.max_retries:
            raise self._translate(failure.cause, made) from failure.cause
        time.sleep(failure.wait if failure.wait is not None else _backoff(made))

    def _refuse_wait(self, failure: _Failure, made: int, longest: float) -> LLMError:
        """A server asking for a wait longer than we keep a user waiting: say so at once."""
        status = getattr(failure.cause, "status_code", None)
        what = "is rate limited (HTTP 429)" if status == 429 else f"answered HTTP {status}"
        requests = f"{made} request{'' if made == 1 else 's'}"
        error = LLMRateLimitError if status == 429 else LLMError
        return error(
            f"the model endpoint at {self.host} {what} and asks to wait {failure.wait:,.0f} s before the next request; "
            f"gave up after {requests}, since waits over llm.timeout ({longest:g} s) are not sat out: "
            "try again later, or raise llm.timeout to wait"
        )

    def _translate(self, exc: Exception, made: int) -> LLMError:
        """One message per failure, naming the host or model and the setting that fixes it."""
        import openai

        retried = self._retried(made)
        if isinstance(exc, openai.APITimeoutError) or (isinstance(exc, BrokenReply) and exc.timed_out):
            return LLMUnreachableError(
                f"the model endpoint at {self.host} did not answer within {self._config.timeout:g} s ({retried}); check the server, or raise llm.timeout"
            )
        if isinstance(exc, openai.APIConnectionError):
            return LLMUnreachableError(
                f"cannot reach the model endpoint at {self.host} ({self._scrub(_cause(exc))}, {retried}); "
                f"check {self._hints.api_base} and that the server is running"
            )
        if isinstance(exc, BrokenReply):
            return LLMError(f"the model endpoint at {self.host} {exc} ({retried}); check the server behind {self._hints.api_base}")
        if isinstance(exc, OddReply):
            # A wrong api_base often lands on a web page or another API that answers 200.
            return LLMError(f"{self.url} {exc}; check {self._hints.api_base} (for most servers it ends in /v1) and that it serves the Chat Completions API")
        if not isinstance(exc, openai.APIStatusError):
            return LLMError(f"the call to {self.host} failed: {self._scrub(str(exc))}")
        return self._translate_status(exc, retried)

    def _translate_status(self, exc: Any, retried: str) -> LLMError:
        """The message for an HTTP error status (`exc` is an openai.APIStatusError)."""
        import openai

        model = self._config.model
        detail = self._scrub(_server_message(exc))
        if isinstance(exc, (openai.AuthenticationError, openai.PermissionDeniedError)):
            return LLMAuthError(f"the API key was refused by {self.host}; check {self._hints.api_key}")
        if isinstance(exc, openai.NotFoundError):
            if "model" in detail.lower() or exc.code == "model_not_found":
                return LLMModelNotFoundError(f"the model '{model}' is not served by {self.host} ({detail}); check {self._hints.model}")
            return LLMError(
                f"{self.url}/chat/completions was not found on {self.host} (HTTP 404: {detail}); check {self._hints.api_base} (for most servers it ends in /v1)"
            )
        if isinstance(exc, openai.RateLimitError):
            if exc.code == "insufficient_quota":
                return LLMRateLimitError(f"the account behind the API key has no quota left at {self.host} ({detail})")
            return LLMRateLimitError(
                f"{self.host} kept answering 'rate limited' (HTTP 429, {retried}): {detail}; wait a moment and try again, or raise llm.max_retries"
            )
        lowered = detail.lower()
        if exc.status_code in (400, 413, 422) and any(words in lowered for words in _CONTEXT_WORDS):
            return LLMContextTooLongError(
                f"the prompt is longer than model '{model}' accepts at {self.host} ({detail}); "
                "set llm.context_window to the model's real context size so prompts are compressed to fit"
            )
        if exc.status_code in (400, 422) and refusal_names_it(lowered):
            setting = self.response_format.setting
            if setting in ("json_schema", "json_object"):
                return LLMError(
                    f"{self.host} does not accept response_format {setting} for model '{model}' ({detail}); "
                    "set llm.structured to auto (it steps down to what the endpoint takes) or off, e.g. --set llm.structured=auto"
                )
            return LLMError(
                f"{self.host} refuses the reply format for model '{model}' ({detail}); "
                "run with --set llm.structured=off (or set llm.structured: off in taskweaver_config.yaml)"
            )
        return LLMError(f"the model endpoint at {self.host} answered HTTP {exc.status_code}: {detail}")

    def _retried(self, made: int) -> str:
        """How the requests went, for messages: the real count, not the configured one."""
        if self._config.max_retries == 0:
            return "with retries off"
        retries = made - 1
        return f"after {retries} {'retry' if retries == 1 else 'retries'}" if retries else "not retried"

    def _scrub(self, text: str) -> str:
        """Servers sometimes echo the key or the address back; neither may reach the screen or a log."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text


class _Failure(Exception):
    """One request failed: why, whether another is worth making, and the wait the server asked for."""

    def __init__(self, cause: Exception, *, retryable: bool, wait: float | None = None) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.retryable = retryable
        self.wait = wait


def _refuses_format(exc: Exception) -> bool:
    """An HTTP 400/422 about the response format: the endpoint does not take the constraint asked for."""
    status = getattr(exc, "status_code", None)
    return status in (400, 422) and hasattr(exc, "body") and refusal_names_it(_server_message(exc))


def _refuses(exc: Exception, parameter: str) -> bool:
    """An HTTP 400/422 whose message names `parameter`: the endpoint does not take it."""
    status = getattr(exc, "status_code", None)
    return status in (400, 422) and hasattr(exc, "body") and parameter in _server_message(exc).lower()


def _worth_retrying(exc: Any) -> bool:
    """The SDK's rule for an HTTP error (`exc` is an openai.APIStatusError), less a quota that is gone."""
    told = exc.response.headers.get("x-should-retry")
    if told in ("true", "false"):
        return bool(told == "true")
    if exc.status_code == 429 and exc.code == "insufficient_quota":
        return False  # it will not come back in seconds
    return bool(exc.status_code in (408, 409, 429) or exc.status_code >= 500)


def _piece_sink(on_delta: DeltaSink | None) -> PieceSink:
    """Stream pieces as deltas for the caller, or dropped when nobody watches."""

    def sink(kind: Piece, text: str) -> None:
        if on_delta is not None:
            on_delta(Delta(kind, text))

    return sink


def _backoff(made: int) -> float:
    """Seconds before retry number `made` when the server names none: 0.5 s doubling to 8 s, less up to a quarter."""
    return min(_FIRST_BACKOFF * 2.0 ** (made - 1), _LONGEST_BACKOFF) * (1 - 0.25 * random.random())


def redact_url(url: str) -> str:
    """`url` without its credentials: the user and password replaced by ***, and every query value too."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    query = "&".join(f"{name}=***" for name, _ in parse_qsl(parts.query, keep_blank_values=True))
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def url_secrets(url: str) -> tuple[str, ...]:
    """The credentials inside `url` (user, password, query values), to mask wherever a server echoes them."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    found = [piece for piece in userinfo.split(":") if piece]
    found += [value for _, value in parse_qsl(parts.query) if value]
    return tuple(found)


_OPENAI_BASE_URL = "https://api.openai.com/v1"
_LOCAL_SERVER_KEY = "not-needed"
_MIN_SCRUBBED_KEY = 6  # shorter secrets cannot be masked without garbling ordinary words
_FIRST_BACKOFF = 0.5
_LONGEST_BACKOFF = 8.0
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
