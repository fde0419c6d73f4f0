"""The session store: every event of every session, written as it happens to one SQLite file per project.

    # A workspace's new_session creates the session in the store, locks it and records its every
    # event, and resume_session does the same for a stored one: there is no StoreRecorder to add by hand.
    with Workspace(config) as workspace, workspace.new_session() as session:
        session.ask("load sales.csv")

    # Reading a store, e.g. to export a session:
    store = SessionStore(config.store_path)
    stored = store.load(store.resolve("last"))

A session joins `list_sessions()` and becomes "last" only with its first round, so a chat left at
once leaves no clutter behind.

Durability: WAL journal, `synchronous=NORMAL`, one transaction per event. A `kill -9` at any moment
loses at most the event being written and never corrupts the file (in WAL mode a commit is durable
against a process crash; NORMAL only skips the fsync that guards against power loss). Two processes
may write to one file at once: SQLite serialises them, and `busy_timeout` makes each wait its turn
instead of failing. A session open in one process is guarded by an `flock` on a lock file (see
`lock.py`), which the operating system releases even when the process is killed.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from taskweaver_lite.errors import StoreError
from taskweaver_lite.store.event_rows import shorten
from taskweaver_lite.store.interface import INTERRUPTED_ERROR, Notices, SessionEntry, StoredSession
from taskweaver_lite.store.lock import SessionLock
from taskweaver_lite.store.schema import MIGRATIONS, SCHEMA_VERSION, migrate, read_version
from taskweaver_lite.store.sql import SESSION_ID, SqlStore

__all__ = ["INTERRUPTED_ERROR", "SessionEntry", "SessionStore", "StoredSession", "shorten", "stored_sessions"]

Synchronous = Literal["NORMAL", "FULL"]
BUSY_TIMEOUT_SECONDS = 10.0


_WRITERS: dict[Path, threading.Lock] = {}
_WRITERS_GUARD = threading.Lock()


def _writers(path: Path) -> threading.Lock:
    """The in-process write lock of one database file (sessions of one server share the file)."""
    key = path.resolve()
    with _WRITERS_GUARD:
        return _WRITERS.setdefault(key, threading.Lock())


class SessionStore(SqlStore):
    """The project's SQLite file of sessions: safe to share between threads and between processes."""

    now_sql = "((julianday('now') - 2440587.5) * 86400.0)"
    cell_code_sql = "json_extract(data, '$.execution.code')"
    cell_died_sql = "json_extract(data, '$.execution.kernel_died')"
    cell_seconds_sql = "COALESCE(json_extract(data, '$.execution.elapsed'), 0)"

    def __init__(self, path: Path, *, synchronous: Synchronous = "NORMAL", read_only: bool = False) -> None:
        """Open (creating if needed) and check the store; `read_only` never writes, for listing and export.

        A store with damaged pages is refused here, before any work, with how to recover.
        """
        super().__init__()
        self.path = Path(path)
        self.where = str(self.path)
        self._lock = threading.Lock()
        self._writers = _writers(self.path)
        if synchronous not in ("NORMAL", "FULL"):
            raise StoreError(f"synchronous must be NORMAL or FULL, not {synchronous!r}")
        try:
            self._db = self._connect(read_only=read_only)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"{self.path}: cannot open the session store ({exc})") from None
        try:
            with self._errors():
                self._check_pages()
                if read_only:
                    if read_version(self._db, path=self.path) != SCHEMA_VERSION:
                        raise StoreError(f"{self.path} is from an older taskweaver-lite; run `taskweaver-lite chat` once to upgrade it")
                    return
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute(f"PRAGMA synchronous={synchronous}")
                self._db.execute("PRAGMA foreign_keys=ON")
                migrate(self._db, MIGRATIONS, path=self.path)
        except StoreError:
            self._db.close()
            raise

    def _connect(self, *, read_only: bool) -> sqlite3.Connection:
        # isolation_level=None: we issue BEGIN/COMMIT ourselves, one transaction per event.
        options: dict[str, Any] = {"timeout": BUSY_TIMEOUT_SECONDS, "isolation_level": None, "check_same_thread": False}
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _owner_only(self.path)
            connection: sqlite3.Connection = sqlite3.connect(self.path, **options)
            return connection
        if not self.path.is_file():
            raise StoreError(f"{self.path}: no session store here yet")
        uri = f"{self.path.resolve().as_uri()}?mode=ro"  # never writes the store
        reader: sqlite3.Connection = sqlite3.connect(uri, uri=True, **options)
        try:
            reader.execute("PRAGMA user_version").fetchone()
        except sqlite3.OperationalError:
            # A folder we cannot write: SQLite cannot create the WAL index (-shm) beside the store.
            # Read it as immutable instead, which is exact when the last writer closed cleanly (no -wal left).
            reader.close()
            reader = sqlite3.connect(uri + "&immutable=1", uri=True, **options)
        except sqlite3.DatabaseError:
            pass  # damaged: `_check_pages` says so, with the way out
        return reader

    def _check_pages(self) -> None:
        """PRAGMA quick_check: a damaged store is named before any work is done, with the way out."""
        try:
            with self._lock:
                problems = [row[0] for row in self._db.execute("PRAGMA quick_check").fetchall()]
        except sqlite3.OperationalError:
            raise  # locked or unreadable, not damaged: `_errors` words it
        except sqlite3.DatabaseError as exc:
            problems = [str(exc)]
        if problems != ["ok"]:
            sessions = self.path.parent / "sessions"
            raise StoreError(
                f"{self.path} is not a readable session store: it is damaged ({problems[0].splitlines()[-1].strip()}); nothing "
                f"was run. The session folders in {sessions} (working files, outputs, plots) are intact: move it aside (mv {self.path} "
                f"{self.path}.damaged) and a new one will be created; `sqlite3 {self.path}.damaged .recover` may rescue old records"
            )

    def lock(self, session_id: str) -> SessionLock:
        """Claim the session for this process; SessionBusyError if another process has it open."""
        if not SESSION_ID.match(session_id):
            raise StoreError(f"'{session_id}' is not a valid session id")
        return SessionLock(self.path.with_name(self.path.name + ".locks") / f"{session_id}.lock", session_id=session_id)

    def notices(self) -> Notices | None:
        """None: the SQLite file is one process's (its sessions wake their own event streams)."""
        return None

    def close(self) -> None:
        """Close the database connection (committed events are already on disk)."""
        with self._lock:
            self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        # Writers of this process take turns on a lock of their own first: SQLite's busy handler
        # would make them sleep (1, 2, 5 ... 100 ms) while another session of this process commits.
        with self._lock, self._writers, self._errors():
            # IMMEDIATE takes the write lock up front, so a busy database waits here (busy_timeout)
            # instead of failing half-way through the event.
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                if self._db.in_transaction:  # SQLite may already have rolled back (disk full, I/O error)
                    self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock, self._errors():
            self._db.execute("BEGIN")  # one snapshot for all the reads, even while others write
            try:
                yield self._db
            finally:
                if self._db.in_transaction:
                    self._db.execute("COMMIT")

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise StoreError(f"{self.path} stayed locked by another process for over {BUSY_TIMEOUT_SECONDS:.0f} s; try again") from None
            hint = "; free some disk space: the session goes on, but what happens until then is not stored" if "full" in str(exc) else ""
            raise StoreError(f"{self.path}: the session store could not be written or read ({exc}){hint}") from None
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                f"{self.path} is not a readable session store ({exc}); move it aside (mv {self.path} {self.path}.broken) and a new one will be created"
            ) from None
        except sqlite3.ProgrammingError as exc:  # used after close(), e.g. by a late background fold
            raise StoreError(f"{self.path}: the session store is closed ({exc})") from None


def _owner_only(path: Path) -> None:
    """The store and its -wal and -shm readable by their owner only (SQLite gives the latter two the store's mode).

    It holds every conversation: no other user, and no kernel running as another user, may read it.
    """
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        with contextlib.suppress(FileNotFoundError, PermissionError):  # PermissionError: another user's store, refused later by SQLite
            if name.stat().st_mode & 0o077:
                os.chmod(name, 0o600)


def stored_sessions(path: Path) -> list[SessionEntry]:
    """The sessions stored at `path`, most recently active first (none when there is no store yet); read-only."""
    if not path.exists():
        return []
    store = SessionStore(path, read_only=True)
    try:
        return store.list_sessions()
    finally:
        store.close()
