"""Confirm mode (`chat --confirm`, `execution.confirm`): a person sees each cell before it runs.

The session asks its `ConfirmCell` about every cell the CodeGenerator wrote (after verification):
run it, run an edited version (what runs is what is stored and what the models see later), or
skip it (the CodeGenerator is told the user declined, and may try another way). In a notebook the
cell is handed over instead: put into a new notebook cell for the analyst to run, and the step ends
there (nothing ran, nothing to revise). The terminal's dialog is in `cli/confirm.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class CellChoice:
    """What the person decided about one cell."""

    action: Literal["run", "skip", "hand_over"]
    code: str  # the code to run: the model's, or the person's edit of it

    @classmethod
    def run(cls, code: str) -> CellChoice:
        return cls("run", code)

    @classmethod
    def skip(cls, code: str) -> CellChoice:
        return cls("skip", code)

    @classmethod
    def hand_over(cls, code: str) -> CellChoice:
        """Not run here: the person has the code to run themselves (a notebook's new cell)."""
        return cls("hand_over", code)


# Shown the model's code, returns the person's choice; called on the thread that asked.
ConfirmCell = Callable[[str], CellChoice]

DECLINED = "the user declined to run it"
HANDED_OVER = "it was put into a new cell of the user's notebook, for them to review and run themselves"
EDITED_NOTICE = "The user edited the code before it ran; the code shown is what ran."
