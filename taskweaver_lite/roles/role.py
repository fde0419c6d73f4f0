"""What the Planner and the CodeGenerator share: the `Role` base and a model call that must return JSON.

A role renders each round of its view of the conversation as chat messages (once per round), asks
its `RoleContext` for a prompt within the budget, and calls the model. A reply that breaks its
schema gets a repair turn telling the model exactly what was wrong. While a reply streams its pieces
go to the role's `on_delta` (the screen); only the finished reply is parsed. Repair turns are counted per
round, across both roles (`RepairTurns`), so a confused model cannot loop.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from taskweaver_lite.errors import ReplyFormatError, RoundFailedError
from taskweaver_lite.llm.client import ChatModel, DeltaSink
from taskweaver_lite.llm.replies import ReplySchema, parse_reply, repair_message
from taskweaver_lite.llm.templates import PromptTemplate, load_prompt
from taskweaver_lite.memory.compression import SUMMARISING, RoleContext
from taskweaver_lite.records.conversation import Round, RoundMessages
from taskweaver_lite.records.model_calls import Completion, Message

# A bad reply echoed in a repair turn takes at most this fraction of the prompt budget.
ECHO_SHARE = 4


# An earlier round's outputs in a role's leaner view: a thirty-second of the budget each (179 tokens
# at an 8k window, 3,800 at 128k), never under this many tokens.
EARLIER_OUTPUT_SHARE = 32
MIN_EARLIER_OUTPUT_TOKENS = 64


@dataclass
class RepairTurns:
    """Repair turns left in the current round."""

    left: int


class Role(ABC):
    """One model role: its template, examples, prompt history and round rendering; `ask` makes its call."""

    def __init__(
        self,
        key: str,
        model: ChatModel,
        *,
        party: str,
        context: RoleContext,
        examples: Sequence[Message],
        on_delta: DeltaSink | None = None,
    ) -> None:
        """`key` names the prompt file and the call purpose; `party` is the role's alias in the conversation."""
        self.key = key
        self.party = party
        self.context = context
        self._model = model
        self._on_delta = on_delta  # the reply's pieces as they stream, for the screen; never read back
        self._examples = tuple(examples)
        self._prompt: PromptTemplate = load_prompt(key)
        self.rendered = RoundRenderCache(self.render_round)
        self.rendered_earlier = RoundRenderCache(self.render_earlier_round)
        # The experience tips that fit a request (its text in, prompt text out), set by the session.
        self.experience: Callable[[str], str] | None = None

    def render(self, rnd: Round) -> RoundMessages:
        """One round of the role's view as its chat messages (its folds read them too)."""
        return self.rendered(rnd)

    def take_tips(self, tips: Callable[[str], str]) -> None:
        """Show in this role's prompt the experience tips `tips` gives for a request's text."""
        self.experience = tips

    @abstractmethod
    def render_round(self, rnd: Round) -> RoundMessages:
        """One round (already this role's view) as this role's chat messages and fold text."""

    def render_earlier_round(self, rnd: Round) -> RoundMessages:
        """A retained earlier round as this role's prompt shows it: by default as `render_round` does."""
        return self.render_round(rnd)

    def cut_earlier_output(self, text: str) -> str:
        """What an earlier round's cell printed, as a role's leaner view of it shows it: head and tail,
        within a share of the budget. The role saw it whole when it was current; the full output's
        file is named beside it. Strategies without a summary (`none`, the windows, masking) show
        the rounds they keep as they were."""
        if self.context.strategy not in SUMMARISING:
            return text
        return self.context.tokenizer.truncate_middle(text, max(MIN_EARLIER_OUTPUT_TOKENS, self.context.budget // EARLIER_OUTPUT_SHARE))

    def ask(
        self,
        *,
        system: str,
        history: Sequence[Round],
        current: Round,
        schema: ReplySchema,
        repairs: RepairTurns,
        on_repair: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """Call the model with this role's prompt and return the reply's fields, repairing bad replies.

        A repair turn is the prompt rebuilt with room for the bad reply (cut to a quarter of the
        budget) and a message saying what was wrong, which repeats the request being worked on, so
        a Planner step stays verbatim in the last user message of every call that handles it. Each
        repair turn fits the budget like any prompt; only the latest bad reply is shown.
        """
        # Rounds that finished since the shown memory landed keep their detail until the next fold (compression.py).
        detailed = self.context.detailed_from(current.index)
        rendered_history = [self.rendered(r) if r.index >= detailed else self.rendered_earlier(r) for r in history]
        now = self.rendered(current)
        request = now.messages[now.requests[-1]]["content"] if now.requests else ""
        now = with_tips(now, self.experience(request) if self.experience is not None and request else "")
        tokenizer = self.context.tokenizer
        repair: list[Message] = []
        while True:
            reserve = tokenizer.count_messages(repair) if repair else 0
            built = self.context.build(system=system, examples=self._examples, history=rendered_history, current=now, reserve=reserve)
            completion = self._model.complete([*built.messages, *repair], purpose=self.key, on_delta=self._on_delta, schema=schema)
            try:
                return _read(completion, schema)
            except ReplyFormatError as problem:
                if repairs.left <= 0:
                    raise RoundFailedError(
                        f"The {schema.name} kept answering in a broken format and the repair turns for this request are used up. Last problem: {problem}"
                    ) from None
                repairs.left -= 1
                if on_repair is not None:
                    on_repair(str(problem))
                text = repair_message(problem, schema)
                echo = tokenizer.truncate_middle(completion.text, self.context.budget // ECHO_SHARE)
                repair = [
                    Message(role="assistant", content=echo),
                    Message(role="user", content=f"{text}\n\nThe message you are answering:\n{request}" if request else text),
                ]


def with_tips(now: RoundMessages, tips: str) -> RoundMessages:
    """The current round with the experience tips in a message of their own before it ('' for none).

    After the static instructions, the memory and the retained rounds, as the prompt order by
    volatility wants (memory/compression.py): tips change with the request, so they sit with it,
    and a round shown with tips is retained without them.
    """
    if not tips:
        return now
    return replace(now, messages=(Message(role="user", content=tips), *now.messages), requests=tuple(i + 1 for i in now.requests))


def _read(completion: Completion, schema: ReplySchema) -> dict[str, Any]:
    if completion.finish_reason == "length":
        # json-repair could close the cut-off JSON, but the code or answer inside is incomplete.
        raise ReplyFormatError("the reply was cut off at the model's output limit; answer again, shorter")
    return parse_reply(completion.text, schema)


def as_reply_json(fields: dict[str, Any], *, wrapper: str | None = "response") -> str:
    """The reply as clean JSON, the form it is replayed to the model in later prompts."""
    return json.dumps({wrapper: fields} if wrapper else fields, ensure_ascii=False)


class RoundRenderCache:
    """Remembers each round's rendering: finished rounds never change, so each is rendered once."""

    def __init__(self, render: Callable[[Round], RoundMessages]) -> None:
        self._render = render
        self._done: dict[str, tuple[tuple[str, ...], RoundMessages]] = {}

    def __call__(self, rnd: Round) -> RoundMessages:
        """The round's messages; rendered again only when its posts differ from last time."""
        # Keyed by the posts themselves, not their count: two views of a round can hold as many posts.
        posts = tuple(p.id for p in rnd.posts)
        cached = self._done.get(rnd.id)
        if cached is not None and cached[0] == posts:
            return cached[1]
        rendered = self._render(rnd)
        self._done[rnd.id] = (posts, rendered)
        return rendered
