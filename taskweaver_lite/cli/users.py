"""`taskweaver-lite users add|list|rotate|remove`: the people a server knows by their tokens.

    taskweaver-lite users add ana [--admin] [--expires 90] -p project   # the token, once, alone on the last line
    taskweaver-lite users list [--json]                                 # with when each token expires
    taskweaver-lite users rotate ana [--expires 90]                     # a new token, printed the same way; the old one stops at once
    taskweaver-lite users remove ana

Users live in the project's store (`store.url` or the SQLite file). Once it has one, `serve` asks
every request for a user's token, on 127.0.0.1 too; a user sees their own sessions, an admin all.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import TYPE_CHECKING

from taskweaver_lite.errors import TaskWeaverError

if TYPE_CHECKING:
    from taskweaver_lite.store.interface import Actor, Store

MAX_DAYS = 36_500  # `--expires` at most a hundred years


def add_users_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `users` command and its actions."""
    users = commands.add_parser("users", help="add, list, rotate, promote, demote or remove the users a server knows (each with a token of their own)")
    actions = users.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="add a user and print their token (shown once: only its hash is kept)")
    add.add_argument("name", metavar="NAME")
    add.add_argument("--admin", action="store_true", help="an admin sees and may use every user's sessions")
    add.add_argument("--expires", type=days, default=None, metavar="DAYS", help="the token stops working after DAYS days (default: never)")
    listing = actions.add_parser("list", help="the users, by name, with when each one's token expires")
    listing.add_argument("--json", action="store_true", help="one JSON array on stdout")
    rotate = actions.add_parser("rotate", help="give a user a new token and print it (shown once); the old one stops working at once")
    rotate.add_argument("name", metavar="NAME")
    rotate.add_argument(
        "--expires", type=days, default=None, metavar="DAYS", help="the new token stops working after DAYS days (default: as many days as the old one had)"
    )
    remove = actions.add_parser("remove", help="remove a user: their token stops working at once (their sessions stay)")
    remove.add_argument("name", metavar="NAME")
    promote = actions.add_parser("promote", help="make a user an admin (they see and may use every user's sessions)")
    promote.add_argument("name", metavar="NAME")
    demote = actions.add_parser("demote", help="make an admin a user again (their own sessions only)")
    demote.add_argument("name", metavar="NAME")
    expires = actions.add_parser("expires", help="when a user's token stops working: DAYS from now, or `never` (the expiry cleared)")
    expires.add_argument("name", metavar="NAME")
    expires.add_argument("when", type=days_or_never, metavar="DAYS|never")
    for action in (add, listing, rotate, remove, promote, demote, expires):
        action.add_argument("-p", "--project", dest="project", default=None, metavar="PROJECT_DIR", help="project folder (default: ./project)")
        action.add_argument(
            "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a config key (e.g. store.url); repeatable"
        )


