"""Prompt counting: every prompt counted in the tokens of the model it goes to, so the window really holds.

A `ModelTokenizer` is the `Tokenizer` the budget guard, the folds and every cut use for one model.
How it counts (`llm.token_counting`):

- `auto` (the default): exactly, by the server's own tokenizer, where the server can tell:
  llama.cpp's server (`/tokenize`; the chat template's tokens from `/apply-template`) and vLLM
  (`/tokenize`, which applies the template itself). The server's kind is found as the prompt cache
  finds it (`llm.server_kind`, local discovery, a reply with llama.cpp's `timings`), and a server of
  unknown kind is asked `GET /props` once. Each message is counted where the chat template puts it,
  once, and remembered, so a prompt costs a round trip per message it has not shown before, and a
  prompt's count is its server's to the token. Elsewhere: OpenAI's models by `llm.tokenizer`
  (o200k_base), any other model by `llm.tokenizer` times a ratio calibrated on the server's replies.
- `calibrated`: never ask the server for counts; `llm.tokenizer` times the calibrated ratio.
- `tokenizer`: `llm.tokenizer` alone, as the server counted it (for those who know it does).

Calibration: every reply's `usage.prompt_tokens` is set against our own count of that request. The
counts follow the worst ratio seen for the model (never under 1), kept with the session and in the
state folder for later sessions (`token_ratios.json`); a model that is not OpenAI's and was never
measured starts from `CAUTIOUS_RATIO`. A server's exact count is checked the same way, from 1: a
template that does more than put each message in its place shows in the replies.

Nothing hides a miss: a request the server counted larger than our budget allowed
(`llm.context_window - max_tokens - llm.margin`) is one warning with the figures, and since the ratio
rose with it, the next prompts (and fold calls) shrink.
"""

from __future__ import annotations

import functools
import http.client
import json
import logging
import math
import os
import re
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from taskweaver_lite.llm.tokens import COUNT_CACHE_ENTRIES, COUNT_CACHE_MAX_CHARS, REPLY_PRIMING_TOKENS, TOKENS_PER_MESSAGE, Tokenizer, get_tokenizer

if TYPE_CHECKING:
    from taskweaver_lite.records.model_calls import Message

_log = logging.getLogger(__name__)

TokenCounting = Literal["auto", "calibrated", "tokenizer"]
CountingKind = Literal["llama.cpp", "vllm"]

# A model that is not OpenAI's, never measured: its tokens per o200k token, until a reply says.
# Measured on SmolLM2 (llama.cpp's /tokenize): prose 1.11, code 1.09, real analysis prompts 1.23,
# CSV 1.44; a first prompt (instructions, examples, a request) is mostly prose and code.
CAUTIOUS_RATIO = 1.3
SERVER_TIMEOUT = 5.0  # seconds for one /tokenize: a local server answers in milliseconds
_MAX_ANSWER = 64 * 2**20  # bytes: a token list of a long text, with room
RATIOS_FILE = "token_ratios.json"
_PROBE = "x"  # the content of the one-word system message other messages are counted after
_PLACEHOLDER = "\u2063taskweaver-lite:content\u2063"  # where a rendered template puts a message's content
_OPENAI_HOSTS = ("api.openai.com", ".openai.azure.com")
_OPENAI_MODEL = re.compile(r"^(gpt-|chatgpt-|o\d|ft:gpt-)", re.IGNORECASE)


def is_openai_model(*, api_base: str, model: str, server_kind: str) -> bool:
    """Whether o200k (or `llm.tokenizer`) counts this model's prompts as its server does: OpenAI's API or model names."""
    host = urlsplit(api_base).hostname or ""
    return server_kind == "openai" or any(host == h or host.endswith(h) for h in _OPENAI_HOSTS if h) or bool(_OPENAI_MODEL.match(model))


class CountingUnavailable(Exception):
    """The server did not count (no such endpoint, not reachable, an odd answer): count without it."""


