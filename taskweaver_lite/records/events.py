"""Session events: what the CLI renders and the store records, as they happen.

The session emits these to its listeners; listeners observe, they never drive the turn. `Folded` is
what memory reports when a role's old rounds fold into its summary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from taskweaver_lite.records.conversation import Post, Round
from taskweaver_lite.records.model_calls import Delta

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
    model: str = ""  # the model asked for, when the client knows it


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


@dataclass(frozen=True)
class Folded:
    """A role's old rounds were folded into its summary in the background, or the fold failed."""

    role: str  # the role's key (registry.RoleSpec.key)
    first_round: int
    last_round: int
    tokens_before: int
    tokens_after: int
    ok: bool
    error: str | None = None
    label: str = ""  # the role's name on screen (the key when not given)

    def describe(self) -> str:
        """One line for the user: 'Planner: folded rounds 1-4, 5,210 -> 380 tokens'."""
        rounds = span(self.first_round, self.last_round)
        if self.ok:
            return f"{self.label or self.role}: folded {rounds}, {self.tokens_before:,} -> {self.tokens_after:,} tokens"
        return f"{self.label or self.role}: could not fold {rounds} ({self.error}); they stay verbatim and the fold is retried later"

    def to_dict(self) -> dict[str, Any]:
        """JSON shape: the fields by name."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Folded:
        """Inverse of `to_dict`."""
        return cls(
            role=str(data["role"]),
            first_round=int(data["first_round"]),
            last_round=int(data["last_round"]),
            tokens_before=int(data["tokens_before"]),
            tokens_after=int(data["tokens_after"]),
            ok=bool(data["ok"]),
            error=data.get("error"),
            label=str(data.get("label") or ""),
        )


def span(first: int, last: int) -> str:
    """'round 3' or 'rounds 1-4'."""
    return f"round {first}" if first == last else f"rounds {first}-{last}"


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
