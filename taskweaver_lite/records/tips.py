"""A tip as a record: what a session taught (an error and its fix, a preference) or a handcrafted one, as the store keeps it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

# handcrafted: written by a person (TaskWeaver's handcrafted_exp_*.yaml); taskweaver: distilled by TaskWeaver's
# experience generator from one of its conversations (an exp_*.yaml with no handcrafted twin).
TipKind = Literal["error_resolution", "preference", "handcrafted", "taskweaver"]


DISTILLED_KINDS: tuple[TipKind, ...] = ("error_resolution", "preference")


KIND_LABELS: dict[str, str] = {
    "error_resolution": "error resolution",
    "preference": "preference",
    "handcrafted": "handcrafted",
    "taskweaver": "from TaskWeaver",
}
FILE_KINDS: tuple[TipKind, ...] = ("handcrafted", "taskweaver")  # tips read from the experience folder, not the store


@dataclass(frozen=True)
class Tip:
    """One tip: a stored one's id is its number, a handcrafted one's its `exp_id`."""

    id: str
    kind: TipKind
    text: str
    source: str  # the session it was distilled from, or the handcrafted file's name
    created_at: float = 0.0

    @property
    def from_file(self) -> bool:
        """Whether it comes from a YAML file in `experience/` (edited there, not in the store)."""
        return self.kind in FILE_KINDS

    def to_dict(self) -> dict[str, Any]:
        """JSON shape: {id, kind, text, source, created_at}."""
        return {"id": self.id, "kind": self.kind, "text": self.text, "source": self.source, "created_at": self.created_at}
