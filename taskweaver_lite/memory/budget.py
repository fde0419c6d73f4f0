"""The budget guard: a prompt's parts fitted into the prompt's token budget, shrunk in a documented order.

The parts go out in order of volatility (memory/compression.py explains the order): the system
instructions, the examples, the memory (the variables list and the summary, one user message;
inside the system message with `round_compressor.summary_placement: system`), the retained
rounds, the current round.

Every strategy ends here, so no prompt is ever sent over the budget. What a prompt keeps longest,
in order (the first is never cut):

1. the system instructions and the current round's requests (the user's message, the Planner's
   step), verbatim;
2. the summary of folded rounds;
3. the kernel's variables list;
4. the latest retained round, then older ones.

The current round's outputs (results, tracebacks, earlier attempts) rank below all of these.
So when a prompt must shrink: long messages in retained rounds and in the current round are cut
to a sixteenth of the budget (head and tail kept, with a marker), examples are left out, and
retained rounds are dropped oldest first (the sliding_window order drops rounds before anything
is cut); then the current round's outputs are cut further; then the variables list shows fewer
lines; only then is the summary cut, and it is left out only when not even a short cut fits.
Rounds are kept or dropped whole, so code is never separated from its result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from taskweaver_lite.errors import ContextOverflowError
from taskweaver_lite.llm.tokens import REPLY_PRIMING_TOKENS, Tokenizer
from taskweaver_lite.records.conversation import RoundMessages
from taskweaver_lite.records.model_calls import Message

Placement = Literal["system", "first_user"]
# standard: cut long contents, leave out examples, then drop old rounds (round_compression, none).
# window:   drop old rounds first, then examples: the newest rounds that fit, verbatim (sliding_window).
ShrinkOrder = Literal["standard", "window"]
SEPARATOR = "\n\n"
MIN_CUT_TOKENS = 64
# A summary cut shorter than this says too little to be worth its heading.
MIN_SUMMARY_TOKENS = 48

RenderVariables = Callable[[int], str]  # the variables block within a token cap
_Step = Callable[..., int]  # one way of shrinking a draft; returns its new total


@dataclass(frozen=True)
class PromptParts:
    """Everything a role wants in its prompt, before the budget is applied."""

    system: str
    summary: str  # the rendered summary block, '' when there is none
    placement: Placement
    examples: tuple[Message, ...]
    rounds: tuple[RoundMessages, ...]  # retained history, oldest first
    current: RoundMessages
    variables: RenderVariables | None = None
    variables_cap: int = 0  # the variables list's share of the budget, in tokens


@dataclass(frozen=True)
class PromptCost:
    """Tokens per part of a prompt as sent, and what the guard had to do to fit it."""

    system: int
    examples: int
    summary: int
    variables: int
    retained_rounds: int
    current_round: int
    total: int
    rounds_kept: tuple[int, ...]
    rounds_dropped: tuple[int, ...] = ()
    examples_left_out: bool = False
    summary_cut: bool = False
    summary_left_out: bool = False
    variables_cut: bool = False
    messages_cut: int = 0


@dataclass(frozen=True)
class FittedPrompt:
    """The messages to send, what they cost, and where each earlier round ends among them."""

    messages: tuple[Message, ...]
    cost: PromptCost
    round_ends: tuple[tuple[int, int], ...] = ()  # (round index, messages up to and including it), kept rounds with messages


@dataclass
class _Draft:
    """The prompt being shrunk."""

    parts: PromptParts
    tokenizer: Tokenizer
    rounds: list[tuple[int, list[Message]]]
    current: list[Message]
    summary: str
    variables: str
    with_examples: bool = True
    dropped: list[int] = field(default_factory=list)
    cut: int = 0

    def system_message(self) -> Message:
        blocks = [self.parts.system]
        if self.parts.placement == "system":
            blocks += [block for block in (self.variables, self.summary) if block]
        return Message(role="system", content=SEPARATOR.join(blocks))

    def memory_messages(self) -> list[Message]:
        """The variables list and the summary in one user message after the examples (placement first_user).

        The list comes first: appended notes change the summary at most folds, the list only at a merge."""
        blocks = [block for block in (self.variables, self.summary) if block]
        if blocks and self.parts.placement == "first_user":
            return [Message(role="user", content=SEPARATOR.join(blocks))]
        return []

    def messages(self) -> list[Message]:
        # By volatility: instructions and examples never change, the memory changes at a fold,
        # retained rounds only leave, the current round grows (memory/compression.py says why).
        examples = list(self.parts.examples) if self.with_examples else []
        history = [m for _, messages in self.rounds for m in messages]
        return [self.system_message(), *examples, *self.memory_messages(), *history, *self.current]

    def total(self) -> int:
        return self.tokenizer.count_messages(self.messages())

    def round_ends(self) -> tuple[tuple[int, int], ...]:
        """Per kept earlier round with messages, how many of `messages()` come up to and including it."""
        end = len(self.messages()) - len(self.current) - sum(len(messages) for _, messages in self.rounds)
        ends = []
        for index, messages in self.rounds:
            end += len(messages)
            if messages:
                ends.append((index, end))
        return tuple(ends)

    def cost(self, messages: Sequence[Message]) -> int:
        return sum(self.tokenizer.count_message(m) for m in messages)

    def cut_long(self, messages: list[Message], limit: int, *, keep: Sequence[int] = ()) -> int:
        """Cut every message over `limit` tokens in place, except those at `keep`; returns the tokens saved."""
        saved = 0
        for position, message in enumerate(messages):
            if position in keep:
                continue
            before = self.tokenizer.count(message["content"])
            if before > limit:
                shorter = self.tokenizer.truncate_middle(message["content"], limit)
                messages[position] = Message(role=message["role"], content=shorter)
                saved += before - self.tokenizer.count(shorter)
                self.cut += 1
        return saved


def fit_prompt(parts: PromptParts, *, tokenizer: Tokenizer, budget: int, order: ShrinkOrder, budget_source: str, who: str) -> FittedPrompt:
    """`parts` as chat messages within `budget` tokens; ContextOverflowError if not even the requests fit."""
    variables = parts.variables(parts.variables_cap) if parts.variables is not None else ""
    draft = _Draft(
        parts,
        tokenizer,
        rounds=[(r.index, list(r.messages)) for r in parts.rounds],
        current=list(parts.current.messages),
        summary=parts.summary,
        variables=variables,
    )
    long_limit = max(MIN_CUT_TOKENS, budget // 16)
    total = draft.total()
    steps: tuple[_Step, ...]
    if order == "standard":
        steps = (_cut_rounds, _trim_current, _leave_out_examples, _drop_rounds)
    else:
        steps = (_drop_rounds, _trim_current, _leave_out_examples)
    for step in (*steps, _cut_current, _shrink_variables, _cut_summary):
        if total <= budget:
            break
        total = step(draft, budget=budget, long_limit=long_limit)
    if total > budget:
        raise ContextOverflowError(
            f"The {who}'s prompt does not fit: its instructions and the current request need {total:,} tokens even "
            f"with every earlier round, the examples and the summary left out and every output cut, but the budget "
            f"is {budget:,} tokens ({budget_source}). Raise llm.context_window if the model allows more, or make "
            f"the request shorter."
        )
    cost = _cost(draft, total, variables_cut=draft.variables != variables)
    return FittedPrompt(messages=tuple(draft.messages()), cost=cost, round_ends=draft.round_ends())


def _cut_rounds(draft: _Draft, *, budget: int, long_limit: int) -> int:
    total = draft.total()
    for _, messages in draft.rounds:
        if total <= budget:
            break
        total -= draft.cut_long(messages, long_limit)
    return draft.total()  # joined pieces can count a token differently from their sum: settle on the exact figure


def _leave_out_examples(draft: _Draft, *, budget: int, long_limit: int) -> int:
    if draft.with_examples and draft.parts.examples:
        draft.with_examples = False
    return draft.total()


def _drop_rounds(draft: _Draft, *, budget: int, long_limit: int) -> int:
    total = draft.total()
    while total > budget and draft.rounds:
        index, messages = draft.rounds.pop(0)
        draft.dropped.append(index)
        total -= draft.cost(messages)
    return draft.total()


def _trim_current(draft: _Draft, *, budget: int, long_limit: int) -> int:
    """Cut the current round's long outputs to the size long messages get anywhere (its requests stay whole)."""
    draft.cut_long(draft.current, long_limit, keep=draft.parts.current.requests)
    return draft.total()


