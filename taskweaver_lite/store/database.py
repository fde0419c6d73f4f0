"""The session store: every event of every session, written as it happens to one SQLite file per project.

    # Session.open creates the session in the store, locks it and records its every event, and
    # Session.resume does the same for a stored one: there is no StoreRecorder to add by hand.
    with Session.open(config) as session:
        session.ask("load sales.csv")
    session, report = Session.resume(config, "last")

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
`session_lock.py`), which the operating system releases even when the process is killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from taskweaver_lite.errors import StoreError, UnknownSessionError
from taskweaver_lite.events import CellPrinted, Event, FileLoaded, Folded, ModelCalled, PostAdded, ReplyStreamed, RoundEnded, RoundStarted, Working
from taskweaver_lite.execution import Variable
from taskweaver_lite.knowledge.tips import Tip, TipKind
from taskweaver_lite.llm.client import Usage
from taskweaver_lite.memory.conversation import Post, Round
from taskweaver_lite.store.lock import SessionLock
from taskweaver_lite.store.schema import MIGRATIONS, SCHEMA_VERSION, migrate, read_version

Synchronous = Literal["NORMAL", "FULL"]
INTERRUPTED_ERROR = "Cut off: the program stopped during this request."
BUSY_TIMEOUT_SECONDS = 10.0
TITLE_LENGTH = 60
_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class SessionEntry:
    """One line of `taskweaver-lite sessions`."""

    id: str
    title: str
    rounds: int
    started: float
    last_active: float

    def to_dict(self) -> dict[str, Any]:
        """JSON shape for `sessions --json`: {id, title, rounds, started, last_active} (epoch seconds)."""
        return {"id": self.id, "title": self.title, "rounds": self.rounds, "started": self.started, "last_active": self.last_active}


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


_WRITERS: dict[Path, threading.Lock] = {}
_WRITERS_GUARD = threading.Lock()


def _writers(path: Path) -> threading.Lock:
    """The in-process write lock of one database file (sessions of one server share the file)."""
    key = path.resolve()
    with _WRITERS_GUARD:
        return _WRITERS.setdefault(key, threading.Lock())


class SessionStore:
    """The project's SQLite file of sessions: safe to share between threads and between processes."""

    def __init__(self, path: Path, *, synchronous: Synchronous = "NORMAL", read_only: bool = False) -> None:
        """Open (creating if needed) and check the store; `read_only` never writes, for listing and export.

        A store with damaged pages is refused here, before any work, with how to recover.
        """
        self.path = Path(path)
        self._lock = threading.Lock()
        self._writers = _writers(self.path)
        self._known_rounds: set[tuple[str, str]] = set()  # (session, round) rows this store has made sure of
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

    def create_session(self, session_id: str, *, started: float) -> None:
        """Add a new, empty session."""
        if not _SESSION_ID.match(session_id):
            raise StoreError(f"'{session_id}' is not a valid session id (letters, digits, '.', '_' and '-' only)")
        with self._transaction() as db:
            if db.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone():
                raise StoreError(f"session {session_id} already exists in {self.path}")
            db.execute("INSERT INTO sessions (id, started, last_active) VALUES (?, ?, ?)", (session_id, started, started))

    def record(self, session_id: str, *events: Event) -> None:
        """Write session events in one transaction; `Working`, `ReplyStreamed`, `CellPrinted` are progress only and are skipped."""
        kept = [event for event in events if not isinstance(event, (Working, ReplyStreamed, CellPrinted))]
        if not kept:
            return
        now = time.time()
        with self._transaction() as db:
            if db.execute("UPDATE sessions SET last_active = ? WHERE id = ?", (now, session_id)).rowcount == 0:
                raise StoreError(f"session {session_id} is not in {self.path}; it must be created before events are recorded")
            made: set[tuple[str, str]] = set()
            for event in kept:
                _write_event(db, session_id, event, now, known_rounds=self._known_rounds, made=made)
        self._known_rounds |= made  # only once committed: a rolled-back round row is made again next time

    def save_compression(self, session_id: str, role: str, state: dict[str, Any]) -> None:
        """Keep `role`'s CompressionState.to_dict(), replacing the one saved before."""
        now = time.time()
        with self._transaction() as db:
            db.execute(
                "INSERT INTO compression (session_id, role, state, saved_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (session_id, role) DO UPDATE SET state = excluded.state, saved_at = excluded.saved_at",
                (session_id, role, json.dumps(state, ensure_ascii=False), now),
            )
            db.execute("UPDATE sessions SET last_active = ? WHERE id = ?", (now, session_id))

    def save_overrides(self, session_id: str, overrides: list[str]) -> None:
        """Keep the `--set KEY=VALUE` items a session runs with, for its resume; api keys are never stored."""
        kept = [item for item in overrides if "api_key" not in item.partition("=")[0]]
        with self._transaction() as db:
            db.execute("UPDATE sessions SET overrides = ? WHERE id = ?", (json.dumps(kept, ensure_ascii=False), session_id))

    def overrides(self, session_id: str) -> list[str]:
        """The `--set` items saved for the session (empty if none were)."""
        with self._read() as db:
            row = db.execute("SELECT overrides FROM sessions WHERE id = ?", (session_id,)).fetchone()
        if row is None:
            raise UnknownSessionError(session_id, store=str(self.path))
        return [str(item) for item in json.loads(row[0])]

    def save_tips(self, session_id: str, tips: Sequence[tuple[TipKind, str]]) -> list[Tip]:
        """Store tips (kind, text) distilled from `session_id` in place of those saved from it before; returns them with their ids.

        A later /save reads the whole session again, so its tips supersede the earlier ones (one transaction).
        """
        now = time.time()
        with self._transaction() as db:
            db.execute("DELETE FROM tips WHERE session_id = ?", (session_id,))
            ids = [db.execute("INSERT INTO tips (kind, text, session_id, created_at) VALUES (?, ?, ?, ?)", (k, t, session_id, now)).lastrowid for k, t in tips]
        return [Tip(id=str(n), kind=k, text=t, source=session_id, created_at=now) for n, (k, t) in zip(ids, tips, strict=True)]

    def stored_tips(self) -> list[Tip]:
        """Every stored tip, oldest first."""
        with self._read() as db:
            rows = db.execute("SELECT id, kind, text, session_id, created_at FROM tips ORDER BY id").fetchall()
        return [Tip(id=str(r[0]), kind=r[1], text=r[2], source=r[3], created_at=r[4]) for r in rows]

    def tips_version(self) -> tuple[int, int]:
        """(count, newest id) of the stored tips: changes with every save and delete (ids are never reused)."""
        with self._read() as db:
            count, newest = db.execute("SELECT COUNT(*), COALESCE(MAX(id), 0) FROM tips").fetchone()
        return int(count), int(newest)

    def delete_tip(self, tip_id: int) -> bool:
        """Delete one stored tip; False when there is none with that id."""
        with self._transaction() as db:
            return db.execute("DELETE FROM tips WHERE id = ?", (tip_id,)).rowcount > 0

    def list_sessions(self) -> list[SessionEntry]:
        """Every stored session with at least one round, most recently active first."""
        # The inner join drops sessions without rounds: chats left, or failed, before their first request.
        with self._read() as db:
            rows = db.execute(
                "SELECT s.id, s.title, COUNT(*), s.started, s.last_active FROM sessions s JOIN rounds r ON r.session_id = s.id"
                " GROUP BY s.id ORDER BY s.last_active DESC, s.started DESC"
            ).fetchall()
        return [SessionEntry(id=r[0], title=r[1], rounds=r[2], started=r[3], last_active=r[4]) for r in rows]

    def resolve(self, ref: str) -> str:
        """The session id that `ref` names: 'last' (the most recently active one with a round), an id, or a unique start of one."""
        with self._read() as db:
            if ref == "last":
                row = db.execute(
                    "SELECT id FROM sessions s WHERE EXISTS (SELECT 1 FROM rounds r WHERE r.session_id = s.id)"
                    " ORDER BY last_active DESC, started DESC LIMIT 1"
                ).fetchone()
                if row is None:
                    raise StoreError(f"there are no stored sessions in {self.path} yet")
                return str(row[0])
            if db.execute("SELECT 1 FROM sessions WHERE id = ?", (ref,)).fetchone():
                return ref
            pattern = ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            matches = [r[0] for r in db.execute("SELECT id FROM sessions WHERE id LIKE ? ESCAPE '\\' ORDER BY id", (pattern,))]
        if len(matches) == 1:
            return str(matches[0])
        if matches:
            raise StoreError(f"'{ref}' matches several sessions ({', '.join(matches[:5])}); give more of the id")
        raise UnknownSessionError(ref, store=str(self.path))

    def load(self, session_id: str) -> StoredSession:
        """The whole session: rounds rebuilt from their posts in order, summaries, usage, crash marks."""
        with self._read() as db:
            head = db.execute("SELECT title, started, last_active, variables, overrides FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if head is None:
                raise UnknownSessionError(session_id, store=str(self.path))
            round_rows = db.execute(
                "SELECT round_id, idx, user_query, state, error, started_at FROM rounds WHERE session_id = ? ORDER BY seq", (session_id,)
            ).fetchall()
            post_rows = db.execute("SELECT round_id, data FROM posts WHERE session_id = ? ORDER BY seq", (session_id,)).fetchall()
            states = db.execute("SELECT role, state FROM compression WHERE session_id = ?", (session_id,)).fetchall()
            loads = db.execute("SELECT name, source, after_round, at FROM files WHERE session_id = ? ORDER BY seq", (session_id,)).fetchall()
            usage = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(1 - ok), 0), COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0),"
                " COALESCE(SUM(cached_tokens), 0) FROM model_calls WHERE session_id = ?",
                (session_id,),
            ).fetchone()
        rounds = {
            r[0]: Round(id=r[0], index=r[1], user_query=r[2], state=r[3], error=r[4], started_at=r[5], posts=[]) for r in round_rows
        }
        for round_id, data in post_rows:
            rounds[round_id].posts.append(Post.from_dict(json.loads(data)))
        ordered = list(rounds.values())
        return StoredSession(
            id=session_id,
            title=head[0],
            started=head[1],
            last_active=head[2],
            rounds=ordered,
            compression={role: json.loads(state) for role, state in states},
            usage=Usage(calls=usage[0], failed_calls=usage[1], prompt_tokens=usage[2], completion_tokens=usage[3], cached_tokens=usage[4]),
            interrupted=tuple(r.index for r in ordered if r.state == "running"),
            last_variables=tuple(Variable.from_dict(v) for v in json.loads(head[3])),
            loads=tuple(FileLoaded(name=r[0], source=r[1], after_round=r[2], at=r[3]) for r in loads),
            overrides=tuple(json.loads(head[4])),
        )

    def mark_interrupted(self, session_id: str) -> tuple[int, ...]:
        """Fail the rounds a crash left 'running'; returns their indexes (to tell the user)."""
        with self._transaction() as db:
            rows = db.execute("SELECT seq, idx FROM rounds WHERE session_id = ? AND state = 'running' ORDER BY seq", (session_id,)).fetchall()
            db.executemany(
                "UPDATE rounds SET state = 'failed', error = ?, ended_at = COALESCE(ended_at, ?) WHERE seq = ?",
                [(INTERRUPTED_ERROR, time.time(), seq) for seq, _ in rows],
            )
        return tuple(idx for _, idx in rows)

    def drop_round(self, session_id: str, round_id: str) -> None:
        """Forget one request and its posts (/undo); the model calls it made stay counted."""
        with self._transaction() as db:
            db.execute("DELETE FROM posts WHERE session_id = ? AND round_id = ?", (session_id, round_id))
            db.execute("DELETE FROM rounds WHERE session_id = ? AND round_id = ?", (session_id, round_id))

    def successful_cells(self, session_id: str) -> list[str]:
        """The code of every cell that ran without error, in the order it ran (for the kernel replay)."""
        # Rounds of every state count: the kernel ran a failed round's good cells all the same.
        with self._read() as db:
            rows = db.execute(
                "SELECT json_extract(data, '$.execution.code') FROM posts WHERE session_id = ? AND success = 1 ORDER BY seq", (session_id,)
            ).fetchall()
        return [r[0] for r in rows]

    def lock(self, session_id: str) -> SessionLock:
        """Claim the session for this process; SessionBusyError if another process has it open."""
        if not _SESSION_ID.match(session_id):
            raise StoreError(f"'{session_id}' is not a valid session id")
        return SessionLock(self.path.with_name(self.path.name + ".locks") / f"{session_id}.lock", session_id=session_id)

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
                raise StoreError(
                    f"{self.path} stayed locked by another process for over {BUSY_TIMEOUT_SECONDS:.0f} s; try again"
                ) from None
            hint = "; free some disk space: the session goes on, but what happens until then is not stored" if "full" in str(exc) else ""
            raise StoreError(f"{self.path}: the session store could not be written or read ({exc}){hint}") from None
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                f"{self.path} is not a readable session store ({exc}); move it aside "
                f"(mv {self.path} {self.path}.broken) and a new one will be created"
            ) from None
        except sqlite3.ProgrammingError as exc:  # used after close(), e.g. by a late background fold
            raise StoreError(f"{self.path}: the session store is closed ({exc})") from None


