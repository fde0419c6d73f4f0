"""`taskweaver-lite sessions` (list, `--delete`) and `taskweaver-lite export`: a project's stored sessions,
without the chat's modules (the store and the config only; deleting and exporting import what they need)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from taskweaver_lite.cli.project import project_dir, sessions_command
from taskweaver_lite.config.file import load_config
from taskweaver_lite.errors import TaskWeaverError, UnknownSessionError
from taskweaver_lite.safety.terminal import strip_controls
from taskweaver_lite.store.opening import open_store, store_place, stored_sessions

if TYPE_CHECKING:
    from taskweaver_lite.config.settings import Config


def list_sessions(args: argparse.Namespace) -> int:
    """`taskweaver-lite sessions`: the stored sessions, newest first; `--delete ID` deletes one."""
    project = project_dir(args)
    config = load_config(project)
    if args.delete:
        return _delete_session(config, args.delete, project)
    rows = stored_sessions(config)
    if args.json:
        print(json.dumps([row.to_dict() for row in rows]))
        return 0
    if not rows:
        print(f"No stored sessions in {store_place(config)}.")
        return 0
    owners = any(row.owner for row in rows)  # a store with users: whose each session is (a column only then)
    print(f"{'ID':<24} {'STARTED':<17} {'LAST ACTIVE':<17} {'ROUNDS':>6}  " + (f"{'OWNER':<16} " if owners else "") + "TITLE")
    for row in rows:
        owner = f"{strip_controls(row.owner or '-'):<16} " if owners else ""
        print(f"{row.id:<24} {_stamp(row.started):<17} {_stamp(row.last_active):<17} {row.rounds:>6}  {owner}{strip_controls(row.title)}")
    return 0


def _delete_session(config: Config, ref: str, project: Path) -> int:
    """`taskweaver-lite sessions --delete ID`: the session gone for good (refused while it is open or answering)."""
    from taskweaver_lite.session.assembly import delete_session  # the session stack, only to delete
    from taskweaver_lite.store.interface import Actor, AuditEntry

    store = open_store(config)
    try:
        deleted = delete_session(config, ref, store=store)
        by = Actor.command_line()
        store.audit(AuditEntry(at=time.time(), actor=by.name, action="session-deleted", target=deleted, source=by.source))
    except UnknownSessionError as exc:
        raise exc.listed_with(sessions_command(project)) from None
    finally:
        store.close()
    print(f"Deleted session {deleted}: its rounds, files, kernel and the tips saved from it are gone.")
    return 0


def _stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))


def export_session(args: argparse.Namespace) -> int:
    """`taskweaver-lite export ID [--format ipynb|md] [-o FILE] [--force]`."""
    project = project_dir(args)
    config = load_config(project)
    from taskweaver_lite.session.export import write_export  # nbformat and the kernel's plugin runtime, only to export

    target = Path(args.output) if args.output else None
    try:
        written = write_export(config, args.session_id, fmt=export_format(args.format, target), target=target, force=args.force)
    except UnknownSessionError as exc:
        raise exc.listed_with(sessions_command(project)) from None
    print(f"Wrote {written}", file=sys.stderr)
    return 0


def export_format(fmt: str | None, target: Path | None) -> str:
    """The format asked for, else the one the file name says (.md, .ipynb), else ipynb."""
    if fmt is not None:
        return fmt
    if target is None or target.suffix.lower() == ".ipynb":
        return "ipynb"
    if target.suffix.lower() in (".md", ".markdown"):
        return "md"
    raise TaskWeaverError(f"{target}: cannot tell the format from the file name; name it .ipynb or .md, or pass the format (ipynb or md)")