class ServerTokens:
    """A server's own tokenizer over HTTP: llama.cpp's `/tokenize` and `/apply-template`, or vLLM's `/tokenize`.

    A message is counted where the template puts it: between a one-word system message and a one-word
    request, less their own count (the first message of a prompt: before the request alone, so its
    template's start and the reply priming are its). Where messages meet only template text meets, so
    a prompt's count (which always ends with a request) is the sum of its messages'. llama.cpp renders
    its template once per role, with a placeholder where the content goes; a message is then one
    `/tokenize` of that rendering with its content in place (one `/apply-template` more each where the
    template does not put content in verbatim).

    Safe to use from several threads; counts are remembered (bounded as `Tokenizer`'s are).
    """

    def __init__(self, kind: CountingKind, *, api_base: str, api_key: str, model: str, post: Callable[[str, dict[str, Any]], Any] | None = None) -> None:
        self.kind = kind
        self.root = api_base.rstrip("/").removesuffix("/v1")
        self._model = model
        self._poster = _Poster(api_key, local=urlsplit(self.root).hostname in ("127.0.0.1", "localhost"))
        self._post = post or self._poster
        self._cached_count = functools.lru_cache(maxsize=COUNT_CACHE_ENTRIES)(self._count)
        self._cached_message = functools.lru_cache(maxsize=COUNT_CACHE_ENTRIES)(self._message)
        self._shapes: dict[tuple[str, bool], tuple[str | None, int]] = {}
        self._lock = threading.Lock()
        self.requests = 0  # round trips made (for the bench)

    def count(self, text: str) -> int:
        """Tokens of `text` alone, by the server's tokenizer (its pieces cut, sized, marked)."""
        if not text:
            return 0
        return self._cached_count(text) if len(text) <= COUNT_CACHE_MAX_CHARS else self._count(text)

    def message(self, role: str, content: str, *, first: bool) -> int:
        """Tokens one message adds to a prompt, its template's included (`first`: it opens the prompt)."""
        if len(content) > COUNT_CACHE_MAX_CHARS:
            return self._message(role, content, first)
        return self._cached_message(role, content, first)

    def count_chat(self, messages: Sequence[Mapping[str, str]]) -> int:
        """Tokens of a whole chat prompt as the server feeds it to the model (template and reply priming included)."""
        listed = [{"role": m["role"], "content": m["content"]} for m in messages]
        if self.kind == "vllm":
            return self._vllm({"model": self._model, "messages": listed, "add_generation_prompt": True})
        return self._llama_tokens(self._render(listed), special=True)

    def close(self) -> None:
        """Release the HTTP connections (a later count opens them again)."""
        self._poster.close()

    def _message(self, role: str, content: str, first: bool) -> int:
        message = {"role": role, "content": content}
        if self.kind == "vllm":
            return self.count_chat(self._around(message, first)) - self._without(first)
        rendering, without = self._shape(role, first)
        if rendering is None:
            return self.count_chat(self._around(message, first)) - without
        return self._llama_tokens(rendering.replace(_PLACEHOLDER, content), special=True) - without

    @staticmethod
    def _around(message: dict[str, str], first: bool) -> list[dict[str, str]]:
        """The prompt a message is counted in: after a one-word system message (unless it opens the prompt),
        before a one-word request (a prompt that ends with the model's own message is one it continues)."""
        return [*([] if first else [_msg("system")]), message, _msg("user")]

    def _without(self, first: bool) -> int:
        """The tokens of that prompt without the message: the one-word request (and system message), as they count there."""
        with self._lock:
            known = self._shapes.get(("", first))
        if known is None:
            system, both = self.count_chat([_msg("system")]), self.count_chat([_msg("system"), _msg("user")])
            known = (None, both - system if first else both)
            with self._lock:
                self._shapes[("", first)] = known
        return known[1]

    def _shape(self, role: str, first: bool) -> tuple[str | None, int]:
        """The template rendered around a placeholder for `role`'s content (None where it does not put content in verbatim), and `_without`."""
        with self._lock:
            known = self._shapes.get((role, first))
        if known is not None:
            return known
        rendering: str | None = self._render(self._around({"role": role, "content": _PLACEHOLDER}, first))
        plain = self._render(self._around(_msg(role), first))
        if rendering is None or rendering.count(_PLACEHOLDER) != 1 or rendering.replace(_PLACEHOLDER, _PROBE) != plain:
            rendering = None
        shape = (rendering, self._without(first))
        with self._lock:
            self._shapes[(role, first)] = shape
        return shape

    def _render(self, messages: list[dict[str, str]]) -> str:
        prompt = self._ask("/apply-template", {"messages": messages}).get("prompt")
        if not isinstance(prompt, str):
            raise CountingUnavailable("/apply-template answered without a prompt")
        return prompt

    def _count(self, text: str) -> int:
        if self.kind == "vllm":
            return self._vllm({"model": self._model, "prompt": text, "add_special_tokens": False})
        return self._llama_tokens(text, special=False)

    def _llama_tokens(self, text: str, *, special: bool) -> int:
        tokens = self._ask("/tokenize", {"content": text, "add_special": special, "parse_special": True}).get("tokens")
        if not isinstance(tokens, list):
            raise CountingUnavailable("/tokenize answered without tokens")
        return len(tokens)

    def _vllm(self, body: dict[str, Any]) -> int:
        count = self._ask("/tokenize", body).get("count")
        if not isinstance(count, int) or isinstance(count, bool):
            raise CountingUnavailable("/tokenize answered without a count")
        return count

    def _ask(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.requests += 1
        answer = self._post(f"{self.root}{path}", body)
        if not isinstance(answer, dict):
            raise CountingUnavailable(f"{path} answered with no JSON object")
        return answer


def _msg(role: str) -> dict[str, str]:
    return {"role": role, "content": _PROBE}


class _Poster:
    """POST JSON over a kept-alive connection per thread: http.client, whose round trip to a local server
    costs a tenth of a millisecond of CPU (a quarter of httpx's), since a session's counts are many and small."""

    def __init__(self, api_key: str, *, local: bool) -> None:
        self._headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
        self._local = local
        self._mine = threading.local()
        self._opened: list[Any] = []
        self._lock = threading.Lock()

    def __call__(self, url: str, body: dict[str, Any]) -> Any:
        parts = urlsplit(url)
        data = json.dumps(body).encode()
        for attempt in (1, 2):  # a kept-alive connection the server closed meanwhile: once more on a new one
            connection = self._connection(parts.scheme, parts.netloc)
            try:
                connection.request("POST", parts.path, body=data, headers=self._headers)
                response = connection.getresponse()
                payload = response.read(_MAX_ANSWER)
            except (OSError, http.client.HTTPException) as exc:
                connection.close()
                self._mine.connection = None
                with self._lock:
                    self._opened = [c for c in self._opened if c is not connection]
                if attempt == 2:
                    raise CountingUnavailable(type(exc).__name__) from exc
                continue
            if response.status != 200:
                raise CountingUnavailable(f"HTTP {response.status}")
            try:
                return json.loads(payload)
            except ValueError as exc:
                raise CountingUnavailable("no JSON") from exc
        raise CountingUnavailable("no answer")

    def _connection(self, scheme: str, netloc: str) -> Any:
        connection = getattr(self._mine, "connection", None)
        if connection is None:
            if scheme == "https":
                import ssl

                connection = http.client.HTTPSConnection(netloc, timeout=SERVER_TIMEOUT, context=ssl.create_default_context())
            else:
                connection = http.client.HTTPConnection(netloc, timeout=SERVER_TIMEOUT)
            self._mine.connection = connection
            with self._lock:
                self._opened.append(connection)
        return connection

    def close(self) -> None:
        with self._lock:
            opened, self._opened = self._opened, []
        for connection in opened:
            connection.close()
        self._mine = threading.local()


class RatioBook:
    """The worst ratio measured per model, in the state folder (`token_ratios.json`): later sessions start from it.

    A file that cannot be read is an empty book; one that cannot be written leaves the ratios in memory.
    """

    def __init__(self, path: Path | Callable[[], Path]) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._ratios: dict[str, float] | None = None

    def get(self, key: str) -> float | None:
        """The ratio kept for `key`, if any."""
        with self._lock:
            return self._loaded().get(key)

    def raise_to(self, key: str, ratio: float) -> None:
        """Keep `ratio` for `key` if it is higher than the one kept."""
        with self._lock:
            ratios = self._loaded()
            if ratio <= ratios.get(key, 0.0):
                return
            ratios[key] = ratio
            try:
                path = self._file()
                path.parent.mkdir(parents=True, exist_ok=True)
                fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".token_ratios.")
                with os.fdopen(fd, "w") as out:
                    json.dump(ratios, out, indent=1, sort_keys=True)
                os.replace(temporary, path)
            except OSError as exc:
                _log.debug("token ratios not saved: %s", exc)

    def _file(self) -> Path:
        return self._path() if callable(self._path) else self._path

    def _loaded(self) -> dict[str, float]:
        if self._ratios is None:
            try:
                data = json.loads(self._file().read_text())
            except (OSError, ValueError):
                data = {}
            good = data.items() if isinstance(data, dict) else ()
            self._ratios = {str(k): float(v) for k, v in good if isinstance(v, (int, float)) and not isinstance(v, bool) and 1.0 <= v < 100}
        return self._ratios


