"""What every session store offers, whichever database keeps it: the `Store` protocol and its values.

Two backends implement it: `database.SessionStore` (the project's SQLite file, the default) and
`postgres.PostgresStore` (`store.url: postgresql://...`, for a team). Both share their queries
(`sql.SqlStore`); what differs is how they connect, lock, migrate and word their errors.

The store holds, per session: its rounds and posts, model calls, folds, compression state, loaded
files, `--set` overrides, its owner, the event log a replica streams from, and the bytes of its
artifacts and uploads (kept only where `keeps_files`: on PostgreSQL any replica must serve them;
on SQLite they are the session folder's files). Beside sessions: tips, users, leases and eval results.

Owner filters: `owner=None` means "everyone's" (one-person mode, or an admin); a user's id (never
their name, which may be used again) keeps to the sessions that user made. A session another user
owns is, for the caller, simply not there.
"""

from __future__ import annotations

import getpass
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from taskweaver_lite.records.conversation import Round
from taskweaver_lite.records.events import Event, FileLoaded
from taskweaver_lite.records.execution import Variable
from taskweaver_lite.records.model_calls import Usage
from taskweaver_lite.records.tips import Tip, TipKind

INTERRUPTED_ERROR = "Cut off: the program stopped during this request."
FileKind = Literal["artifact", "upload"]


@dataclass(frozen=True)
class SessionEntry:
    """One line of `taskweaver-lite sessions`."""

    id: str
    title: str
    rounds: int
    started: float
    last_active: float
    owner: str | None = None  # the name of the user who made it (None: made before there were users)

    def to_dict(self) -> dict[str, Any]:
        """JSON shape for `sessions --json`: {id, title, rounds, started, last_active, owner} (epoch seconds; owner null without users)."""
        return {"id": self.id, "title": self.title, "rounds": self.rounds, "started": self.started, "last_active": self.last_active, "owner": self.owner}


@dataclass(frozen=True)
class StoredSession:
    """Everything a resume or an export needs, as it was last written."""

    id: str
    title: str
    started: float
    last_active: float
    rounds: list[Round]
    compression: dict[str, dict[str, Any]]  # role key ("planner", "code_generator", a project role's) -> CompressionState.to_dict()
    usage: Usage  # failed calls counted, with no tokens
    interrupted: tuple[int, ...]  # indexes of rounds still 'running': cut off by a crash
    last_variables: tuple[Variable, ...]  # the kernel's variables after the last cell that ran
    loads: tuple[FileLoaded, ...] = ()  # files copied in with /load, in order
    overrides: tuple[str, ...] = ()  # the --set values the session runs with (api keys left out)
    owner: str | None = None  # the id of the user who made it (None: made without users)
    kernel_id: str | None = None  # its kernel on a gateway, which may outlive the server that started it


@dataclass(frozen=True)
class User:
    """A person the server knows by their token; an admin sees every session."""

    name: str
    admin: bool
    created_at: float
    expires_at: float | None = None  # when their token stops working (epoch seconds); None: never
    id: str = ""  # what their sessions and tips belong to: never reused, unlike a name

    def expired(self, now: float | None = None) -> bool:
        """Whether their token has stopped working (at `now`, default: this moment)."""
        return self.expires_at is not None and (time.time() if now is None else now) >= self.expires_at

    def to_dict(self) -> dict[str, Any]:
        """JSON shape for `users list --json`: {name, admin, created_at, expires_at} (expires_at null: never; never the token or its hash)."""
        return {"name": self.name, "admin": self.admin, "created_at": self.created_at, "expires_at": self.expires_at}


@dataclass(frozen=True)
class Actor:
    """Who makes a change, for its audit entry: a user's name or `cli:<account>`, and where from (an address, `cli@<host>`)."""

    name: str
    source: str = ""

    @classmethod
    def command_line(cls) -> Actor:
        """Whoever runs this command: `cli:<account>` from `cli@<host>`."""
        try:
            account = getpass.getuser()
        except (KeyError, OSError):
            account = str(os.getuid())
        return cls(f"cli:{account}", f"cli@{socket.gethostname()}")


@dataclass(frozen=True)
class SignIn:
    """One sign-in on the page, as the store keeps it: the cookie names its `id` (signed with the server's key, never stored).

    `user` is the user it was made for as they are now (None: the server's one token, or a user since removed:
    `user_id` tells which); it holds while not ended, not run out, and made from the token that user has now.
    """

    id: str
    user_id: str | None  # None: a sign-in with the server's one token
    token_id: str  # the user's token id when it was made (`users rotate` ends it), or a digest of the server's one token
    created_at: float
    until: float
    ended_at: float | None = None
    user: User | None = None
    current_token_id: str | None = None  # the token id that user has now (None: removed, or no user)
    via: str = "token"  # token (the form or the link), oidc

    def holds(self, now: float | None = None) -> bool:
        """Whether it still signs its browser in: not ended, not run out, and (for a user) made while they had the token they have now."""
        at = time.time() if now is None else now
        if self.ended_at is not None or self.until <= at:
            return False
        if self.user_id is None:
            return True
        return self.user is not None and self.current_token_id == self.token_id


