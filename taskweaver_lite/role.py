"""What the Planner and the CodeGenerator share: the `Role` base and a model call that must return JSON.

A role renders each round of its view of the conversation as chat messages (once per round), asks
its `RoleContext` for a prompt within the budget, and calls the model. A reply that breaks its
schema gets a repair turn telling the model exactly what was wrong. Repair turns are counted per
round, across both roles (`RepairTurns`), so a confused model cannot loop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from abc import ABC, abstractmethod
from typing import Any, Callable, Sequence

from taskweaver_lite.compression import RoleContext
from taskweaver_lite.conversation import RoleName, Round, RoundMessages
from taskweaver_lite.errors import ReplyFormatError, RoundFailedError
from taskweaver_lite.llm import ChatModel, Message
from taskweaver_lite.replies import ReplySchema, parse_reply, repair_message
from taskweaver_lite.templates import PromptTemplate, load_prompt


@dataclass
class RepairTurns:
    """Repair turns left in the current round."""

    left: int


class Role(ABC):
    """One model role: its template, examples, prompt history and round rendering; `ask` makes its call."""

    def __init__(self, name: RoleName, model: ChatModel, *, context: RoleContext, examples: Sequence[Message]) -> None:
        self.name = name
        self.context = context
        self._model = model
        self._examples = tuple(examples)
        self._prompt: PromptTemplate = load_prompt(name.value)
        self.rendered = RoundRenderCache(self.render_round)

    @abstractmethod
    def render_round(self, rnd: Round) -> RoundMessages:
        """One round (already this role's view) as this role's chat messages and fold text."""

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
        """Build this role's prompt within its budget, call the model, and return the reply's fields."""
        built = self.context.build(
            system=system,
            examples=self._examples,
            history=[self.rendered(r) for r in history],
            current=self.rendered(current),
        )
        return ask_json(self._model, built.messages, schema=schema, purpose=self.name.value, repairs=repairs, on_repair=on_repair)


def ask_json(
    model: ChatModel,
    messages: Sequence[Message],
    *,
    schema: ReplySchema,
    purpose: str,
    repairs: RepairTurns,
    on_repair: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Call the model and return the reply's fields, repairing bad replies while the budget lasts.

    A repair turn repeats the message being answered, so the request (a Planner step, say) stays
    verbatim in the last user message of every call that handles it.
    """
    conversation = list(messages)
    answering = next((m["content"] for m in reversed(conversation) if m["role"] == "user"), "")
    while True:
        completion = model.complete(conversation, purpose=purpose)
        try:
            if completion.finish_reason == "length":
                # json-repair could close the cut-off JSON, but the code or answer inside is incomplete.
                raise ReplyFormatError("the reply was cut off at the model's output limit; answer again, shorter")
            return parse_reply(completion.text, schema)
        except ReplyFormatError as problem:
            if repairs.left <= 0:
                raise RoundFailedError(
                    f"The {schema.name} kept answering in a broken format and the repair turns for this "
                    f"request are used up. Last problem: {problem}"
                ) from None
            repairs.left -= 1
            if on_repair is not None:
                on_repair(str(problem))
            repair = repair_message(problem, schema)
            conversation += [
                Message(role="assistant", content=completion.text),
                Message(role="user", content=f"{repair}\n\nThe message you are answering:\n{answering}" if answering else repair),
            ]


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
