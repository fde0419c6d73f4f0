"""Plots in the terminal: drawn inline where the terminal speaks an image protocol, else a line naming `/open N`.

The drawing is textual-image's (a maintained Rich renderable for the kitty graphics protocol and
sixel; iTerm2 3.5+, WezTerm, foot and xterm -ti vt340 answer to sixel). It asks the terminal what
it supports by writing a query and reading the answer from stdin, so the question is asked once,
before the chat's prompt reads stdin. A terminal that speaks neither protocol gets the path and
the command that opens the file in the system viewer (`/open N`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".gif"})
ENV_SWITCH = "TASKWEAVER_LITE_INLINE_IMAGES"  # "0": never draw inline (a terminal that answers but draws badly)
MAX_WIDTH = 100  # columns an inline plot takes at most


class TerminalImages:
    """Whether this terminal can show images inline, and the renderable that does."""

    def __init__(self) -> None:
        self._image_class: Any = None
        self.protocol: str | None = None

    @classmethod
    def detect(cls) -> TerminalImages:
        """Ask the terminal (once; call before the prompt reads stdin); no protocol when it speaks none."""
        images = cls()
        if os.environ.get(ENV_SWITCH, "1") == "0" or os.environ.get("TERM", "dumb") == "dumb":
            return images
        try:
            from textual_image.renderable import Image, SixelImage, TGPImage
        except (ImportError, OSError):  # not installed, or no terminal to ask
            return images
        names = {SixelImage: "sixel", TGPImage: "kitty"}
        images.protocol = names.get(Image)
        images._image_class = Image if images.protocol else None
        return images

    def renderable(self, path: Path, *, width: int) -> Any | None:
        """The image drawn `width` columns wide at most, or None when it cannot be drawn here."""
        if self._image_class is None or path.suffix.lower() not in IMAGE_SUFFIXES or not path.is_file():
            return None
        return self._image_class(str(path), width=min(width, MAX_WIDTH))
