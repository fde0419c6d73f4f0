"""The store's queries, written once for both backends: `SqlStore` (the rows each event becomes: event_rows.py).

The SQL here is the part SQLite and PostgreSQL share (`?` placeholders, `ON CONFLICT`, `RETURNING`;
the PostgreSQL backend turns `?` into `%s`). What differs sits in the backends: connecting, locking,
migrating, the clock (`now_sql`), reading a cell's code out of a post's JSON (`cell_code_sql`), and
how errors are worded. Booleans are stored as 0/1 integers on both, so one query reads both.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from taskweaver_lite.errors import AmbiguousSessionError, SessionLimitReached, StoreError, UnknownSessionError
from taskweaver_lite.records.conversation import Post, Round
from taskweaver_lite.records.events import CellPrinted, Event, FileLoaded, ReplyStreamed, Working
from taskweaver_lite.records.execution import Variable
from taskweaver_lite.records.model_calls import Usage
from taskweaver_lite.records.tips import Tip, TipKind
from taskweaver_lite.store.event_rows import Connection, EventRows, to_json
from taskweaver_lite.store.interface import INTERRUPTED_ERROR, FileKind, FreedMarks, Lease, LeaseMark, SessionEntry, StoredEvent, StoredSession
from taskweaver_lite.store.user_queries import UserQueries
from taskweaver_lite.store.users import Verifier

# What a session's rows are kept in besides `sessions` itself, children before the tables they refer to.
SESSION_TABLES = ("posts", "rounds", "model_calls", "folds", "compression", "files", "events", "blobs", "tips")
SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# A session's usage from its model calls: calls, failed ones, prompt, completion and cached tokens.
USAGE_SUMS = "COUNT(*), COALESCE(SUM(1 - ok), 0), COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0), COALESCE(SUM(cached_tokens), 0)"
# A session as `load` reads it: (its row, rounds, posts, compression states, loaded files, usage sums).
SessionRows = tuple[Sequence[Any], Sequence[Sequence[Any]], Sequence[Sequence[Any]], Sequence[Sequence[Any]], Sequence[Sequence[Any]], Sequence[Any]]


class SqlStore(UserQueries):
    """The queries of a session store (those about people: user_queries.py).

    A backend gives `_transaction`, `_read`, `lock`, `close` and its dialect (and may give `_read_one`, `_write_one`).
    """

    where: str = ""
    keeps_files: bool = False
    now_sql = ""  # the database's clock in epoch seconds (leases are timed by it, not by a replica's)
    cell_code_sql = ""  # a post's cell code, from its `data` JSON
    cell_died_sql = ""  # whether a post's cell found its kernel dead (`execution.kernel_died`), from its `data` JSON
    cell_seconds_sql = ""  # how long a post's cell ran, from its `data` JSON

    def __init__(self) -> None:
        self._known_rounds: set[tuple[str, str]] = set()  # (session, round) rows this store has made sure of
        self._verifier = Verifier()

    def _transaction(self) -> AbstractContextManager[Connection]:
        """A connection in a write transaction, committed on leaving (each backend gives its own: SQLite's file, PostgreSQL's pool)."""
        raise NotImplementedError(f"{type(self).__name__} is a store backend without _transaction")

    def _read(self) -> AbstractContextManager[Connection]:
        """A connection for a consistent read (each backend gives its own)."""
        raise NotImplementedError(f"{type(self).__name__} is a store backend without _read")

    def _read_one(self) -> AbstractContextManager[Connection]:
        """A connection for a read of one statement, which needs no transaction around it (PostgreSQL spares the round trips)."""
        return self._read()

    def _write_one(self) -> AbstractContextManager[Connection]:
        """A connection for a write of one statement, committed as it runs (PostgreSQL spares the round trips)."""
        return self._transaction()

    # Sessions

    def create_session(self, session_id: str, *, started: float, owner: str | None = None, limit: int | None = None) -> None:
        """Add a new, empty session, owned by the user whose id is `owner` (None: made without users).

        With `limit`, SessionLimitReached when `owner` already has that many sessions, empty ones
        included: counted and made in one transaction that holds the owner's lock, so starts sent at
        once by one user, to any server on the store, are counted one after another.
        """
        if not SESSION_ID.match(session_id):
            raise StoreError(f"'{session_id}' is not a valid session id (letters, digits, '.', '_' and '-' only)")
        with self._transaction() as db:
            if limit is not None and owner is not None:
                self._one_at_a_time(db, f"sessions of {owner}")
                count = int(db.execute("SELECT COUNT(*) FROM sessions WHERE owner = ?", (owner,)).fetchone()[0])
                if count >= limit:
                    unused = db.execute(
                        "SELECT id FROM sessions s WHERE owner = ? AND NOT EXISTS (SELECT 1 FROM rounds r WHERE r.session_id = s.id)"
                        " ORDER BY started DESC LIMIT 1",
                        (owner,),
                    ).fetchone()
                    raise SessionLimitReached(count, limit, unused=None if unused is None else str(unused[0]))
            if db.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone():
                raise StoreError(f"session {session_id} already exists in {self.where}")
            db.execute("INSERT INTO sessions (id, started, last_active, owner) VALUES (?, ?, ?, ?)", (session_id, started, started, owner))

    def _one_at_a_time(self, db: Any, key: str) -> None:
        """Hold `key`'s lock until the transaction ends (SQLite: its write transaction already is one at a time)."""

    def record(
        self,
        session_id: str,
        *events: Event,
        shown: Sequence[dict[str, Any]] = (),
        compression: Mapping[str, dict[str, Any]] | None = None,
        mark: LeaseMark | None = None,
        unmark: FreedMarks | None = None,
    ) -> list[int]:
        """Write session events, `shown` (entries for the event log) and `compression` (roles' new states) in one write; the log entries' ids.

        `mark`: a lease row taken in the same write (over any earlier one), when it writes anything;
        `unmark`: lease rows deleted in it (never `mark`'s own row: it is written over anyway).
        `Working`, `ReplyStreamed`, `CellPrinted` are progress only: they are not recorded. StoreError
        when the session is not stored.
        """
        rows = EventRows(session_id, time.time())
        for event in events:
            if not isinstance(event, (Working, ReplyStreamed, CellPrinted)):
                rows.add(event, known_rounds=self._known_rounds)
        rows.states = {role: to_json(state) for role, state in (compression or {}).items()}
        rows.log = [to_json(item) for item in shown]
        if rows.empty:
            return []
        if mark is not None:
            rows.mark = (
                f"INSERT INTO leases (session_id, holder, expires) VALUES (?, ?, {self.now_sql} + ?)"
                " ON CONFLICT (session_id) DO UPDATE SET holder = excluded.holder, expires = excluded.expires",
                [mark.key, mark.holder, mark.seconds],
            )
        if unmark is not None and (keys := [key for key in unmark.keys if mark is None or key != mark.key]):
            rows.unmark = (f"DELETE FROM leases WHERE holder = ? AND session_id IN ({', '.join('?' * len(keys))})", [unmark.holder, *keys])
        ids = self._write(rows)
        self._known_rounds |= {(session_id, round_id) for round_id in rows.rounds}  # only once committed: a rolled-back round row is made again
        return ids

    def _write(self, rows: EventRows) -> list[int]:
        """Write `rows` in one transaction, statement by statement; the new log entries' ids (PostgreSQL sends them as one statement)."""
        with self._transaction() as db:
            update = rows.session_update()
            found = db.execute(*update) if update is not None else db.execute("SELECT 1 FROM sessions WHERE id = ?", (rows.session_id,))
            if (found.rowcount if update is not None else len(found.fetchall())) == 0:
                raise self._not_stored(rows.session_id)
            for statement in rows.statements():
                db.execute(*statement)
            logged = rows.log_insert()
            return sorted(int(row[0]) for row in db.execute(*logged).fetchall()) if logged is not None else []

    def _not_stored(self, session_id: str) -> StoreError:
        return StoreError(f"session {session_id} is not in {self.where}; it must be created before events are recorded")

    def events_after(self, session_id: str, after: int, *, limit: int = 500) -> list[StoredEvent]:
        """The session's event-log entries with an id above `after`, oldest first (at most `limit`)."""
        with self._read_one() as db:
            rows = db.execute("SELECT id, data, at FROM events WHERE session_id = ? AND id > ? ORDER BY id LIMIT ?", (session_id, after, limit)).fetchall()
        return [StoredEvent(id=int(r[0]), session_id=session_id, data=json.loads(r[1]), at=float(r[2])) for r in rows]

    def last_event_id(self, session_id: str) -> int:
        """The id of the session's newest event-log entry (0: none yet)."""
        with self._read_one() as db:
            row = db.execute("SELECT COALESCE(MAX(id), 0) FROM events WHERE session_id = ?", (session_id,)).fetchone()
        return int(row[0])

    def save_kernel(self, session_id: str, kernel_id: str | None) -> None:
        """Keep the id of the session's kernel on a gateway (None: it has none that outlives its server)."""
        with self._write_one() as db:
            db.execute("UPDATE sessions SET kernel_id = ? WHERE id = ?", (kernel_id, session_id))

    def save_compression(self, session_id: str, role: str, state: dict[str, Any]) -> None:
        """Keep `role`'s CompressionState.to_dict(), replacing the one saved before."""
        now = time.time()
        with self._transaction() as db:
            _save_state(db, session_id, role, state, now)
            db.execute("UPDATE sessions SET last_active = ? WHERE id = ?", (now, session_id))

    def save_overrides(self, session_id: str, overrides: list[str]) -> None:
        """Keep the `--set KEY=VALUE` items a session runs with, for its resume; api keys and the store's own address are never stored."""
        kept = [item for item in overrides if not _secret_setting(item.partition("=")[0].strip())]
        with self._write_one() as db:
            db.execute("UPDATE sessions SET overrides = ? WHERE id = ?", (to_json(kept), session_id))

    def overrides(self, session_id: str) -> list[str]:
        """The `--set` items saved for the session (empty if none were)."""
        with self._read_one() as db:
            row = db.execute("SELECT overrides FROM sessions WHERE id = ?", (session_id,)).fetchone()
        if row is None:
            raise UnknownSessionError(session_id, store=self.where)
        return [str(item) for item in json.loads(row[0])]

    def list_sessions(self, *, owner: str | None = None) -> list[SessionEntry]:
        """Every stored session with at least one round (of `owner` only, when given), most recently active first."""
        # The inner join drops sessions without rounds: chats left, or failed, before their first request.
        mine, params = ("WHERE s.owner = ? ", (owner,)) if owner is not None else ("", ())
        with self._read_one() as db:
            # The owner by name, for people to read (an owner no longer among the users reads `removed:NAME`).
            rows = db.execute(
                "SELECT s.id, s.title, COUNT(*), s.started, s.last_active, COALESCE(u.name, s.owner) FROM sessions s "
                f"JOIN rounds r ON r.session_id = s.id LEFT JOIN users u ON u.id = s.owner {mine}"
                "GROUP BY s.id, s.title, s.started, s.last_active, s.owner, u.name ORDER BY s.last_active DESC, s.started DESC",
                params,
            ).fetchall()
        return [SessionEntry(id=r[0], title=r[1], rounds=int(r[2]), started=float(r[3]), last_active=float(r[4]), owner=r[5]) for r in rows]

    def count_sessions(self, *, owner: str) -> int:
        """How many sessions `owner` has, those never asked anything included (what serve.max_sessions_per_user counts)."""
        with self._read_one() as db:
            row = db.execute("SELECT COUNT(*) FROM sessions WHERE owner = ?", (owner,)).fetchone()
        return int(row[0])

    def resolve(self, ref: str, *, owner: str | None = None) -> str:
        """The session id `ref` names: 'last' (the most recently active one with a round), an id, or a unique start of one.

        With `owner`, only that user's sessions are candidates: another's is unknown, as if absent.
        """
        # Each step is one statement of its own (no transaction around them): an exact id, which every
        # request to a session checks, is one round trip.
        mine, params = (" AND owner = ?", (owner,)) if owner is not None else ("", ())
        if ref == "last":
            with self._read_one() as db:
                row = db.execute(
                    f"SELECT id FROM sessions s WHERE EXISTS (SELECT 1 FROM rounds r WHERE r.session_id = s.id){mine}"
                    " ORDER BY last_active DESC, started DESC LIMIT 1",
                    params,
                ).fetchone()
            if row is None:
                raise StoreError(f"there are no stored sessions in {self.where} yet")
            return str(row[0])
        with self._read_one() as db:
            if db.execute(f"SELECT 1 FROM sessions WHERE id = ?{mine}", (ref, *params)).fetchone():
                return ref
        pattern = ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        with self._read_one() as db:
            found = db.execute(f"SELECT id FROM sessions WHERE id LIKE ? ESCAPE '\\'{mine} ORDER BY id", (pattern, *params)).fetchall()
        matches = [str(r[0]) for r in found]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise AmbiguousSessionError(f"'{ref}' matches several sessions ({', '.join(matches[:5])}); give more of the id")
        raise UnknownSessionError(ref, store=self.where)

    def owner_of(self, session_id: str) -> str | None:
        """The user who made the session (None: made without users); UnknownSessionError when there is none."""
        with self._read_one() as db:
            row = db.execute("SELECT owner FROM sessions WHERE id = ?", (session_id,)).fetchone()
        if row is None:
            raise UnknownSessionError(session_id, store=self.where)
        return None if row[0] is None else str(row[0])

    def load(self, session_id: str) -> StoredSession:
        """The whole session: rounds rebuilt from their posts in order, summaries, usage, crash marks."""
        found = self._session_rows(session_id)
        if found is None:
            raise UnknownSessionError(session_id, store=self.where)
        head, round_rows, post_rows, states, loads, usage = found
        rounds = {r[0]: Round(id=r[0], index=r[1], user_query=r[2], state=r[3], error=r[4], started_at=r[5], posts=[]) for r in round_rows}
        for round_id, data in post_rows:
            rounds[round_id].posts.append(Post.from_dict(json.loads(data)))
        ordered = list(rounds.values())
        return StoredSession(
            id=session_id,
            title=head[0],
            started=float(head[1]),
            last_active=float(head[2]),
            rounds=ordered,
            compression={role: json.loads(state) for role, state in states},
            usage=_usage([int(n) for n in usage]),
            interrupted=tuple(r.index for r in ordered if r.state == "running"),
            last_variables=tuple(Variable.from_dict(v) for v in json.loads(head[3])),
            loads=tuple(FileLoaded(name=r[0], source=r[1], after_round=r[2], at=r[3]) for r in loads),
            overrides=tuple(json.loads(head[4])),
            owner=head[5],
            kernel_id=head[6],
        )

    def _session_rows(self, session_id: str) -> SessionRows | None:
        """What `load` reads, as one moment of the session: its row, rounds, posts, compression states, loaded files, usage sums (None: no such session)."""
        with self._read() as db:
            head = db.execute("SELECT title, started, last_active, variables, overrides, owner, kernel_id FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if head is None:
                return None
            round_rows = db.execute(
                "SELECT round_id, idx, user_query, state, error, started_at FROM rounds WHERE session_id = ? ORDER BY seq", (session_id,)
            ).fetchall()
            post_rows = db.execute("SELECT round_id, data FROM posts WHERE session_id = ? ORDER BY seq", (session_id,)).fetchall()
            states = db.execute("SELECT role, state FROM compression WHERE session_id = ?", (session_id,)).fetchall()
            loads = db.execute("SELECT name, source, after_round, at FROM files WHERE session_id = ? ORDER BY seq", (session_id,)).fetchall()
            usage = db.execute(f"SELECT {USAGE_SUMS} FROM model_calls WHERE session_id = ?", (session_id,)).fetchone()
        return head, round_rows, post_rows, states, loads, usage

    def delete_session(self, session_id: str) -> bool:
        """Forget a session and everything kept of it (rounds, events, model calls, files, the tips saved from it); False when there is none.

        Its tips go with it: what was learnt from a user's session is that user's, and kept without it
        would be everyone's. The caller makes sure no request runs in it (its claim or its lease).
        """
        with self._transaction() as db:
            if db.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
                return False
            for table in SESSION_TABLES:
                db.execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))
            # Its lease and the lease's marks ("<id>:answered", "<id>:stop"); an id never holds a ':'.
            db.execute("DELETE FROM leases WHERE session_id = ? OR substr(session_id, 1, ?) = ?", (session_id, len(session_id) + 1, session_id + ":"))
            db.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
        self._known_rounds = {key for key in self._known_rounds if key[0] != session_id}
        return True

    def mark_interrupted(self, session_id: str) -> tuple[int, ...]:
        """Fail the rounds a crash left 'running'; returns their indexes (to tell the user)."""
        now = time.time()
        with self._transaction() as db:
            rows = db.execute("SELECT seq, idx FROM rounds WHERE session_id = ? AND state = 'running' ORDER BY seq", (session_id,)).fetchall()
            for seq, _ in rows:
                db.execute("UPDATE rounds SET state = 'failed', error = ?, ended_at = COALESCE(ended_at, ?) WHERE seq = ?", (INTERRUPTED_ERROR, now, seq))
        return tuple(int(idx) for _, idx in rows)

    def drop_round(self, session_id: str, round_id: str) -> None:
        """Forget one request and its posts (/undo); the model calls it made stay counted."""
        with self._transaction() as db:
            db.execute("DELETE FROM posts WHERE session_id = ? AND round_id = ?", (session_id, round_id))
            db.execute("DELETE FROM rounds WHERE session_id = ? AND round_id = ?", (session_id, round_id))

    def successful_cells(self, session_id: str) -> list[str]:
        """The code of every cell that ran without error in the session's kernel as it stands, in order (for the kernel replay).

        Rounds of every state count: the kernel ran a failed round's good cells all the same. A kernel
        that died took its variables with it: only the cells since the last death count (the cell that
        noticed it, when it ran in the new kernel), so a replay gives what the session had, no more.
        """
        with self._read_one() as db:
            rows = db.execute(
                f"SELECT {self.cell_code_sql}, success, {self.cell_died_sql} FROM posts WHERE session_id = ? AND {self.cell_code_sql} IS NOT NULL ORDER BY seq",
                (session_id,),
            ).fetchall()
        since = max((number for number, row in enumerate(rows) if _true(row[2])), default=0)
        return [row[0] for row in rows[since:] if row[1]]

    # Artifacts and uploads

    def put_file(self, session_id: str, kind: FileKind, name: str, data: bytes) -> None:
        """Keep a file of the session as bytes (replacing one of that kind and name)."""
        with self._write_one() as db:
            db.execute(
                "INSERT INTO blobs (session_id, kind, name, data, size, at) VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (session_id, kind, name) DO UPDATE SET data = excluded.data, size = excluded.size, at = excluded.at",
                (session_id, kind, name, data, len(data), time.time()),
            )

    def file(self, session_id: str, kind: FileKind, name: str) -> bytes | None:
        """A kept file's bytes; None when there is none."""
        with self._read_one() as db:
            row = db.execute("SELECT data FROM blobs WHERE session_id = ? AND kind = ? AND name = ?", (session_id, kind, name)).fetchone()
        return None if row is None else bytes(row[0])

    def file_names(self, session_id: str, kind: FileKind) -> list[str]:
        """The names of the session's kept files of `kind`, in order."""
        with self._read_one() as db:
            rows = db.execute("SELECT name FROM blobs WHERE session_id = ? AND kind = ? ORDER BY name", (session_id, kind)).fetchall()
        return [str(r[0]) for r in rows]

    # Tips

    def save_tips(self, session_id: str, tips: Sequence[tuple[TipKind, str]]) -> list[Tip]:
        """Store tips (kind, text) distilled from `session_id` in place of those saved from it before; returns them with their ids.

        A later /save reads the whole session again, so its tips supersede the earlier ones (one transaction).
        """
        now = time.time()
        with self._transaction() as db:
            db.execute("DELETE FROM tips WHERE session_id = ?", (session_id,))
            ids = [
                db.execute("INSERT INTO tips (kind, text, session_id, created_at) VALUES (?, ?, ?, ?) RETURNING id", (k, t, session_id, now)).fetchone()[0]
                for k, t in tips
            ]
        return [Tip(id=str(n), kind=k, text=t, source=session_id, created_at=now) for n, (k, t) in zip(ids, tips, strict=True)]

    def stored_tips(self, *, owner: str | None = None) -> list[Tip]:
        """Every stored tip, oldest first; with `owner`, only those from that user's sessions."""
        # Not those of sessions made before there were users: they were nobody's, so they are not every user's either.
        mine, params = (" WHERE s.owner = ?", (owner,)) if owner is not None else ("", ())
        with self._read_one() as db:
            rows = db.execute(
                f"SELECT t.id, t.kind, t.text, t.session_id, t.created_at FROM tips t LEFT JOIN sessions s ON s.id = t.session_id{mine} ORDER BY t.id",
                params,
            ).fetchall()
        return [Tip(id=str(r[0]), kind=r[1], text=r[2], source=r[3], created_at=float(r[4])) for r in rows]

    def search_tips(self, text: str, *, owner: str | None = None, limit: int) -> list[Tip] | None:
        """The stored tips that fit `text`, best first, when the database searches them; None: search them in memory (SQLite's FTS5)."""
        return None

    def tips_version(self) -> tuple[int, int]:
        """(count, newest id) of the stored tips: changes with every save and delete (ids are never reused)."""
        with self._read_one() as db:
            count, newest = db.execute("SELECT COUNT(*), COALESCE(MAX(id), 0) FROM tips").fetchone()
        return int(count), int(newest)

    def delete_tip(self, tip_id: int, *, owner: str | None = None) -> bool:
        """Delete one stored tip (with `owner`: only one of that user's); False when there is none with that id."""
        mine, params = (" AND session_id IN (SELECT id FROM sessions WHERE owner = ?)", (owner,)) if owner is not None else ("", ())
        with self._write_one() as db:
            return db.execute(f"DELETE FROM tips WHERE id = ?{mine}", (tip_id, *params)).rowcount > 0

    # Leases

    def take_lease(self, session_id: str, holder: str, *, seconds: float) -> Lease | None:
        """Claim the session's lease for `seconds` (when free, expired, or already `holder`'s); None when another holds it.

        Taken from a holder that freed it (`release_lease`), it carries the session's newest event id
        as it was freed: the row is read as it is taken, whatever committed before (no snapshot of an
        earlier moment), so no write of the holder's can be missing from it.
        """
        with self._write_one() as db:
            row = db.execute(
                f"INSERT INTO leases (session_id, holder, expires) VALUES (?, ?, {self.now_sql} + ?)"
                " ON CONFLICT (session_id) DO UPDATE SET holder = excluded.holder, expires = excluded.expires,"
                " version = CASE WHEN leases.holder = '' THEN leases.version ELSE -1 END"
                f" WHERE leases.holder = excluded.holder OR leases.expires < {self.now_sql} RETURNING holder, expires, version",
                (session_id, holder, seconds),
            ).fetchone()
        return None if row is None else Lease(session_id=session_id, holder=str(row[0]), expires=float(row[1]), version=int(row[2]))

    def renew_leases(self, held: Sequence[tuple[str, str]], *, seconds: float, read: Sequence[str] = ()) -> tuple[set[str], dict[str, str]]:
        """Extend each (key, holder) lease by `seconds` from now where `holder` still has it, and read the leases `read` as they are.

        Returns the keys renewed, and the holder of each lease of `read` not run out. A replica's
        whole renewal (its leases, their marks, and the Stop rows it looks for) in one write.
        """
        with self._transaction() as db:
            renewed = {
                key
                for key, holder in held
                if db.execute(f"UPDATE leases SET expires = {self.now_sql} + ? WHERE session_id = ? AND holder = ?", (seconds, key, holder)).rowcount
            }
            found = (
                db.execute(
                    f"SELECT session_id, holder FROM leases WHERE session_id IN ({', '.join('?' * len(read))}) AND expires >= {self.now_sql}", tuple(read)
                ).fetchall()
                if read
                else []
            )
        return renewed, {str(key): str(holder) for key, holder in found}

    def release_lease(self, session_id: str, holder: str, *, marks: Sequence[str] = ()) -> int:
        """Free the session's lease if `holder` has it, and at the same moment `holder`'s marks on it (the rows `session_id + mark`).

        Returns the session's newest event-log id as it was while the lease was still held: what
        the holder's copy of the session is current with, when it wrote everything since it took it.
        The lease's row stays, freed (no holder, run out), with that id: the next `take_lease` reads it.
        """
        with self._transaction() as db:
            newest = int(db.execute("SELECT COALESCE(MAX(id), 0) FROM events WHERE session_id = ?", (session_id,)).fetchone()[0])
            if marks:
                keys = [session_id + mark for mark in marks]
                db.execute(f"DELETE FROM leases WHERE holder = ? AND session_id IN ({', '.join('?' * len(keys))})", (holder, *keys))
            db.execute("UPDATE leases SET holder = '', expires = 0, version = ? WHERE session_id = ? AND holder = ?", (newest, session_id, holder))
        return newest

    def lease(self, session_id: str) -> Lease | None:
        """The session's current, unexpired lease; None when it is free."""
        with self._read_one() as db:
            row = db.execute(f"SELECT holder, expires FROM leases WHERE session_id = ? AND expires >= {self.now_sql}", (session_id,)).fetchone()
        return None if row is None else Lease(session_id=session_id, holder=str(row[0]), expires=float(row[1]))

    # Eval results

    def save_eval_result(self, run_id: str, case: str, result: dict[str, Any]) -> None:
        """Keep one case's result of an eval run (replacing an earlier one of that case)."""
        with self._write_one() as db:
            db.execute(
                "INSERT INTO eval_results (run_id, case_name, result, at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (run_id, case_name) DO UPDATE SET result = excluded.result, at = excluded.at",
                (run_id, case, to_json(result), time.time()),
            )

    def eval_results(self, run_id: str) -> dict[str, dict[str, Any]]:
        """An eval run's results by case name."""
        with self._read_one() as db:
            rows = db.execute("SELECT case_name, result FROM eval_results WHERE run_id = ? ORDER BY case_name", (run_id,)).fetchall()
        return {str(r[0]): json.loads(r[1]) for r in rows}

    def ping(self) -> None:
        """Raise StoreError when the store cannot be reached."""
        with self._read_one() as db:
            db.execute("SELECT 1").fetchone()


def _save_state(db: Connection, session_id: str, role: str, state: dict[str, Any], now: float) -> None:
    """Keep `role`'s compression state in place of the one saved before."""
    db.execute(
        "INSERT INTO compression (session_id, role, state, saved_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (session_id, role) DO UPDATE SET state = excluded.state, saved_at = excluded.saved_at",
        (session_id, role, to_json(state), now),
    )


def _secret_setting(key: str) -> bool:
    """A setting whose value may hold a secret: an api key, or the store's URL (its password; a resume is in that store anyway)."""
    return "api_key" in key or key == "store.url"


def _usage(sums: list[int]) -> Usage:
    calls, failed, prompt, completion, cached = sums
    return Usage(calls=calls, failed_calls=failed, prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)


def _true(value: object) -> bool:
    """A JSON boolean as a backend reads it out of a document: 1 (SQLite), true or 'true' (PostgreSQL)."""
    return value in (1, True, "true")
