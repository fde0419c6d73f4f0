"""The role interface: what a role is handed for each request, and what it gives back.

A role implements one method (`RoleHandler.reply`):

    class Echo:
        def reply(self, request: RoleRequest, tools: RoleTools) -> Post:
            return request.answer(request.message)

`request` holds the post that asks (its `message`, its `sender`'s alias, its attachments), the
role's own history view (`history`: the finished rounds with only the posts it sent or received;
`current`: the running round the same way, the request last) and the turn's helpers. `tools` is
what the session lends the role: its model (`tools.complete(messages)`, counted and routed to
`<role>.llm`), a prompt of its history within its budget, folded by its own compression
(`tools.prompt(system, request)`), the project and working folders, and its own config section and
role-file options. The reply is a post from the role back to the sender (`request.answer(text)`),
with typed attachments when it has them. A role with a prompt and no class is a `ModelOnlyRole`:
its prompt as the system message, its own history, and the model's text as the answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from taskweaver_lite.config.settings import RoleConfig
from taskweaver_lite.llm.client import ChatModel, DeltaSink
from taskweaver_lite.llm.templates import render_text
from taskweaver_lite.memory.compression import RoleContext
from taskweaver_lite.records.conversation import Attachment, Post, Round, RoundMessages
from taskweaver_lite.records.events import Event
from taskweaver_lite.records.execution import FoldPiece
from taskweaver_lite.records.model_calls import Message
from taskweaver_lite.roles.role import RepairTurns, RoundRenderCache


@dataclass(frozen=True)
class Turn:
    """The running request's helpers: its repair turns, a way to add posts on the way, and the session's events."""

    repairs: RepairTurns
    add_post: Callable[[Post], None]
    notify: Callable[[Event], None]


@dataclass(frozen=True)
class RoleRequest:
    """One post for a role, with the role's own view of the conversation."""

    post: Post  # the post that asks; already the last of `current`
    history: Sequence[Round]  # earlier finished rounds, only the posts this role sent or received
    live: Round  # the running round, every post (read `current` for this role's view)
    turn: Turn

    @property
    def current(self) -> Round:
        """The running round as this role sees it now: only the posts it sent or received, the request last."""
        return self.live.visible_to(self.post.send_to)

    @property
    def message(self) -> str:
        """What the sender asks."""
        return self.post.message

    @property
    def sender(self) -> str:
        """The sender's alias ("Planner", or "User" for the role the user talks to)."""
        return self.post.send_from

    def answer(self, message: str, *, attachments: Sequence[Attachment] = ()) -> Post:
        """The reply post: from this role back to the sender."""
        return Post(send_from=self.post.send_to, send_to=self.post.send_from, message=message, attachments=tuple(attachments))


@dataclass(frozen=True)
class RoleTools:
    """What the session lends a role: its model, its prompt history, its folders and settings."""

    key: str  # config section, stored summary and model-call purpose
    alias: str
    config: RoleConfig  # the role's own section: its file's keys with the project config's over them
    options: Mapping[str, Any]  # the role file's other keys, for the role's own use
    model: ChatModel
    context: RoleContext
    project_dir: Path
    working_dir: Path
    prompt: str = ""  # the role file's `prompt` (Jinja2; `alias` and `intro` are given to it)
    intro: str = ""
    on_delta: DeltaSink | None = None
    rendered: RoundRenderCache = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rendered", RoundRenderCache(lambda rnd: render_worker_round(rnd, alias=self.alias)))

    def complete(self, messages: Sequence[Message], *, max_tokens: int | None = None) -> str:
        """Call the role's model (`<role>.llm`) with `messages`; the reply's text. LLMError when it cannot answer."""
        return self.model.complete(messages, purpose=self.key, max_tokens=max_tokens, on_delta=self.on_delta).text

    def prompt_for(self, request: RoleRequest, *, system: str) -> list[Message]:
        """`system`, then the role's history (folded by its compression) and the request, within its budget."""
        history = [self.rendered(rnd) for rnd in request.history]
        built = self.context.build(system=system, examples=(), history=history, current=self.rendered(request.current))
        return list(built.messages)

    def system_prompt(self) -> str:
        """The role file's `prompt` rendered with the role's alias and intro."""
        return render_text(self.prompt, alias=self.alias, intro=self.intro).strip()


class RoleHandler(Protocol):
    """A role's behaviour: one method, a request in and a reply post out."""

    def reply(self, request: RoleRequest, tools: RoleTools) -> Post:
        """Answer `request`; the post goes back to its sender (`request.answer(...)`)."""
        ...


class BuiltRole(Protocol):
    """A role as the session runs it: the Planner, the CodeGenerator, or any other role's handler with its rendering."""

    def reply(self, request: RoleRequest, tools: RoleTools) -> Post:
        """Answer `request`."""
        ...

    def render(self, rnd: Round) -> RoundMessages:
        """One round of the role's view as its chat messages (its folds read them too)."""
        ...

    def take_tips(self, tips: Callable[[str], str]) -> None:
        """Show the experience tips that fit a request, when the role's prompt has room for them (others ignore them)."""
        ...


class ModelOnlyRole:
    """A role declared by YAML alone: its prompt and its own history go to its model; the text comes back."""

    def reply(self, request: RoleRequest, tools: RoleTools) -> Post:
        """The model's answer to the request, in text."""
        return request.answer(tools.complete(tools.prompt_for(request, system=tools.system_prompt())).strip())


def render_worker_round(rnd: Round, *, alias: str) -> RoundMessages:
    """One round as a worker role's chat messages: what it was asked (with attachments) and what it answered."""
    messages: list[Message] = []
    pieces: list[FoldPiece] = []
    requests: list[int] = []
    for post in rnd.posts:
        text = _with_attachments(post)
        if post.send_to == alias and post.send_from != alias:
            requests.append(len(messages))
            messages.append(Message(role="user", content=f"{post.send_from}: {text}"))
            pieces.append(FoldPiece(f"{post.send_from} asked: {post.message}", essential=True))
        elif post.send_from == alias:
            messages.append(Message(role="assistant", content=text))
            pieces.append(FoldPiece(f"{alias} answered: {post.message}", essential=True))
    return RoundMessages(index=rnd.index, messages=tuple(messages), fold_pieces=tuple(pieces), requests=tuple(requests))


def _with_attachments(post: Post) -> str:
    parts = [post.message, *(f"[{a.kind}]\n{a.content}" for a in post.attachments)]
    return "\n\n".join(part for part in parts if part)
