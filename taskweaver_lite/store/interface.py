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

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
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


# The store's notice that a session has new events (payload: the session id), sent as they are committed.
EVENTS_CHANNEL = "twl_events"


class Notices(Protocol):
    """Notices between the processes sharing a store: the store's own (`EVENTS_CHANNEL`) and theirs.

    A notice carries a hint, never data: one missed (while a connection is remade) is made up by reading the store.
    """

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
    def record(self, session_id: str, *events: Event, shown: Sequence[dict[str, Any]] = ()) -> list[int]: ...
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
    def add_user(self, name: str, *, admin: bool = False, expires_days: float | None = None) -> str: ...
    def rotate_token(self, name: str, *, expires_days: float | None = None) -> str | None: ...
    def set_admin(self, name: str, *, admin: bool) -> bool: ...
    def set_expiry(self, name: str, *, expires_days: float | None) -> bool: ...
    def users(self) -> list[User]: ...
    def remove_user(self, name: str) -> bool: ...
    def has_users(self) -> bool: ...
    def had_users(self) -> bool: ...
    def user_for_token(self, token: str) -> User | None: ...
    def sign_in(self, token: str, *, hours: float) -> str | None: ...
    def user_for_sign_in(self, value: str) -> User | None: ...

    # Leases: one request at a time per session, across processes
    def take_lease(self, session_id: str, holder: str, *, seconds: float) -> Lease | None: ...
    def renew_lease(self, session_id: str, holder: str, *, seconds: float) -> bool: ...
    def release_lease(self, session_id: str, holder: str) -> None: ...
    def lease(self, session_id: str) -> Lease | None: ...

    # Eval results
    def save_eval_result(self, run_id: str, case: str, result: dict[str, Any]) -> None: ...
    def eval_results(self, run_id: str) -> dict[str, dict[str, Any]]: ...

    # Notices to the other processes on this store (None: a store one process has to itself)
    def notices(self) -> Notices | None: ...

    def ping(self) -> None: ...
    def close(self) -> None: ...
