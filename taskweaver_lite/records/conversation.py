"""The conversation as values: `Post`, `Round`, `Conversation` and per-role views.

A post is one message between two parties (the User, or a role by its alias: "Planner",
"CodeInterpreter", a project role's alias) with its attachments: the Planner's plan, the
CodeGenerator's thought and code, the execution result and its artifacts, and any typed
attachments a role adds. A round is one user request and every post it caused. A role sees only
the posts it sent or received, and never the posts of failed rounds (except the round still
running). Which roles exist is the role registry's business (roles/registry.py): nothing here
names one. `RoundMessages` is one round as one role's chat messages, the unit that prompts, folds
and the budget guard work in.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from taskweaver_lite.records.execution import ExecutionResult, FoldPiece
from taskweaver_lite.records.model_calls import Message

# A party is "User" or an enabled role's alias (what the Planner's `send_to` names).
Party = str
USER: Party = "User"
RoundState = Literal["running", "finished", "failed"]


@dataclass(frozen=True)
class Attachment:
    """A typed piece a role adds to its post (a passage, a source, a file): shown to the receiving role after the message."""

    kind: str
    content: str

    def to_dict(self) -> dict[str, str]:
        """JSON shape: {kind, content}."""
        return {"kind": self.kind, "content": self.content}


@dataclass(frozen=True)
class Plan:
    """The Planner's plan as it stood when it wrote a post."""

    init_plan: str
    plan: str
    current_plan_step: str

    def to_dict(self) -> dict[str, str]:
        """JSON shape: {init_plan, plan, current_plan_step}."""
        return {"init_plan": self.init_plan, "plan": self.plan, "current_plan_step": self.current_plan_step}


@dataclass(frozen=True)
class Post:
    """One message from one party to another, with its attachments."""

    send_from: Party
    send_to: Party
    message: str
    plan: Plan | None = None
    thought: str | None = None
    code: str | None = None
    execution: ExecutionResult | None = None
    reply_json: str | None = None  # the model's reply as it should be replayed to that model
    attachments: tuple[Attachment, ...] = ()
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    created_at: float = field(default_factory=time.time)

    @property
    def is_answer(self) -> bool:
        """A reply to the user: the round ends with it."""
        return self.send_to == USER and self.send_from != USER

    @property
    def artifacts(self) -> tuple[str, ...]:
        """Files the post's code produced (plots and the like)."""
        return self.execution.artifacts if self.execution else ()

    def to_dict(self) -> dict[str, Any]:
        """JSON shape used by the store and export."""
        return {
            "id": self.id,
            "created_at": self.created_at,
            "send_from": self.send_from,
            "send_to": self.send_to,
            "message": self.message,
            "plan": self.plan.to_dict() if self.plan else None,
            "thought": self.thought,
            "code": self.code,
            "execution": self.execution.to_dict() if self.execution else None,
            "reply_json": self.reply_json,
            "attachments": [a.to_dict() for a in self.attachments],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Post:
        """Inverse of `to_dict`."""
        return cls(
            id=data["id"],
            created_at=data["created_at"],
            send_from=data["send_from"],
            send_to=data["send_to"],
            message=data["message"],
            plan=Plan(**data["plan"]) if data.get("plan") else None,
            thought=data.get("thought"),
            code=data.get("code"),
            execution=ExecutionResult.from_dict(data["execution"]) if data.get("execution") else None,
            reply_json=data.get("reply_json"),
            attachments=tuple(Attachment(kind=str(a["kind"]), content=str(a["content"])) for a in data.get("attachments") or ()),
        )


@dataclass
class Round:
    """One user request and everything it caused."""

    index: int  # 1-based position in the session
    user_query: str
    posts: list[Post] = field(default_factory=list)
    state: RoundState = "running"
    error: str | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    started_at: float = field(default_factory=time.time)

    @property
    def answer(self) -> str | None:
        """The Planner's final message to the user, if the round got that far."""
        for post in reversed(self.posts):
            if post.is_answer:
                return post.message
        return None

    def visible_to(self, party: Party) -> Round:
        """This round with only the posts `party` sent or received."""
        return replace(self, posts=[p for p in self.posts if party in (p.send_from, p.send_to)])

    def to_dict(self) -> dict[str, Any]:
        """JSON shape used by the store and export."""
        return {
            "id": self.id,
            "index": self.index,
            "user_query": self.user_query,
            "state": self.state,
            "error": self.error,
            "started_at": self.started_at,
            "posts": [p.to_dict() for p in self.posts],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Round:
        """Inverse of `to_dict`."""
        return cls(
            id=data["id"],
            index=data["index"],
            user_query=data["user_query"],
            state=data["state"],
            error=data.get("error"),
            started_at=data["started_at"],
            posts=[Post.from_dict(p) for p in data.get("posts", ())],
        )


@dataclass
class Conversation:
    """Every round of a session, in order. Compression changes prompts, never this record."""

    rounds: list[Round] = field(default_factory=list)

    def start_round(self, user_query: str) -> Round:
        """Open a new running round for a user request."""
        new = Round(index=len(self.rounds) + 1, user_query=user_query)
        self.rounds.append(new)
        return new

    def view(self, party: Party) -> list[Round]:
        """The finished rounds as `party` sees them: only its posts; failed and running rounds left out."""
        return [r.visible_to(party) for r in self.rounds if r.state == "finished"]


@dataclass(frozen=True)
class RoundMessages:
    """One finished (or the current) round as one role's chat messages, and as text for a fold."""

    index: int  # Round.index, 1-based
    messages: tuple[Message, ...]
    fold_pieces: tuple[FoldPiece, ...] = ()
    requests: tuple[int, ...] = ()  # positions of the messages that ask (the user's request, a Planner step)
    # The same messages with each execution's output as a one-line placeholder (observation masking);
    # () when the round has no output to mask.
    masked: tuple[Message, ...] = ()
    variables: tuple[str, ...] = ()  # names the round's code created or changed, as its messages say

    @property
    def masked_messages(self) -> tuple[Message, ...]:
        """The round as observation masking shows it once it is old."""
        return self.masked or self.messages

    @property
    def fold_text(self) -> str:
        """The round as plain text for the fold prompt, uncut."""
        return "\n".join(piece.text for piece in self.fold_pieces)
