"""A tip as a record: what a session taught (an error and its fix, a preference) or a handcrafted one, as the store keeps it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

TipKind = Literal["error_resolution", "preference", "handcrafted"]


DISTILLED_KINDS: tuple[TipKind, ...] = ("error_resolution", "preference")


KIND_LABELS: dict[str, str] = {"error_resolution": "error resolution", "preference": "preference", "handcrafted": "handcrafted"}


@dataclass(frozen=True)
class Tip:
    """One tip: a stored one's id is its number, a handcrafted one's its `exp_id`."""

    id: str
    kind: TipKind
    text: str
    source: str  # the session it was distilled from, or the handcrafted file's name
    created_at: float = 0.0

    @property
    def handcrafted(self) -> bool:
        """Whether it comes from a YAML file in `experience/` (edited there, not in the store)."""
        return self.kind == "handcrafted"

    def to_dict(self) -> dict[str, Any]:
        """JSON shape: {id, kind, text, source, created_at}."""
        return {"id": self.id, "kind": self.kind, "text": self.text, "source": self.source, "created_at": self.created_at}
