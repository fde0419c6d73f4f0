"""The chat-model seam: `ChatModel.complete(messages) -> Completion`, and the openai-SDK client.

Roles and compression only see `ChatModel`; `OpenAIChatModel` is the real one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, Sequence, TypedDict


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


class ChatModel(Protocol):
    """Anything that answers a list of chat messages with text."""

    def complete(self, messages: Sequence[Message], *, purpose: str) -> Completion:
        """Answer `messages`; `purpose` names the caller (planner, code_generator, compression_planner...)."""
        ...
