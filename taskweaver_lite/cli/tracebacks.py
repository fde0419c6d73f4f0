"""A failed cell as the screen shows it: the error and the frames of the user's code.

The models read the whole traceback (`ExecutionResult.prompt_text`); a person wants to see what
went wrong and where in their code, not thirty frames of pandas on every retry. The library
frames are counted, and `/last` shows everything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from taskweaver_lite.records.execution import ExecutionResult

# IPython names a frame of code typed into the kernel "Cell In[3], line 2" (older versions: "Input In [3]").
_USER_FRAME = re.compile(r"^(Cell In ?\[\d*\]|Input In ?\[\d*\]|File <ipython-input-)")
_CHAIN_START = "Traceback (most recent call last)"
_TRACEBACK_PIECE = "Traceback (last frames):"


@dataclass(frozen=True)
class ShortTraceback:
    """The user's frames of a traceback (header and the line that raised), and what was left out."""

    frames: tuple[str, ...]
    hidden_frames: int
    hidden_chains: int  # earlier exceptions this one was raised from or during

    def render(self) -> str:
        """The frames, then one line saying what is hidden and how to see it."""
        lines = list(self.frames)
        hidden = []
        if self.hidden_frames:
            hidden.append(f"{self.hidden_frames} library frame{'s' if self.hidden_frames != 1 else ''}")
        if self.hidden_chains:
            hidden.append(f"{self.hidden_chains} earlier exception{'s' if self.hidden_chains != 1 else ''}")
        if hidden:
            lines.append(f"({' and '.join(hidden)} hidden; /last shows the whole traceback)")
        return "\n".join(lines)


def shorten_traceback(traceback: str) -> ShortTraceback:
    """Keep the frames of the user's code from the last exception of the chain; count the rest."""
    chains = traceback.split(_CHAIN_START)
    last = chains[-1]
    frames: list[str] = []
    hidden = 0
    for block in re.split(r"\n\s*\n", last):
        lines = [line for line in block.strip("\n").splitlines() if line.strip()]
        if not lines:
            continue
        if _USER_FRAME.match(lines[0]):
            frames.append("\n".join([lines[0], *(line for line in lines[1:] if line.lstrip().startswith("-"))]))
        elif lines[0].startswith("File "):
            hidden += 1
    return ShortTraceback(frames=tuple(frames), hidden_frames=hidden, hidden_chains=max(len(chains) - 2, 0))


def screen_text(result: ExecutionResult) -> str:
    """What a cell did, for the screen: like the models' text, with the traceback cut to the user's frames."""
    pieces = []
    for piece in result.fold_pieces(marked=False):  # people read it: no data markers
        if piece.text.startswith(_TRACEBACK_PIECE) and result.error is not None:
            short = shorten_traceback(result.error.traceback).render()
            if short:
                pieces.append(short)
        else:
            pieces.append(piece.text)
    return "\n".join(pieces)