class StoreRecorder:
    """A session listener that records every event; safe to call from the session's and the fold threads.

    A model call's record is written with the next event (the post its reply became, the repair,
    the fold, the round's end): one transaction instead of two, and a kill -9 in between loses
    only what `kill -9` during the call's own write would have. `flush` writes what is held.

    `compression_state(role)` returns that role's CompressionState.to_dict(); with it, each fold also
    saves the role's new state. A store failure in a background thread is raised again on the next
    event from the thread that made the recorder, so the session learns its record is incomplete.
    """

    def __init__(
        self, store: SessionStore, session_id: str, *, compression_state: Callable[[str], dict[str, Any] | None] | None = None
    ) -> None:
        self.store = store
        self.session_id = session_id
        self._compression_state = compression_state
        self._owner = threading.get_ident()
        self._failure: StoreError | None = None
        self._held: list[ModelCalled] = []
        self._held_lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        """Record `event` (the Listener signature)."""
        with self._held_lock:
            if isinstance(event, ModelCalled):
                self._held.append(event)
                held = None
            else:
                held, self._held = self._held, []
        if held is not None:
            try:
                self.store.record(self.session_id, *held, event)
                if isinstance(event, Folded) and self._compression_state is not None:
                    state = self._compression_state(event.role)
                    if state is not None:
                        self.store.save_compression(self.session_id, event.role, state)
            except StoreError as exc:
                if threading.get_ident() != self._owner:
                    self._failure = exc
                    return
                raise
        if self._failure is not None and threading.get_ident() == self._owner:
            failure, self._failure = self._failure, None
            raise failure

    def flush(self) -> None:
        """Write the model-call records still held (the session is closing)."""
        with self._held_lock:
            held, self._held = self._held, []
        self.store.record(self.session_id, *held)


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


