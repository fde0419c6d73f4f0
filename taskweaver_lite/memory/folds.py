"""The fold event: a role's old rounds folded into its summary (or the fold failing), as memory reports it.

It sits here, beside the compression that emits it, and is one of the session's events
(`taskweaver_lite.events` re-exports it): the CLI shows it, the store records it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


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
