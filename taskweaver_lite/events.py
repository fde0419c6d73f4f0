"""Session events: what the CLI renders and the store records, as they happen.

The session emits these to its listeners; listeners observe, they never drive the turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Union

from taskweaver_lite.conversation import Post, Round
from taskweaver_lite.summary import FoldEvent as Folded

Activity = Literal["planner_thinking", "code_writing", "code_running", "repairing"]


@dataclass(frozen=True)
class RoundStarted:
    """A user request opened a round."""

    round: Round


@dataclass(frozen=True)
class PostAdded:
    """A party sent a post within the running round."""

    round: Round
    post: Post


@dataclass(frozen=True)
class Working:
    """Someone started working on something (for live progress)."""

    activity: Activity
    detail: str = ""


@dataclass(frozen=True)
class RoundEnded:
    """The round finished or failed; `round.state` and `round.error` say which."""

    round: Round


@dataclass(frozen=True)
class ModelCalled:
    """One chat-model call finished (or failed), with its cost."""

    purpose: str
    prompt_tokens: int
    completion_tokens: int
    latency: float
    ok: bool
    error: str | None = None
    prompt: tuple[dict[str, str], ...] | None = None
    reply: str | None = None


# A role's old rounds were folded into a summary in the background (or the fold failed): `Folded`,
# the compressor's own FoldEvent, re-exported here so listeners find every event in one place.
Event = Union[RoundStarted, PostAdded, Working, RoundEnded, ModelCalled, Folded]
Listener = Callable[[Event], None]