@dataclass(frozen=True)
class Miss:
    """A request the server counted larger than the budget allowed it."""

    server_tokens: int
    counted: int
    allowed: int
    ratio: float  # the ratio counts follow from now on


class ModelTokenizer(Tokenizer):
    """A `Tokenizer` that counts in one model's tokens: its server's, exactly, or `llm.tokenizer`'s scaled by a calibrated ratio.

    Cuts are still made on `llm.tokenizer`'s pieces (offline) and checked with the model's count.
    Safe to use from several threads (the roles and their folds).
    """

    def __init__(
        self,
        name: str,
        *,
        backend: Any,
        model: str,
        key: str,
        counting: TokenCounting = "auto",
        openai: bool = False,
        server: ServerTokens | None = None,
        book: RatioBook | None = None,
        probe: Callable[[], ServerTokens | None] | None = None,
    ) -> None:
        """`probe`: asked once, before the first count, for the server that counts (a server of unknown kind)."""
        super().__init__(name, backend=backend)
        self.model = model
        self.key = key  # the model's address and name: where its ratio is kept
        self._counting = counting
        self._openai = openai
        self._book = book
        self._lock = threading.Lock()
        self._server: ServerTokens | None = None
        self._ratio = 1.0
        self._measured = True
        self._probe = probe if counting == "auto" and server is None and not openai else None
        self._offline = super().count  # llm.tokenizer's count, remembered per text
        self._start(server)

    def _start(self, server: ServerTokens | None) -> None:
        """Count by `server` (or offline when None): the ratio from the book, else 1 where counts are exact, else cautious."""
        self._server = server if self._counting == "auto" else None
        kept = self._book.get(self._book_key()) if self._book is not None and self._counting != "tokenizer" else None
        exact = self._server is not None or self._openai or self._counting == "tokenizer"
        self._ratio = kept if kept is not None else 1.0 if exact else CAUTIOUS_RATIO
        self._measured = kept is not None or exact

    @property
    def mode(self) -> str:
        """How prompts are counted now: 'llama.cpp' or 'vllm' (the server's tokenizer), or this tokenizer's name."""
        server = self._server
        return server.kind if server is not None else self.name

    def describe(self) -> str:
        """How this model's prompts are counted now, in a few words for /context."""
        server = self._server
        if server is not None:
            extra = f", times {self._ratio:.3f} its replies showed" if self._ratio > 1.0 else ""
            return f"the server's own tokenizer ({'llama.cpp' if server.kind == 'llama.cpp' else 'vLLM'}){extra}"
        if self._counting == "tokenizer":
            return f"{self.name} alone (llm.token_counting: tokenizer)"
        if self._openai and self._ratio == 1.0:
            return f"{self.name}, as OpenAI's models count"
        how = "calibrated on the server's replies" if self._measured else "a cautious start until a reply measures it"
        return f"{self.name} times {self._ratio:.3f}, {how}"

    @property
    def ratio(self) -> float:
        """Model tokens per counted token, as calibrated so far (1 where counts are exact and held)."""
        return self._ratio

    @property
    def server(self) -> ServerTokens | None:
        """The server that counts, when one does."""
        return self._server

    def close(self) -> None:
        """Release the counting server's connections."""
        server = self._server
        if server is not None:
            server.close()

    def use_server(self, server: ServerTokens) -> None:
        """Count by `server` from now on (its kind just became known); with `llm.token_counting` other than auto, nothing changes."""
        with self._lock:
            if self._counting != "auto" or self._server is not None:
                return
            self._start(server)

    def count(self, text: str) -> int:
        """Tokens of `text` in the model's tokens (its server's, or the calibrated estimate)."""
        if not text:
            return 0
        return self._scaled(self._offline(text) if self._server is None and self._probe is None else self._base(text))

    def count_message(self, message: Message) -> int:
        """Tokens one chat message adds to a prompt, the template's included."""
        return self._scaled(self._base_message(message))

    def count_messages(self, messages: Sequence[Message]) -> int:
        """Tokens a whole chat prompt takes, the template's start and the reply priming included."""
        if self._server is None and self._probe is None:
            # Offline, the budget guard's hot path (it counts whole drafts many times a turn): as
            # `count_message` sums it, without a call per message.
            count, ratio = self._offline, self._ratio
            if ratio == 1.0:
                return sum(TOKENS_PER_MESSAGE + count(m["role"]) + count(m["content"]) for m in messages) + REPLY_PRIMING_TOKENS
            scale = self._scaled
            return sum(scale(TOKENS_PER_MESSAGE + count(m["role"]) + count(m["content"])) for m in messages) + scale(REPLY_PRIMING_TOKENS)
        return sum(self._scaled(self._base_message(m, first=i == 0)) for i, m in enumerate(messages)) + self._scaled(self._base_opening())

    def base_count(self, messages: Sequence[Message]) -> int:
        """A prompt's tokens before the ratio: the server's exact count as summed here, or the offline tokenizer's."""
        return sum(self._base_message(m, first=i == 0) for i, m in enumerate(messages)) + self._base_opening()

    def observe(self, messages: Sequence[Message], *, server_tokens: int, allowed: int, what: str) -> Miss | None:
        """Set the server's count of a request against ours: the ratio follows the worst seen; a count over `allowed` is a warning."""
        base = self.base_count(messages)
        if self._counting == "tokenizer" or base <= 0 or server_tokens <= 0:
            return None
        counted, mode = self.count_messages(messages), self.mode
        seen = server_tokens / base
        with self._lock:
            before = self._ratio
            self._ratio = max(seen, 1.0) if not self._measured else max(self._ratio, seen)
            self._measured = True
            ratio = self._ratio
        if self._book is not None and ratio > 1.0:
            self._book.raise_to(self._book_key(), ratio)
        if server_tokens <= allowed:
            return None
        _log.warning(
            "%s on %s: the server counted %s prompt tokens, over the %s its budget allowed (llm.context_window - max_tokens - llm.margin); "
            "our count was %s (%s tokens times %.3f). Prompts are counted at %.3f from now on, so the next ones shrink.",
            what,
            self.model,
            f"{server_tokens:,}",
            f"{allowed:,}",
            f"{counted:,}",
            mode,
            before,
            ratio,
        )
        return Miss(server_tokens=server_tokens, counted=counted, allowed=allowed, ratio=ratio)

    def calibration(self) -> dict[str, float]:
        """The ratio measured for this model, to keep with the session ({} before any measurement above 1)."""
        with self._lock:
            return {self._book_key(): self._ratio} if self._measured and self._ratio > 1.0 else {}

    def adopt(self, kept: Mapping[str, float]) -> None:
        """Take a ratio kept with a session (a resumed one) when it is worse than ours."""
        ratio = kept.get(self._book_key())
        if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or not 1.0 <= ratio < 100 or self._counting == "tokenizer":
            return
        with self._lock:
            self._ratio = ratio if not self._measured else max(self._ratio, ratio)
            self._measured = True

    def _book_key(self) -> str:
        return f"{self.key} {self.mode}"

    def _scaled(self, base: int) -> int:
        ratio = self._ratio
        return base if ratio == 1.0 else math.ceil(base * ratio - 1e-9)

    def _asked(self) -> ServerTokens | None:
        """The server that counts, once the probe (if any) has said whether there is one."""
        if self._probe is not None:
            with self._lock:
                probe, self._probe = self._probe, None
            found = probe() if probe is not None else None
            if found is not None:
                self.use_server(found)
        return self._server

    def _base(self, text: str) -> int:
        server = self._asked()
        if server is not None:
            try:
                return server.count(text)
            except CountingUnavailable as exc:
                self._lose_server(exc)
        return self._offline(text)

    def _base_message(self, message: Message, *, first: bool = False) -> int:
        server = self._asked()
        if server is not None:
            try:
                return server.message(message["role"], message["content"], first=first)
            except CountingUnavailable as exc:
                self._lose_server(exc)
        return TOKENS_PER_MESSAGE + self._offline(message["role"]) + self._offline(message["content"])

    def _base_opening(self) -> int:
        """What a prompt adds besides its messages: the reply priming (a server's count has it in the first message's)."""
        return 0 if self._asked() is not None else REPLY_PRIMING_TOKENS

    def _lose_server(self, exc: CountingUnavailable) -> None:
        """The server stopped counting: count offline from now on, cautiously, saying so once."""
        with self._lock:
            server, self._server = self._server, None
            if server is None:
                return
            kept = self._book.get(self._book_key()) if self._book is not None else None
            self._ratio, self._measured = (kept, True) if kept is not None else (CAUTIOUS_RATIO, False)
        server.close()
        _log.warning(
            "%s's server at %s did not count a prompt (%s): prompts are counted with %s, cautiously, until a reply calibrates it",
            self.model,
            server.root,
            exc,
            self.name,
        )


def model_tokenizer(
    *,
    tokenizer: str,
    api_base: str,
    model: str,
    server_kind: str,
    counting: TokenCounting,
    server: ServerTokens | None = None,
    book: RatioBook | None = None,
    probe: Callable[[], ServerTokens | None] | None = None,
) -> ModelTokenizer:
    """The tokenizer for prompts to `model` at `api_base` (`server`: the server's own, when its kind is known)."""
    offline = get_tokenizer(tokenizer)
    return ModelTokenizer(
        offline.name,
        backend=offline._bpe,
        model=model,
        key=f"{api_base.rstrip('/')} {model}",
        counting=counting,
        openai=is_openai_model(api_base=api_base, model=model, server_kind=server_kind),
        server=server,
        book=book,
        probe=probe,
    )
