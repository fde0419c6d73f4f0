"""`taskweaver-lite audit`: the audit trail the store keeps, oldest first.

    taskweaver-lite audit -p project                         # time (UTC), actor, action, target, source, detail
    taskweaver-lite audit --since 2026-12-01T00:00 --json    # one JSON array; --since is ISO 8601 (UTC without an offset)

What is written: sign-ins and sign-outs on the page, refused tokens, users added, removed, promoted,
demoted, rotated and given an expiry (by `users` or on the admin page), sessions deleted, and an
admin opening a session another user owns. The program only ever appends to it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time

from taskweaver_lite.errors import TaskWeaverError


def add_audit_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `audit` command and its options."""
    audit = commands.add_parser("audit", help="the audit trail: sign-ins, refused tokens, user changes, session deletes, admins in others' sessions")
    audit.add_argument("-p", "--project", dest="project", default=None, metavar="PROJECT_DIR", help="project folder (default: ./project)")
    audit.add_argument("--since", type=since_time, default=None, metavar="ISO_TIME", help="only entries from then on (ISO 8601; UTC without an offset)")
    audit.add_argument("--json", action="store_true", help="one JSON array on stdout: {id, time, at, actor, action, target, source, detail}")
    audit.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a config key (e.g. store.url); repeatable")


def since_time(text: str) -> float:
    """`--since`: an ISO 8601 time (a date alone, or with a time; UTC unless it names an offset) as epoch seconds."""
    try:
        moment = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time, such as 2026-12-01 or 2026-12-01T09:30:00Z") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.timestamp()


def run_audit(args: argparse.Namespace) -> int:
    """Print the audit trail (from `--since`), as a table or as JSON; the exit code."""
    from taskweaver_lite.cli.project import project_dir
    from taskweaver_lite.config.file import load_config
    from taskweaver_lite.store.opening import has_store, open_store, store_place

    config = load_config(project_dir(args), args.overrides)
    if not has_store(config):
        if args.json:
            print("[]")
            return 0
        raise TaskWeaverError(f"there is no session store at {store_place(config)} yet, so there is no audit trail")
    store = open_store(config)
    try:
        entries = store.audit_entries(since=args.since)
    finally:
        store.close()
    if args.json:
        print(json.dumps([entry.to_dict() for entry in entries]))
        return 0
    if not entries:
        print("No audit entries" + (" since then." if args.since is not None else " yet."))
        return 0
    from taskweaver_lite.safety.terminal import strip_controls

    print(f"{'TIME (UTC)':<20} {'ACTOR':<20} {'ACTION':<24} {'TARGET':<24} {'SOURCE':<22} DETAIL")
    for entry in entries:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(entry.at))
        fields = (entry.actor, entry.action, entry.target, entry.source)
        actor, action, target, source = (strip_controls(field) or "-" for field in fields)
        print(f"{when:<20} {actor:<20} {action:<24} {target:<24} {source:<22} {strip_controls(entry.detail)}".rstrip())
    return 0