def days(text: str) -> float:
    """`--expires DAYS`: a number of days above 0 (fractions allowed: 0.5 is twelve hours)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_DAYS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of days: give one above 0 and at most {MAX_DAYS:,} (e.g. --expires 90)")
    return value


def days_or_never(text: str) -> float | None:
    """`users expires NAME DAYS|never`: a number of days as for --expires, or None for `never`."""
    return None if text.strip().lower() == "never" else days(text)


def run_users(args: argparse.Namespace) -> int:
    """Run `users add|list|rotate|promote|demote|expires|remove`; the exit code."""
    from taskweaver_lite.cli.project import project_dir  # the store's modules only once a users command runs (`--help` answers at once)
    from taskweaver_lite.config.file import load_config
    from taskweaver_lite.store.interface import Actor
    from taskweaver_lite.store.opening import has_store, open_store, store_place

    config = load_config(project_dir(args), args.overrides)
    if args.action != "add" and not has_store(config):  # nothing to list, rotate or remove: no store is made for it
        if args.action == "list":
            print("[]" if args.json else f"No users: there is no session store at {store_place(config)} yet.")
            return 0
        raise TaskWeaverError(f"there is no user '{args.name}': there is no session store at {store_place(config)} yet")
    store = open_store(config)
    where = store_place(config)
    by = Actor.command_line()
    try:
        if args.action == "add":
            return _add(store, args.name, admin=args.admin, expires=args.expires, where=where, by=by)
        if args.action == "list":
            return _list(store, as_json=args.json)
        if args.action == "rotate":
            return _rotate(store, args.name, expires=args.expires, where=where, by=by)
        if args.action in ("promote", "demote", "expires"):
            return _change(store, args, where=where, by=by)
        if not store.remove_user(args.name, by=by):
            raise TaskWeaverError(_no_user(args.name, where))
        print(f"Removed {args.name}: their token no longer works. Their sessions stay in the store (an admin still sees them).")
        if not store.has_users():
            print(f"That was the last user: `serve` now refuses every request until you add one (taskweaver-lite users add NAME -p {config.project_dir}).")
        return 0
    finally:
        store.close()


def _add(store: Store, name: str, *, admin: bool, expires: float | None, where: str, by: Actor) -> int:
    first = not store.has_users()
    token = store.add_user(name, admin=admin, expires_days=expires, by=by)
    print(f"Added {'admin ' if admin else ''}{name} to {where}. Their token, shown this once (only its hash is kept):", file=sys.stderr)
    if first:
        print("This store now has users: `serve` asks every request for a user's token, on 127.0.0.1 too.", file=sys.stderr)
    _say_expiry(store, name)
    print(token)
    return 0


def _rotate(store: Store, name: str, *, expires: float | None, where: str, by: Actor) -> int:
    token = store.rotate_token(name, expires_days=expires, by=by)
    if token is None:
        raise TaskWeaverError(_no_user(name, where))
    print(f"A new token for {name}, shown this once (only its hash is kept); their old one no longer works:", file=sys.stderr)
    _say_expiry(store, name)
    print(token)
    return 0


def _change(store: Store, args: argparse.Namespace, *, where: str, by: Actor) -> int:
    """`users promote|demote NAME`, `users expires NAME DAYS|never`: takes effect on every server within two seconds."""
    if args.action == "expires":
        changed = store.set_expiry(args.name, expires_days=args.when, by=by)
    else:
        changed = store.set_admin(args.name, admin=args.action == "promote", by=by)
    if not changed:
        raise TaskWeaverError(_no_user(args.name, where))
    if args.action == "expires":
        print(f"The token of {args.name} now never expires." if args.when is None else f"The token of {args.name} now expires in {args.when:g} days.")
        _say_expiry(store, args.name)
    elif args.action == "promote":
        print(f"{args.name} is now an admin: they see and may use every user's sessions.")
    else:
        print(f"{args.name} is now a user: they see only their own sessions.")
    return 0


def _say_expiry(store: Store, name: str) -> None:
    """On stderr: when the user's token stops working (the token itself goes alone to stdout)."""
    user = next((user for user in store.users() if user.name == name), None)
    if user is not None and user.expires_at is not None:
        print(f"It expires on {_when(user.expires_at)} (renew it with `taskweaver-lite users rotate {name}`).", file=sys.stderr)


def _no_user(name: str, where: str) -> str:
    return f"there is no user '{name}' in {where}; `taskweaver-lite users list` shows them"


def _list(store: Store, *, as_json: bool) -> int:
    users = store.users()
    if as_json:
        print(json.dumps([user.to_dict() for user in users]))
        return 0
    if not users:
        print("No users: `serve` runs in one-person mode (127.0.0.1, or one --token). Add one with `taskweaver-lite users add NAME`.")
        return 0
    now = time.time()
    print(f"{'NAME':<24} {'ROLE':<6} {'ADDED':<17} TOKEN EXPIRES")
    for user in users:
        expires = "never" if user.expires_at is None else _when(user.expires_at) + (" (expired)" if user.expired(now) else "")
        print(f"{user.name:<24} {'admin' if user.admin else 'user':<6} {_when(user.created_at):<17} {expires}")
    return 0


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(at))
