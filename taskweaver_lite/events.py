"""Session events: what the CLI renders and the store records, as they happen.

The session emits these to its listeners; listeners observe, they never drive the turn.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from taskweaver_lite.llm.client import Delta
from taskweaver_lite.memory.conversation import Post, Round
from taskweaver_lite.memory.folds import Folded as Folded  # a session event like the others, defined beside the compression that emits it

Activity = Literal["planner_thinking", "code_writing", "code_running", "repairing", "role_working"]


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
class ReplyStreamed:
    """A piece of a role's reply arrived while it streams (for live display only: not recorded, not parsed)."""

    role: str  # the role's key (registry.RoleSpec.key)
    delta: Delta
    alias: str = ""  # the role's alias, for the screen


@dataclass(frozen=True)
class CellPrinted:
    """A running cell printed `text` on `stream` (stdout or stderr): for live display only, not recorded."""

    stream: str
    text: str


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
    cached_tokens: int = 0  # of prompt_tokens, those the server said it took from its prefix cache


@dataclass(frozen=True)
class FileLoaded:
    """The user copied a data file into the working folder (`/load`) after `after_round` rounds."""

    name: str  # its name in the working folder
    source: str  # where it was copied from
    after_round: int
    at: float

    def describe(self) -> str:
        """One line for the user and the exports: 'Loaded sales.csv (from /data/sales.csv)'."""
        return f"Loaded {self.name} into the working folder (from {self.source})"

    def to_dict(self) -> dict[str, Any]:
        """JSON shape: the fields by name."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FileLoaded:
        """Inverse of `to_dict`."""
        return cls(name=str(data["name"]), source=str(data["source"]), after_round=int(data["after_round"]), at=float(data["at"]))


Event = RoundStarted | PostAdded | Working | ReplyStreamed | CellPrinted | RoundEnded | ModelCalled | Folded | FileLoaded
Listener = Callable[[Event], None]


def timeline(rounds: Sequence[Round], loads: Sequence[FileLoaded]) -> Iterator[Round | FileLoaded]:
    """Rounds and file loads in the order they happened (a load goes before the round that followed it)."""
    pending = sorted(loads, key=lambda load: (load.after_round, load.at))
    for rnd in rounds:
        while pending and pending[0].after_round < rnd.index:
            yield pending.pop(0)
        yield rnd
    yield from pending
