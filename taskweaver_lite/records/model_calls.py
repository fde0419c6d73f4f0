"""A model call as a record: the chat messages sent, the completion that came back, the deltas of a streamed reply,
one call's record and the usage summed over many. Values only; the clients that make calls live in `llm/`."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, TypedDict


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
    model: str = ""  # the model asked for, when the client knows it
    cached_tokens: int = 0  # of prompt_tokens, those the server reused from its prefix cache


@dataclass(frozen=True)
class Delta:
    """A piece of a reply as it streams in: `start` (a request begins; any text before it is void), `content` or `reasoning`."""

    kind: Literal["start", "content", "reasoning"]
    text: str = ""


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
    model: str = ""  # the model asked for, when the client knows it
    cached_tokens: int = 0  # of prompt_tokens, those the server took from its prefix cache


@dataclass(frozen=True)
class Usage:
    """Model calls and their tokens, summed: the one usage figure (session, /info, store)."""

    calls: int = 0
    failed_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls_without_usage: int = 0
    cached_tokens: int = 0  # prompt tokens the servers said they took from their cache

    @property
    def total_tokens(self) -> int:
        """Prompt and completion tokens together."""
        return self.prompt_tokens + self.completion_tokens

    @property
    def uncached_tokens(self) -> int:
        """Prompt tokens the servers computed anew: what a prefix cache did not save."""
        return self.prompt_tokens - self.cached_tokens

    def cache_line(self) -> str:
        """'12,345 prompt tokens, 9,000 cached, 3,345 uncached': the prompt side with what servers cached."""
        return f"{self.prompt_tokens:,} prompt tokens, {self.cached_tokens:,} cached, {self.uncached_tokens:,} uncached"

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
            cached_tokens=self.cached_tokens + completion.cached_tokens,
        )
