"""Folders that installed packages add through an entry-point group (plugins, roles): one door for third parties.

An entry point names a folder, or a callable that returns one. One that fails to load, or that
names something that is not a folder, is reported with the reason instead of stopping the session.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path


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
    for point in entry_points(group=group):
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
