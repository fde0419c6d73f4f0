"""Confirm mode (`chat --confirm`, `execution.confirm`): a person sees each cell before it runs.

The session asks its `ConfirmCell` about every cell the CodeGenerator wrote (after verification):
run it, run an edited version (what runs is what is stored and what the models see later), or
skip it (the CodeGenerator is told the user declined). The terminal's dialog is in `cli/confirm.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class CellChoice:
    """What the person decided about one cell."""

    action: Literal["run", "skip"]
    code: str  # the code to run: the model's, or the person's edit of it

    @classmethod
    def run(cls, code: str) -> CellChoice:
        return cls("run", code)

    @classmethod
    def skip(cls, code: str) -> CellChoice:
        return cls("skip", code)


# Shown the model's code, returns the person's choice; called on the thread that asked.
ConfirmCell = Callable[[str], CellChoice]

DECLINED = "the user declined to run it"
EDITED_NOTICE = "The user edited the code before it ran; the code shown is what ran."
