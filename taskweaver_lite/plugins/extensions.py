"""Folders that installed packages add through an entry-point group (plugins, roles): one door for third parties.

An entry point names a folder, or a callable that returns one. One that fails to load, or that
names something that is not a folder, is reported with the reason instead of stopping the session.
Reading the installed packages' entry points takes ~15 ms and every new session asks, so they are
kept until a folder on the import path changes (a package installed or removed there).
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

_seen: dict[str, tuple[tuple[tuple[str, int], ...], tuple[EntryPoint, ...]]] = {}  # group -> (the import path's folders and times, its points)
_seen_lock = threading.Lock()


@dataclass(frozen=True)
class BrokenEntryPoint:
    """An entry point that gave no folder: its name, `name = value` as written, and why."""

    name: str
    where: str
    problem: str


def extension_folders(project_folder: Path, *, group: str) -> tuple[list[tuple[Path, str]], list[BrokenEntryPoint]]:
    """The project's folder (when it exists) then each entry point's, with where each came from; and the broken ones."""
    folders: list[tuple[Path, str]] = [(project_folder, "project")] if project_folder.is_dir() else []
    broken: list[BrokenEntryPoint] = []
    for point in installed_entry_points(group):
        where = f"entry point {point.name} = {point.value}"
        try:
            target = point.load()
            folder = Path(target() if callable(target) else target)
        except Exception as exc:  # noqa: BLE001 - a broken third-party package must not stop the session
            broken.append(BrokenEntryPoint(point.name, where, f"could not be loaded ({type(exc).__name__}: {exc})"))
            continue
        if folder.is_dir():
            folders.append((folder, f"entry point {point.name}"))
        else:
            broken.append(BrokenEntryPoint(point.name, where, f"names {folder}, which is not a folder"))
    return folders, broken


def installed_entry_points(group: str) -> tuple[EntryPoint, ...]:
    """The installed packages' entry points in `group`, read again only when a folder on `sys.path` has changed."""
    stamp = tuple((folder, _modified(folder)) for folder in sys.path)
    with _seen_lock:
        seen = _seen.get(group)
        if seen is not None and seen[0] == stamp:
            return seen[1]
    points = tuple(entry_points(group=group))
    with _seen_lock:
        _seen[group] = (stamp, points)
    return points


def _modified(folder: str) -> int:
    """A folder's modification time in ns (a package's metadata folder added or removed changes it); -1 when absent."""
    try:
        return os.stat(folder or ".").st_mtime_ns
    except OSError:
        return -1