@dataclass(frozen=True)
class AuditEntry:
    """One line of the audit trail: when (epoch seconds, shown in UTC), who did it, what, to whom or what, and from where."""

    at: float
    actor: str  # a user's name, `cli:<account>` for the command line, `-` for the server's one token or nobody known
    # sign-in, sign-out, token-refused, user-added, user-removed, user-promoted, user-demoted, user-rotated, user-expired,
    # session-deleted, session-opened-by-admin
    action: str
    target: str = ""  # a user's name, a session's id, a token's public id
    source: str = ""  # the client's address, or `cli@<host>`
    detail: str = ""
    id: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON shape for `audit --json`: {id, time (ISO 8601 UTC), at (epoch seconds), actor, action, target, source, detail}."""
        return {
            "id": self.id,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at)),
            "at": self.at,
            "actor": self.actor,
            "action": self.action,
            "target": self.target,
            "source": self.source,
            "detail": self.detail,
        }


@dataclass
class UserUsage:
    """What one user's sessions used: sessions, cells run and their seconds, and per model the calls and tokens."""

    user: str  # the user's name (`-`: sessions made without users; `removed:NAME` for a user since removed)
    sessions: int = 0
    cells: int = 0
    cell_seconds: float = 0.0
    models: dict[str, dict[str, int]] = field(default_factory=dict)  # model -> {calls, prompt_tokens, completion_tokens, cached_tokens}

    def to_dict(self) -> dict[str, Any]:
        """JSON shape: {user, sessions, cells, cell_seconds, models: {MODEL: {calls, prompt_tokens, completion_tokens, cached_tokens}}}."""
        return {"user": self.user, "sessions": self.sessions, "cells": self.cells, "cell_seconds": round(self.cell_seconds, 3), "models": self.models}


@dataclass(frozen=True)
class StoredEvent:
    """One entry of a session's event log: `id` rises with every entry of the store (an SSE `id:`)."""

    id: int
    session_id: str
    data: dict[str, Any]
    at: float


@dataclass(frozen=True)
class Lease:
    """Who runs a session's request now, and until when unless renewed (epoch seconds, the database's clock)."""

    session_id: str
    holder: str
    expires: float
    # The session's newest event id as the lease's last holder freed it, when this take found it freed so: what a
    # copy current with it may be reused at. -1: unknown (a lease that ran out, or the session's first).
    version: int = -1


@dataclass(frozen=True)
class LeaseMark:
    """A lease row written with a write of events, in the same statement: `key` (a session id with a suffix) held by `holder` for `seconds`.

    The lease's holder takes it as its answer is stored (the answered mark), rather than by a statement of its own;
    written over any earlier one, since only the lease's holder writes its marks.
    """

    key: str
    holder: str
    seconds: float


@dataclass(frozen=True)
class FreedMarks:
    """Lease rows deleted with a write of events, in the same statement: `keys` where `holder` holds them.

    A request handed its session's lease by the previous one on the same replica (one holder for both)
    drops what that one left: its answered mark, and a Stop meant for it.
    """

    keys: tuple[str, ...]
    holder: str


# The store's notice that a session has new events (payload: the session id), sent as they are committed.
EVENTS_CHANNEL = "twl_events"


class Notices(Protocol):
    """Notices between the processes sharing a store: the store's own (`EVENTS_CHANNEL`) and theirs.

    A notice carries a hint, never data: one missed (while a connection is remade) is made up by reading the store.
    The store's notices of a session's new events reach the processes that follow it (`follow`), no others.
    """

    def follow(self, session_id: str) -> None:
        """Hear the session's new events from now on (until as many `unfollow`); StoreError when the store is down."""
        ...

    def unfollow(self, session_id: str) -> None:
        """One `follow` of the session fewer: after the last, its writes no longer notice this process."""
        ...

    @property
    def connected(self) -> bool:
        """Whether notices are heard now."""
        ...

    def listen(self, handlers: Mapping[str, Callable[[str], object]]) -> None:
        """From now on, on a thread of its own: each notice's payload to the handler of its channel (reconnecting after a drop)."""
        ...

    def send(self, channel: str, payload: str) -> None:
        """One notice to every process listening on `channel` (none sent while the store is down)."""
        ...

    def close(self) -> None:
        """Stop listening."""
        ...


class SessionClaim(Protocol):
    """Proof that this process has a session open (a file lock on SQLite, an advisory lock on PostgreSQL)."""

    def release(self) -> None:
        """Let other processes open the session."""


