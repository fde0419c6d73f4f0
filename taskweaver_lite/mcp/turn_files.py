"""The files a turn's own cells wrote in the session's working folder: what `ask` links, and nothing else.

A file's modification time says little: a replay of a resumed session rewrites the files of earlier
rounds, anyone may drop a file in the folder, and a clock may be off. So the folder is listed just
before each of the turn's cells runs (the CodeGenerator says "code_running") and again once its
result is posted; a file is the turn's when it appeared or changed (its size, time or inode) in
between. What happens outside the cells (the replay, the model's thinking) is never counted.
"""

from __future__ import annotations

import os
from pathlib import Path

from taskweaver_lite.records.events import Event, PostAdded, Working

Stamp = tuple[int, int, int]  # inode, size, modification time in ns
MAX_LISTED = 2000  # entries of the folder looked at per listing (a folder with more is not read past them)


class TurnFiles:
    """A session listener: the names of the regular files directly in `folder` that the turn's cells created or changed, in order."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.names: list[str] = []
        self._before: dict[str, Stamp] | None = None

    def __call__(self, event: Event) -> None:
        """Note the folder before a cell runs; after its result is posted, the files it wrote."""
        if isinstance(event, Working) and event.activity == "code_running":
            self._before = listing(self.folder)
        elif isinstance(event, PostAdded) and event.post.execution is not None and self._before is not None:
            before, self._before = self._before, None
            for name, stamp in listing(self.folder).items():
                if before.get(name) != stamp and name not in self.names:
                    self.names.append(name)


def listing(folder: Path) -> dict[str, Stamp]:
    """Each regular file directly in `folder` (no link, no hidden file) by name, with its stamp; empty when it cannot be read."""
    found: dict[str, Stamp] = {}
    try:
        with os.scandir(folder) as entries:
            for number, entry in enumerate(entries):
                if number >= MAX_LISTED:
                    break
                if entry.name.startswith(".") or not entry.is_file(follow_symlinks=False):
                    continue
                info = entry.stat(follow_symlinks=False)
                found[entry.name] = (info.st_ino, info.st_size, info.st_mtime_ns)
    except OSError:
        return {}
    return found
