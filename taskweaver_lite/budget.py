"""The budget guard: a prompt's parts fitted into the token budget, shrunk in a fixed order.

Every strategy ends here, so no prompt is ever sent over the budget. Rounds are kept or dropped
whole, so code is never separated from its result; the current round is never dropped, and its
last message stays verbatim unless nothing else can make room.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Sequence

from taskweaver_lite.errors import ContextOverflowError
from taskweaver_lite.llm import Message
from taskweaver_lite.tokens import REPLY_PRIMING_TOKENS, Tokenizer

if TYPE_CHECKING:
    from taskweaver_lite.compression import RoundMessages

Placement = Literal["system", "first_user"]
# standard: cut long contents, leave out examples, then drop old rounds (round_compression, none).
# window:   drop old rounds first, then examples: the newest rounds that fit, verbatim (sliding_window).
ShrinkOrder = Literal["standard", "window"]
SUMMARY_SEPARATOR = "\n\n"
MIN_CUT_TOKENS = 64


@dataclass(frozen=True)
class PromptParts:
    """Everything a role wants in its prompt, before the budget is applied."""

    system: str
    summary: str  # the rendered summary block, '' when there is none
    placement: Placement
    examples: tuple[Message, ...]
    rounds: tuple[RoundMessages, ...]  # retained history, oldest first
    current: RoundMessages


@dataclass(frozen=True)
class FittedPrompt:
    """The messages to send, what each part costs, and what the guard had to do."""

    messages: tuple[Message, ...]
    system: int
    examples: int
    summary: int
    retained_rounds: int
    current_round: int
    total: int
    rounds_kept: tuple[int, ...]
    rounds_dropped: tuple[int, ...] = ()
    examples_left_out: bool = False
    summary_left_out: bool = False
    messages_cut: int = 0


@dataclass
class _Draft:
    """The prompt being shrunk, with each part's cost kept current."""

    parts: PromptParts
    tokenizer: Tokenizer
    rounds: list[tuple[int, list[Message]]]
    current: list[Message]
    with_examples: bool = True
    with_summary: bool = True
    dropped: list[int] = field(default_factory=list)
    cut: int = 0

    def system_message(self) -> Message:
        text = self.parts.system
        if self.with_summary and self.parts.summary and self.parts.placement == "system":
            text += SUMMARY_SEPARATOR + self.parts.summary
        return Message(role="system", content=text)

    def summary_messages(self) -> list[Message]:
        if self.with_summary and self.parts.summary and self.parts.placement == "first_user":
            return [Message(role="user", content=self.parts.summary)]
        return []

    def messages(self) -> list[Message]:
        examples = list(self.parts.examples) if self.with_examples else []
        history = [m for _, messages in self.rounds for m in messages]
        return [self.system_message(), *self.summary_messages(), *examples, *history, *self.current]

    def total(self) -> int:
        return self.tokenizer.count_messages(self.messages())

    def cost(self, messages: Sequence[Message]) -> int:
        return sum(self.tokenizer.count_message(m) for m in messages)

    def cut_long(self, messages: list[Message], limit: int) -> int:
        """Cut every message over `limit` tokens in place; returns the tokens saved."""
        saved = 0
        for position, message in enumerate(messages):
            before = self.tokenizer.count(message["content"])
            if before > limit:
                shorter = self.tokenizer.truncate_middle(message["content"], limit)
                messages[position] = Message(role=message["role"], content=shorter)
                saved += before - self.tokenizer.count(shorter)
                self.cut += 1
        return saved


def fit_prompt(parts: PromptParts, *, tokenizer: Tokenizer, budget: int, order: ShrinkOrder, budget_source: str, who: str) -> FittedPrompt:
    """`parts` as chat messages within `budget` tokens; ContextOverflowError if the current round cannot fit."""
    draft = _Draft(parts, tokenizer, rounds=[(r.index, list(r.messages)) for r in parts.rounds], current=list(parts.current.messages))
    total = draft.total()
    long_limit = max(MIN_CUT_TOKENS, budget // 16)

    def drop_rounds() -> None:
        nonlocal total
        while total > budget and draft.rounds:
            index, messages = draft.rounds.pop(0)
            draft.dropped.append(index)
            total -= draft.cost(messages)

    def cut_rounds() -> None:
        nonlocal total
        for _, messages in draft.rounds:
            if total <= budget:
                return
            total -= draft.cut_long(messages, long_limit)

    def leave_out_examples() -> None:
        nonlocal total
        if total > budget and draft.with_examples and parts.examples:
            draft.with_examples = False
            total -= draft.cost(parts.examples)

    steps = (cut_rounds, leave_out_examples, drop_rounds) if order == "standard" else (drop_rounds, leave_out_examples)
    for step in steps:
        step()
    # Joined pieces can count a token differently from their sum: settle on the exact figure.
    total = draft.total()
    if total > budget:
        total = _shrink_current(draft, budget=budget, long_limit=long_limit)
    if total > budget:
        raise ContextOverflowError(
            f"The {who}'s prompt does not fit: the current round alone needs {total:,} tokens with the system "
            f"prompt, even with all earlier rounds, the examples and the summary left out and long messages cut, "
            f"but the budget is {budget:,} tokens ({budget_source}). Raise llm.context_window if the model "
            f"allows more, or make the request or its output shorter."
        )
    return _fitted(draft, total)


def _shrink_current(draft: _Draft, *, budget: int, long_limit: int) -> int:
    """Last resorts, in order: cut the current round's earlier messages, drop the summary, cut its last message."""
    total = draft.total()
    earlier = draft.current[:-1]
    limit = long_limit
    while total > budget and earlier and limit >= MIN_CUT_TOKENS:
        draft.cut_long(earlier, limit)
        draft.current[:-1] = earlier
        total = draft.total()
        limit //= 2
    if total > budget and draft.parts.summary:
        draft.with_summary = False
        total = draft.total()
    if total > budget and draft.current:
        last = draft.current[-1]
        room = draft.tokenizer.count(last["content"]) - (total - budget)
        while total > budget and room > 0:
            draft.current[-1] = Message(role=last["role"], content=draft.tokenizer.truncate_middle(last["content"], room))
            total = draft.total()
            room -= max(total - budget, 1)
        if total <= budget:
            draft.cut += 1
        else:
            draft.current[-1] = last
            total = draft.total()
    return total


def _fitted(draft: _Draft, total: int) -> FittedPrompt:
    tokenizer = draft.tokenizer
    plain_system = tokenizer.count_message(Message(role="system", content=draft.parts.system))
    summary = tokenizer.count_message(draft.system_message()) - plain_system + draft.cost(draft.summary_messages())
    return FittedPrompt(
        messages=tuple(draft.messages()),
        system=plain_system + REPLY_PRIMING_TOKENS,
        examples=draft.cost(draft.parts.examples) if draft.with_examples else 0,
        summary=summary,
        retained_rounds=sum(draft.cost(messages) for _, messages in draft.rounds),
        current_round=draft.cost(draft.current),
        total=total,
        rounds_kept=tuple(index for index, _ in draft.rounds),
        rounds_dropped=tuple(draft.dropped),
        examples_left_out=not draft.with_examples and bool(draft.parts.examples),
        summary_left_out=not draft.with_summary and bool(draft.parts.summary),
        messages_cut=draft.cut,
    )
