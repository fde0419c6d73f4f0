"""Prefix reuse, counted as a model server's cache would: how much of each prompt an earlier prompt began with.

A server keeps the prompts it has seen and recomputes only what follows the longest prefix a new
prompt shares with one of them. Two figures per request, in tokens:

- vs the same role's previous request: one cache slot per role (llama.cpp's `id_slot`); a fold
  that opens with its role's prompt is compared with that role's previous request (its slot);
- vs any earlier request: a prefix tree over everything sent (vLLM's and SGLang's prefix caches);
- vs the role's previous request and the reply generated for it: a slot that keeps what it
  generated (llama.cpp's), counted when a prompt goes on from the whole previous request with an
  assistant message (that reply, as the role replays it).

Messages count as the package counts them (`Tokenizer.count_message`); a message shared in part
counts its framing and the tokens of the shared start of its text.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from taskweaver_lite.llm.tokens import Tokenizer
from taskweaver_lite.records.model_calls import Message

CANDIDATES = 40  # earlier messages compared where prompts part (the newest): enough for the cache's best


@dataclass
class Tally:
    """Sums over a set of requests."""

    requests: int = 0
    prompt: int = 0
    shared_previous: int = 0  # with the same role's previous request
    shared_any: int = 0  # with any earlier request
    shared_slot: int = 0  # with the role's previous request and the reply it generated

    @property
    def uncached(self) -> int:
        """Tokens a prefix cache over every earlier request would still compute."""
        return self.prompt - self.shared_any

    def share(self, part: int) -> float:
        return part / self.prompt if self.prompt else 0.0


@dataclass
class PrefixLedger:
    """Every request's prefix reuse, by role (a request's role: its purpose, a role or a role's folds)."""

    tokenizer: Tokenizer
    tallies: dict[str, Tally] = field(default_factory=lambda: defaultdict(Tally))
    _previous: dict[str, list[Message]] = field(default_factory=dict)
    # hash of a prompt's first k messages -> the (k+1)-th messages earlier prompts went on with
    _next: dict[int, list[Message]] = field(default_factory=lambda: defaultdict(list))

    def add(self, role: str, messages: Sequence[Message], *, slot: str | None = None) -> tuple[int, int, int]:
        """Count one request; returns (prompt tokens, shared with the previous request of its slot, shared with any earlier).

        `slot`: the role whose previous request this one is compared with (a fold that opens with its
        role's prompt goes to the role's slot); by default its own. The role's previous stays the role's."""
        prompt = self.tokenizer.count_messages(messages)
        previous = self._previous.get(slot or role)
        shared_previous = self._shared(messages, previous) if previous is not None else 0
        shared_any = max(self._shared_any(messages), shared_previous)
        shared_slot = shared_previous + self._reply_kept(messages, previous)
        self._remember(messages)
        self._previous[role] = list(messages)
        for tally in (self.tallies[role], self.tallies["all requests"]):
            tally.requests += 1
            tally.prompt += prompt
            tally.shared_previous += shared_previous
            tally.shared_any += shared_any
            tally.shared_slot += shared_slot
        return prompt, shared_previous, shared_any

    def _shared(self, messages: Sequence[Message], earlier: Sequence[Message]) -> int:
        tokens = 0
        for mine, theirs in zip(messages, earlier, strict=False):
            if mine == theirs:
                tokens += self.tokenizer.count_message(mine)
                continue
            return tokens + self._partial(mine, theirs)
        return tokens

    def _reply_kept(self, messages: Sequence[Message], previous: Sequence[Message] | None) -> int:
        """Tokens of the previous request's reply a slot still holds: the assistant message right after all of it."""
        if previous is None or len(messages) <= len(previous) or list(messages[: len(previous)]) != list(previous):
            return 0
        reply = messages[len(previous)]
        return self.tokenizer.count_message(reply) if reply["role"] == "assistant" else 0

    def _partial(self, mine: Message, theirs: Message) -> int:
        """Tokens of a message shared in part: its framing (same role) and its text's common start."""
        if mine["role"] != theirs["role"]:
            return 0
        framing = self.tokenizer.count_message(Message(role=mine["role"], content=""))
        return framing + self.tokenizer.count(_common_start(mine["content"], theirs["content"]))

    def _shared_any(self, messages: Sequence[Message]) -> int:
        tokens, key = 0, 0
        for message in messages:
            candidates = self._next.get(key, [])
            if message in candidates:
                tokens += self.tokenizer.count_message(message)
                key = hash((key, message["role"], message["content"]))
                continue
            return tokens + max((self._partial(message, other) for other in candidates[-CANDIDATES:]), default=0)
        return tokens

    def _remember(self, messages: Sequence[Message]) -> None:
        key = 0
        for message in messages:
            following = self._next[key]
            if message not in following:
                following.append(message)
            key = hash((key, message["role"], message["content"]))


def first_break(messages: Sequence[Message], previous: Sequence[Message] | None) -> str:
    """Where a prompt parts from its role's previous one, as a cause: which part of the prompt changed first.

    "extends" (the previous prompt is its start: only new text is computed), "first", or the part
    that differs first: the system message, a memory section (by its heading), an earlier round's
    message (by its role), or the prompt ending where the previous one went on.
    """
    if previous is None:
        return "first"
    same = 0
    while same < min(len(messages), len(previous)) and messages[same] == previous[same]:
        same += 1
    if same == len(previous):
        return "extends"
    if same == len(messages):
        return "shorter"
    mine, theirs = messages[same], previous[same]
    if mine["role"] == "system":
        return "system message"
    heading = next((line for line in theirs["content"].splitlines() if line.startswith("## ")), "")
    if theirs["content"].startswith("## ") and heading:
        start = _common_start(mine["content"], theirs["content"])
        sections = [line for line in start.splitlines() if line.startswith("## ")]
        return f"memory: {(sections[-1] if sections else heading)[3:].split('(')[0].strip()}"
    return f"message {same} ({theirs['role']})"


def _common_start(a: str, b: str) -> str:
    """The longest common start of `a` and `b` (a binary search on slices)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return a[:low]


def as_messages(raw: Sequence[dict[str, Any]]) -> list[Message]:
    """A recorded request's messages (the JSON a server received) as `Message`s."""
    return [Message(role=m["role"], content=str(m.get("content") or "")) for m in raw]