def _cut_current(draft: _Draft, *, budget: int, long_limit: int) -> int:
    """Cut the current round's outputs and earlier attempts, never its requests, in halving steps."""
    keep = draft.parts.current.requests
    total, limit = draft.total(), long_limit
    while total > budget and limit >= MIN_CUT_TOKENS // 2:
        draft.cut_long(draft.current, limit, keep=keep)
        total = draft.total()
        limit //= 2
    return total


def _shrink_variables(draft: _Draft, *, budget: int, long_limit: int) -> int:
    render = draft.parts.variables
    total = draft.total()
    if render is None or not draft.variables:
        return total
    over = total - budget
    size = draft.tokenizer.count(draft.variables)
    # The smallest rendering (heading, counts by type, the note) always fits a cap of 0: it stays.
    draft.variables = render(max(size - over, 0))
    return draft.total()


def _cut_summary(draft: _Draft, *, budget: int, long_limit: int) -> int:
    total = draft.total()
    if not draft.summary:
        return total
    room = draft.tokenizer.count(draft.summary) - (total - budget)
    while total > budget and room >= MIN_SUMMARY_TOKENS:
        draft.summary = draft.tokenizer.truncate_middle(draft.parts.summary, room)
        total = draft.total()
        room -= max(total - budget, 1)
    if total > budget:
        draft.summary = ""
        total = draft.total()
    return total


def _cost(draft: _Draft, total: int, *, variables_cut: bool) -> PromptCost:
    tokenizer = draft.tokenizer
    plain_system = tokenizer.count_message(Message(role="system", content=draft.parts.system))
    if draft.parts.placement == "system":
        with_summary = tokenizer.count_message(Message(role="system", content=SEPARATOR.join([draft.parts.system, draft.summary])))
        summary = with_summary - plain_system if draft.summary else 0
        variables = tokenizer.count_message(draft.system_message()) - plain_system - summary
    else:
        memory = draft.cost(draft.memory_messages())
        alone = draft.cost([Message(role="user", content=draft.summary)]) if draft.summary else 0
        summary = alone if draft.variables else memory
        variables = memory - summary
    return PromptCost(
        system=plain_system + REPLY_PRIMING_TOKENS,
        examples=draft.cost(draft.parts.examples) if draft.with_examples else 0,
        summary=summary,
        variables=variables,
        retained_rounds=sum(draft.cost(messages) for _, messages in draft.rounds),
        current_round=draft.cost(draft.current),
        total=total,
        rounds_kept=tuple(index for index, _ in draft.rounds),
        rounds_dropped=tuple(draft.dropped),
        examples_left_out=not draft.with_examples and bool(draft.parts.examples),
        summary_cut=bool(draft.summary) and draft.summary != draft.parts.summary,
        summary_left_out=not draft.summary and bool(draft.parts.summary),
        variables_cut=variables_cut,
        messages_cut=draft.cut,
    )