def shorten(text: str, limit: int = TITLE_LENGTH) -> str:
    """One line of at most `limit` characters, cut at a word with '…' when longer."""
    line = " ".join(text.split())
    if len(line) <= limit:
        return line
    cut = line[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip(" ,.;:") + "…"


def _ensure_round(db: sqlite3.Connection, session_id: str, rnd: Round) -> None:
    db.execute(
        "INSERT INTO rounds (session_id, round_id, idx, user_query, state, error, started_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (session_id, round_id) DO NOTHING",
        (session_id, rnd.id, rnd.index, rnd.user_query, "running", None, rnd.started_at),
    )


def _write_event(
    db: sqlite3.Connection, session_id: str, event: Event, now: float, *, known_rounds: set[tuple[str, str]], made: set[tuple[str, str]]
) -> None:
    """One event's rows; a round's row is made first unless `known_rounds` has it (`made` collects the new ones)."""
    if isinstance(event, (RoundStarted, PostAdded, RoundEnded)):
        key = (session_id, event.round.id)
        if key not in known_rounds and key not in made:
            _ensure_round(db, session_id, event.round)
            made.add(key)
    if isinstance(event, RoundStarted):
        db.execute("UPDATE sessions SET title = ? WHERE id = ? AND title = ''", (shorten(event.round.user_query), session_id))
    elif isinstance(event, PostAdded):
        _insert_post(db, session_id, event.round.id, event.post)
        if event.post.is_answer:  # the answer ends its round: both are kept in one write
            _end_round(db, session_id, event.round.id, state="finished", error=None, at=now)
    elif isinstance(event, RoundEnded):
        _end_round(db, session_id, event.round.id, state=event.round.state, error=event.round.error, at=now)
    elif isinstance(event, ModelCalled):
        db.execute(
            "INSERT INTO model_calls (session_id, purpose, prompt_tokens, completion_tokens, cached_tokens, latency, ok, error, prompt, reply, at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                session_id,
                event.purpose,
                event.prompt_tokens,
                event.completion_tokens,
                event.cached_tokens,
                event.latency,
                event.ok,
                event.error,
                json.dumps(list(event.prompt), ensure_ascii=False) if event.prompt is not None else None,
                event.reply,
                now,
            ),
        )
    elif isinstance(event, Folded):
        db.execute(
            "INSERT INTO folds (session_id, role, first_round, last_round, tokens_before, tokens_after, ok, error, at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (session_id, event.role, event.first_round, event.last_round, event.tokens_before, event.tokens_after, event.ok, event.error, now),
        )
    elif isinstance(event, FileLoaded):
        db.execute(
            "INSERT INTO files (session_id, name, source, after_round, at) VALUES (?, ?, ?, ?, ?)",
            (session_id, event.name, event.source, event.after_round, event.at),
        )


def _end_round(db: sqlite3.Connection, session_id: str, round_id: str, *, state: str, error: str | None, at: float) -> None:
    db.execute("UPDATE rounds SET state = ?, error = ?, ended_at = ? WHERE session_id = ? AND round_id = ?", (state, error, at, session_id, round_id))


def _insert_post(db: sqlite3.Connection, session_id: str, round_id: str, post: Post) -> None:
    execution = post.execution
    inserted = db.execute(
        "INSERT INTO posts (session_id, round_id, post_id, send_from, send_to, success, created_at, data)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (session_id, post_id) DO NOTHING",
        (
            session_id,
            round_id,
            post.id,
            post.send_from,
            post.send_to,
            execution.success if execution else None,
            post.created_at,
            json.dumps(post.to_dict(), ensure_ascii=False),
        ),
    ).rowcount
    if inserted and execution is not None:
        # Every cell's result carries the kernel's snapshot after it (empty after a kernel death).
        variables = json.dumps([v.to_dict() for v in execution.variables], ensure_ascii=False)
        db.execute("UPDATE sessions SET variables = ? WHERE id = ?", (variables, session_id))