class Store(Protocol):
    """A session store (see the module docstring); every method may raise StoreError, worded for the user."""

    where: str  # the store's place for messages: a file path, or a URL without its password
    keeps_files: bool  # artifacts and uploads are kept as bytes in the store (any replica serves them)

    # Sessions
    def create_session(self, session_id: str, *, started: float, owner: str | None = None, limit: int | None = None) -> None: ...
    def record(
        self,
        session_id: str,
        *events: Event,
        shown: Sequence[dict[str, Any]] = (),
        compression: Mapping[str, dict[str, Any]] | None = None,
        mark: LeaseMark | None = None,
        unmark: FreedMarks | None = None,
    ) -> list[int]: ...
    def save_compression(self, session_id: str, role: str, state: dict[str, Any]) -> None: ...
    def save_overrides(self, session_id: str, overrides: list[str]) -> None: ...
    def overrides(self, session_id: str) -> list[str]: ...
    def list_sessions(self, *, owner: str | None = None) -> list[SessionEntry]: ...
    def count_sessions(self, *, owner: str) -> int: ...
    def resolve(self, ref: str, *, owner: str | None = None) -> str: ...
    def owner_of(self, session_id: str) -> str | None: ...
    def save_kernel(self, session_id: str, kernel_id: str | None) -> None: ...
    def load(self, session_id: str) -> StoredSession: ...
    def delete_session(self, session_id: str) -> bool: ...
    def mark_interrupted(self, session_id: str) -> tuple[int, ...]: ...
    def drop_round(self, session_id: str, round_id: str) -> None: ...
    def successful_cells(self, session_id: str) -> list[str]: ...
    def lock(self, session_id: str) -> SessionClaim: ...

    # The event log (what `GET /api/sessions/{id}/events` streams)
    def events_after(self, session_id: str, after: int, *, limit: int = 500) -> list[StoredEvent]: ...
    def last_event_id(self, session_id: str) -> int: ...

    # Artifacts and uploads, as bytes
    def put_file(self, session_id: str, kind: FileKind, name: str, data: bytes) -> None: ...
    def file(self, session_id: str, kind: FileKind, name: str) -> bytes | None: ...
    def file_names(self, session_id: str, kind: FileKind) -> list[str]: ...

    # Tips
    def save_tips(self, session_id: str, tips: Sequence[tuple[TipKind, str]]) -> list[Tip]: ...
    def stored_tips(self, *, owner: str | None = None) -> list[Tip]: ...
    def search_tips(self, text: str, *, owner: str | None = None, limit: int) -> list[Tip] | None: ...
    def tips_version(self) -> tuple[int, int]: ...
    def delete_tip(self, tip_id: int, *, owner: str | None = None) -> bool: ...

    # Users
    # `by` names who makes a change: its audit entry goes in with it (none without)
    def add_user(self, name: str, *, admin: bool = False, expires_days: float | None = None, by: Actor | None = None, detail: str = "") -> str: ...
    def rotate_token(self, name: str, *, expires_days: float | None = None, by: Actor | None = None) -> str | None: ...
    def set_admin(self, name: str, *, admin: bool, by: Actor | None = None) -> bool: ...
    def set_expiry(self, name: str, *, expires_days: float | None, by: Actor | None = None) -> bool: ...
    def users(self) -> list[User]: ...
    def remove_user(self, name: str, *, by: Actor | None = None) -> bool: ...
    def token_id_of(self, name: str) -> str | None: ...
    def was_removed(self, name: str) -> bool: ...
    def usage_by_user(self) -> list[UserUsage]: ...
    def session_kernels(self) -> dict[str, str]: ...
    def has_users(self) -> bool: ...
    def had_users(self) -> bool: ...
    def user_for_token(self, token: str) -> User | None: ...
    def user_by_name(self, name: str) -> User | None: ...

    # The page's sign-ins (the cookie's signature is the server's: web/sign_in.py)
    def add_sign_in(self, sign_in_id: str, *, user_id: str | None, token_id: str, until: float, via: str = "token") -> None: ...
    def sign_in(self, sign_in_id: str) -> SignIn | None: ...
    def end_sign_in(self, sign_in_id: str) -> bool: ...
    def sign_in_key_check(self, check: str) -> str | None: ...

    # The audit trail: appended to, never changed
    def audit(self, entry: AuditEntry) -> None: ...
    def audit_entries(self, *, since: float | None = None, limit: int | None = None) -> list[AuditEntry]: ...

    # Leases: one request at a time per session, across processes
    def take_lease(self, session_id: str, holder: str, *, seconds: float) -> Lease | None: ...
    def renew_leases(self, held: Sequence[tuple[str, str]], *, seconds: float, read: Sequence[str] = ()) -> tuple[set[str], dict[str, str]]: ...
    def release_lease(self, session_id: str, holder: str, *, marks: Sequence[str] = ()) -> int: ...
    def lease(self, session_id: str) -> Lease | None: ...

    # Eval results
    def save_eval_result(self, run_id: str, case: str, result: dict[str, Any]) -> None: ...
    def eval_results(self, run_id: str) -> dict[str, dict[str, Any]]: ...

    # Notices to the other processes on this store (None: a store one process has to itself)
    def notices(self) -> Notices | None: ...

    def ping(self) -> None: ...
    def close(self) -> None: ...
