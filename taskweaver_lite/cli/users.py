"""`taskweaver-lite users add|list|remove`: the people a server knows by their tokens.

    taskweaver-lite users add ana [--admin] -p project     # the token, once, alone on the last line
    taskweaver-lite users list [--json]
    taskweaver-lite users remove ana

Users live in the project's store (`store.url` or the SQLite file). Once it has one, `serve` asks
every request for a user's token, on 127.0.0.1 too; a user sees their own sessions, an admin all.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

from taskweaver_lite.errors import TaskWeaverError

if TYPE_CHECKING:
    from taskweaver_lite.store.interface import Store


def add_users_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `users` command and its three actions."""
    users = commands.add_parser("users", help="add, list or remove the users a server knows (each with a token of their own)")
    actions = users.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="add a user and print their token (shown once: only its hash is kept)")
    add.add_argument("name", metavar="NAME")
    add.add_argument("--admin", action="store_true", help="an admin sees and may use every user's sessions")
    listing = actions.add_parser("list", help="the users, by name")
    listing.add_argument("--json", action="store_true", help="one JSON array on stdout")
    remove = actions.add_parser("remove", help="remove a user: their token stops working at once (their sessions stay)")
    remove.add_argument("name", metavar="NAME")
    for action in (add, listing, remove):
        action.add_argument("-p", "--project", dest="project", default=None, metavar="PROJECT_DIR", help="project folder (default: ./project)")
        action.add_argument(
            "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a config key (e.g. store.url); repeatable"
        )


def run_users(args: argparse.Namespace) -> int:
    """Run `users add|list|remove`; the exit code."""
    from taskweaver_lite.cli.chat import project_dir  # the store's modules only once a users command runs (`--help` answers at once)
    from taskweaver_lite.config_file import load_config
    from taskweaver_lite.store.opening import has_store, open_store, store_place

    config = load_config(project_dir(args), args.overrides)
    if args.action != "add" and not has_store(config):  # nothing to list or remove: no store is made for it
        if args.action == "list":
            print("[]" if args.json else f"No users: there is no session store at {store_place(config)} yet.")
            return 0
        raise TaskWeaverError(f"there is no user '{args.name}': there is no session store at {store_place(config)} yet")
    store = open_store(config)
    try:
        if args.action == "add":
            return _add(store, args.name, admin=args.admin, where=store_place(config))
        if args.action == "list":
            return _list(store, as_json=args.json)
        if not store.remove_user(args.name):
            raise TaskWeaverError(f"there is no user '{args.name}' in {store_place(config)}; `taskweaver-lite users list` shows them")
        print(f"Removed {args.name}: their token no longer works. Their sessions stay in the store (an admin still sees them).")
        return 0
    finally:
        store.close()


def _add(store: Store, name: str, *, admin: bool, where: str) -> int:
    first = not store.has_users()
    token = store.add_user(name, admin=admin)
    print(f"Added {'admin ' if admin else ''}{name} to {where}. Their token, shown this once (only its hash is kept):", file=sys.stderr)
    if first:
        print("This store now has users: `serve` asks every request for a user's token, on 127.0.0.1 too.", file=sys.stderr)
    print(token)
    return 0


def _list(store: Store, *, as_json: bool) -> int:
    users = store.users()
    if as_json:
        print(json.dumps([user.to_dict() for user in users]))
        return 0
    if not users:
        print("No users: `serve` runs in one-person mode (127.0.0.1, or one --token). Add one with `taskweaver-lite users add NAME`.")
        return 0
    print(f"{'NAME':<24} {'ROLE':<6} ADDED")
    for user in users:
        print(f"{user.name:<24} {'admin' if user.admin else 'user':<6} {time.strftime('%Y-%m-%d %H:%M', time.localtime(user.created_at))}")
    return 0
