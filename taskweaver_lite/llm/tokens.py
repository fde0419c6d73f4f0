"""Exact token counting and prompt budgets, offline.

Counts come from the Rust BPE tables of `bpe-openai` (o200k_base or cl100k_base), so a prompt is
measured exactly before it is sent instead of guessed from its length. The binding is imported on
first use: importing this module costs nothing.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from taskweaver_lite.errors import ConfigError

if TYPE_CHECKING:
    from taskweaver_lite.records.model_calls import Message

# OpenAI's chat format wraps every message in a few tokens (<|start|>role ... <|end|>) and primes
# the reply with <|start|>assistant<|message|>; these are the cookbook's numbers for gpt-4o models.
TOKENS_PER_MESSAGE = 3
REPLY_PRIMING_TOKENS = 3


# Counts of texts seen lately. Every prompt re-renders the same instructions and earlier rounds, and
# the server's sessions share one interpreter lock that a count holds: looking a text up costs a
# hash of it, counting it again a BPE pass. Bounded in entries and in the length of a text kept.
COUNT_CACHE_ENTRIES = 2048
COUNT_CACHE_MAX_CHARS = 32_768


class Tokenizer:
    """Counts tokens of text and of chat messages for one BPE encoding."""

    def __init__(self, name: str, *, backend: Any) -> None:
        self.name = name
        self._bpe = backend
        self._cached_count = functools.lru_cache(maxsize=COUNT_CACHE_ENTRIES)(self._count)

    def count(self, text: str) -> int:
        """Exact number of tokens in `text`."""
        if not text:
            return 0
        return self._cached_count(text) if len(text) <= COUNT_CACHE_MAX_CHARS else self._count(text)

    def _count(self, text: str) -> int:
        return int(self._bpe.count(text))

    def count_message(self, message: Message) -> int:
        """Tokens one chat message adds to a prompt, its framing included."""
        return TOKENS_PER_MESSAGE + self.count(message["role"]) + self.count(message["content"])

    def count_messages(self, messages: Sequence[Message]) -> int:
        """Tokens a whole chat prompt takes, the reply priming included."""
        return sum(self.count_message(m) for m in messages) + REPLY_PRIMING_TOKENS

    def truncate_middle(self, text: str, max_tokens: int) -> str:
        """`text` cut to at most `max_tokens` tokens: head and tail kept, a marker in between."""
        size = self.count(text)
        if size <= max_tokens:
            return text
        tokens = self._bpe.encode(text)
        scale = self._scale(size, tokens)
        keep = int((max_tokens - self.count(_marker(size))) / scale)
        if keep < 2:
            # No room for a marker: keep what fits of the head, the part a reader sees first.
            return self._head(tokens, max_tokens, scale)
        while keep >= 2:
            head_len = (keep + 1) // 2
            head = self._decode(tokens[:head_len], side="head")
            tail = self._decode(tokens[len(tokens) - (keep - head_len) :], side="tail")
            result = f"{head}{_marker(size - self.count(head) - self.count(tail))}{tail}"
            # Re-joined pieces can merge differently at the seams; shrink until the promise holds.
            over = self.count(result) - max_tokens
            if over <= 0:
                return result
            keep -= self._step(over, scale)
        return self._head(tokens, max_tokens, scale)

    def keep_tail(self, text: str, max_tokens: int) -> str:
        """`text` cut to at most `max_tokens` tokens from its end, a marker in front (a traceback's last frames)."""
        size = self.count(text)
        if size <= max_tokens:
            return text
        tokens = self._bpe.encode(text)
        scale = self._scale(size, tokens)
        keep = max(int((max_tokens - self.count(_marker(size))) / scale), 0)
        while keep > 0:
            tail = self._decode(tokens[len(tokens) - keep :], side="tail")
            result = f"{_marker(size - self.count(tail)).lstrip()}{tail}"
            over = self.count(result) - max_tokens
            if over <= 0:
                return result
            keep -= self._step(over, scale)
        return ""

    def _scale(self, size: int, tokens: Sequence[int]) -> float:
        """This tokenizer's tokens per BPE piece of one text (1 when the BPE is what counts): cuts are made
        on BPE pieces, sized in the tokens that count."""
        return max(size / max(len(tokens), 1), 1e-3) if size != len(tokens) else 1.0

    @staticmethod
    def _step(over: int, scale: float) -> int:
        """BPE pieces to take off a cut that came out `over` tokens too long: one at a time where a piece is a token."""
        return 1 if scale == 1.0 else max(1, math.ceil(over / scale))

    def _head(self, tokens: Sequence[int], max_tokens: int, scale: float) -> str:
        """The longest start of `tokens` that counts at most `max_tokens`."""
        keep = int(max(max_tokens, 0) / scale)
        while keep > 0:
            head = self._decode(tokens[:keep], side="head")
            over = self.count(head) - max_tokens
            if over <= 0:
                return head
            keep -= self._step(over, scale)
        return ""

    def fit(self, texts: Sequence[str], *, room: int) -> list[str]:
        """Cut the longest texts first (head and tail kept) so that together they take at most about `room` tokens."""
        sizes = [self.count(t) for t in texts]
        if sum(sizes) <= room:
            return list(texts)
        # Water-filling: small texts stay whole, the big ones share what is left equally.
        cap, remaining, pending = 0, room, sorted(range(len(texts)), key=lambda i: sizes[i])
        for position, i in enumerate(pending):
            share = remaining // (len(pending) - position)
            if sizes[i] > share:
                cap = share
                break
            remaining -= sizes[i]
        return [(self.truncate_middle(t, cap) if cap > 0 else "") if size > cap else t for t, size in zip(texts, sizes, strict=True)]

    def _decode(self, tokens: Sequence[int], *, side: str) -> str:
        # A cut can land inside a multi-byte character; move the cut a token at a time until it decodes.
        pieces = list(tokens)
        while pieces:
            try:
                return str(self._bpe.decode(pieces))
            except ValueError:
                pieces = pieces[:-1] if side == "head" else pieces[1:]
        return ""


def _marker(left_out: int) -> str:
    return f"\n[... {left_out:,} tokens left out here ...]\n"


def get_tokenizer(name: str = "o200k_base") -> Tokenizer:
    """The shared, offline tokenizer for encoding `name` (o200k_base or cl100k_base)."""
    return _load(name)


@functools.cache
def _load(name: str) -> Tokenizer:
    # The Rust binding directly: bpe_openai's public Encoding refuses texts over 1M characters or
    # 200k tokens, and a 20k-token cell output in a long history must still be counted exactly.
    bindings = _rust_bindings()
    try:
        backend = bindings.tokenizer_for_encoding(name)
    except (ValueError, KeyError):
        known = ", ".join(sorted(bindings.supported_encodings()))
        raise ConfigError(f"llm.tokenizer: unknown encoding '{name}'; supported: {known}") from None
    return Tokenizer(name, backend=backend)


def _rust_bindings() -> Any:
    """bpe_openai's Rust extension (its tables built in), loaded without running the package's `__init__`.

    That `__init__` decodes three vocabularies in Python to fill a model table we never read: 0.8 s
    at every start, against 0.06 s for the extension to build o200k_base from its own tables.
    """
    import importlib.machinery
    import importlib.util
    import sys
    from pathlib import Path

    name = "bpe_openai._bindings"
    if name in sys.modules:
        return sys.modules[name]
    package = importlib.util.find_spec("bpe_openai")  # found, not imported
    for folder in (package.submodule_search_locations or []) if package is not None else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = Path(folder) / f"_bindings{suffix}"
            spec = importlib.util.spec_from_file_location(name, path) if path.is_file() else None
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                sys.modules[name] = module
                return module
    from bpe_openai import _bindings  # laid out otherwise: the ordinary import, slower but the same tables

    return _bindings
