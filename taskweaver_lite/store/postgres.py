"""The PostgreSQL session store (`store.url: postgresql://...`): everything a team's servers share.

    store = PostgresStore("postgresql://tw:PASSWORD@db:5432/taskweaver")

It runs the queries of `sql.SqlStore` (their `?` become psycopg's `%s`) over a connection pool
(psycopg_pool) that the process keeps per URL: every session a server opens shares it. Each method
is one transaction; the pool's connections are in autocommit, so a method of one statement sends it
alone: one round trip instead of BEGIN, it and COMMIT. A write of events (`record`) is one
statement, each table's rows a data-modifying `WITH`; a load (`load`) is one too, each table's rows
as an array: one moment of the session, one round trip, no transaction around either.

What differs from the SQLite file:
- A session open in a process is claimed by a session-level advisory lock on a connection of its
  own: PostgreSQL drops it when that connection ends, so a killed process frees its sessions.
- Artifacts and uploads are kept as bytes (`keeps_files`): any server can serve and export them.
- Appending to a session's event log sends `NOTIFY twl_events` with the session's id, on commit, when
  a process follows that session's events (a `followers` row, kept by `PostgresNotices.follow` while
  an event stream is open there); the processes hear it, and their own notices, through
  `PostgresNotices` (LISTEN on one connection). A write nobody follows wakes nobody.
- Tips are ranked in memory (FTS5's BM25, knowledge/experience.py), as on SQLite. Every change of
  them notices `twl_tips` (a trigger), so a process that LISTENs keeps their version in memory
  (`TipsVersion`) and asks the store for it only after a change; one that does not asks at each search.
- The URL's password is never shown: messages name the store by `url.redact`, and a driver's error
  passes through `url.redact_text` before it is worded.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg_pool

from taskweaver_lite.config.store_url import redact, redact_text
from taskweaver_lite.errors import SessionBusyError, StoreError, StoreUnavailable
from taskweaver_lite.store.event_rows import EventRows, Rows
from taskweaver_lite.store.postgres_schema import MIGRATIONS, migrate
from taskweaver_lite.store.sql import SESSION_ID, USAGE_SUMS, SessionRows, SqlStore

# Seconds between attempts to listen again after the LISTEN connection dropped.
LISTEN_RETRY_SECONDS = 1.0
CONNECT_TIMEOUT_SECONDS = 5.0  # waiting for a connection (the database down, or every connection busy) before a StoreError
# While the database is known to be down, a request is answered at once (no 5 s wait for a connection);
# one request in this many seconds tries a connection of its own, and the first that gets one ends the outage.
PROBE_INTERVAL_SECONDS = 0.5
PROBE_TIMEOUT_SECONDS = 2
# Seconds a process's following of a session lasts unless renewed (each third of it, by its LISTEN thread): a process
# that dies leaves rows that cost the writers of those sessions a notice each until then, nothing more.
FOLLOW_SECONDS = 60.0
_log = logging.getLogger(__name__)

TIPS_CHANNEL = "twl_tips"  # every change of the stored tips (postgres_schema.py's version 8)

_POOLS: dict[str, psycopg_pool.ConnectionPool[Any]] = {}
_POOLS_GUARD = threading.Lock()


class Outage:
    """Whether a database is down, as this process last found it, and the probe that finds it back (one per URL, shared by its stores).

    A pool waits for a connection before it gives up (CONNECT_TIMEOUT_SECONDS), and after failed
    attempts tries again later and later (psycopg_pool's back-off: 1, 2, 4... s per connection,
    every connection of the pool at once after a while). An outage of a minute then cost every
    request 5 s before its 503, and ~20 s after the database was back before the first request
    got through. Here, once an operation finds the database unreachable, requests fail at once;
    one of them every PROBE_INTERVAL_SECONDS connects on its own, and when that works the outage
    is over: the pool, still waiting out its back-off, is replaced by a fresh one.
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self._lock = threading.Lock()
        self.since: float | None = None  # monotonic time it was found down (None: up)
        self._probed = 0.0
        self._failed_probes = 0

    def found_down(self) -> None:
        """An operation could not reach the database."""
        with self._lock:
            if self.since is None:
                self.since, self._probed, self._failed_probes = time.monotonic(), 0.0, 0

    def usable(self) -> bool:
        """True when the database is up, or was just found back by this call's probe; False: down (answer at once)."""
        if self.since is None:
            return True
        if not self._lock.acquire(blocking=False):
            return False  # another request is probing now
        try:
            if self.since is None:
                return True
            now = time.monotonic()
            if now - self._probed < PROBE_INTERVAL_SECONDS:
                return False
            self._probed = now
            try:
                with psycopg.connect(self._url, connect_timeout=PROBE_TIMEOUT_SECONDS, autocommit=True) as conn:
                    conn.execute("SELECT 1")
            except psycopg.Error:
                self._failed_probes += 1
                return False
            if self._failed_probes:  # down a while: the pool's retries may be far off, so start a fresh pool
                _replace_pool(self._url)
            self.since = None
            return True
        finally:
            self._lock.release()


_OUTAGES: dict[str, Outage] = {}


class TipsVersion:
    """The stored tips' version as this process last read it (one per URL): trusted only while its LISTEN connection hears every change.

    A change notices `twl_tips` as it commits; hearing it forgets the version, and so does the
    connection coming up or going down (what changed meanwhile was not heard). A version read
    while a change was heard is not kept: it may be older than that change.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hearing = False
        self._changes = 0  # changes heard (and connections made or lost) so far
        self._known: tuple[int, int] | None = None

    def read(self, fetch: Callable[[], tuple[int, int]]) -> tuple[int, int]:
        """The version: the one kept, or `fetch`ed from the store (and kept while every change is heard)."""
        with self._lock:
            if self._known is not None:
                return self._known
            changes = self._changes
        version = fetch()
        with self._lock:
            if self._hearing and changes == self._changes:
                self._known = version
        return version

    def changed(self, _payload: str = "") -> None:
        """A change of the tips was heard."""
        with self._lock:
            self._changes += 1
            self._known = None

    def hearing(self, on: bool) -> None:
        """The LISTEN connection came up (every change is heard from now on) or went down."""
        with self._lock:
            self._hearing = on
            self._changes += 1
            self._known = None


_TIPS: dict[str, TipsVersion] = {}


def _tips_version(url: str) -> TipsVersion:
    """The process's record of `url`'s tips version."""
    with _POOLS_GUARD:
        return _TIPS.setdefault(url, TipsVersion())


def _pool_for(url: str, size: int) -> psycopg_pool.ConnectionPool[Any]:
    """The process's pool for `url` (made on first use, closed at exit)."""
    with _POOLS_GUARD:
        pool = _POOLS.get(url)
        if pool is None:
            pool = psycopg_pool.ConnectionPool(
                url,
                min_size=1,
                max_size=size,
                timeout=CONNECT_TIMEOUT_SECONDS,
                check=_check_connection,
                # Each statement commits as it runs unless a transaction is opened (`_transaction`, `_read`): a
                # statement alone is one round trip, and lending a connection never changes its mode.
                # Each statement is prepared on its first use (a few dozen, each sent again and again): PostgreSQL
                # parses and plans it once per connection, not once per request.
                kwargs={"connect_timeout": int(CONNECT_TIMEOUT_SECONDS), "autocommit": True, "prepare_threshold": 0, "options": _read_committed(url)},
                name="taskweaver-lite-store",
                open=False,
            )
            pool.open(wait=False)
            _POOLS[url] = pool
        return pool


def _read_committed(url: str) -> str:
    """The URL's own server options, and READ COMMITTED for every transaction, whatever the database's default.

    A write's check for the session's followers reads them after it waits for their lock
    (`follow`): only a fresh snapshot for each statement, READ COMMITTED's, then sees a follower
    that registered meanwhile. Under a default of REPEATABLE READ or SERIALIZABLE the write would
    not notice it, and its stream would wait for the next poll of the store.
    """
    own = psycopg.conninfo.conninfo_to_dict(url).get("options") or ""
    return f"{own} -c default_transaction_isolation=read\\ committed".strip()


def _outage(url: str) -> Outage:
    """The process's record of `url`'s outages."""
    with _POOLS_GUARD:
        return _OUTAGES.setdefault(url, Outage(url))


def _replace_pool(url: str) -> None:
    """Close `url`'s pool (in the background: its borrowed connections are dead anyway); the next use makes a new one."""
    with _POOLS_GUARD:
        old = _POOLS.pop(url, None)
    if old is not None:
        threading.Thread(target=old.close, kwargs={"timeout": 1.0}, name="store-pool-close", daemon=True).start()


def _check_connection(conn: psycopg.Connection[Any]) -> None:
    """Before a pooled connection is lent: a round trip only when its idle socket has something to read.

    An idle connection receives nothing unless the database is closing it (a restart sends its notice
    and hangs up); the round trip then fails and the pool replaces the connection. Checking every
    connection so would cost a round trip per transaction."""
    readable, _, _ = select.select([conn.fileno()], [], [], 0)
    if readable:
        psycopg_pool.ConnectionPool.check_connection(conn)


@atexit.register
def close_pools(url: str | None = None) -> None:
    """Close the process's pool for `url` (every pool when None): at exit, or when a store could not be opened."""
    with _POOLS_GUARD:
        if url is None:
            pools = list(_POOLS.values())
            _POOLS.clear()
        else:
            pools = [_POOLS.pop(url)] if url in _POOLS else []
    for pool in pools:
        pool.close(timeout=1.0)


class _Connection:
    """A psycopg connection speaking the shared queries' `?` placeholders."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> Rows:
        return self._conn.execute(_dialect(sql), params)  # our own constant SQL, not user text


_TRANSLATED: dict[str, str] = {}


def _dialect(sql: str) -> str:
    """`?` placeholders as psycopg's `%s` (a literal `%` doubled); the queries hold no `?` elsewhere."""
    done = _TRANSLATED.get(sql)
    if done is None:
        done = _TRANSLATED[sql] = sql.replace("%", "%%").replace("?", "%s")
    return done


class PostgresStore(SqlStore):
    """Sessions, users, tips, files and leases in one PostgreSQL database, shared by every server that names it."""

    keeps_files = True
    now_sql = "extract(epoch from clock_timestamp())::double precision"
    cell_code_sql = "(data::jsonb -> 'execution' ->> 'code')"
    cell_died_sql = "(data::jsonb -> 'execution' ->> 'kernel_died')"
    cell_seconds_sql = "COALESCE((data::jsonb -> 'execution' ->> 'elapsed')::double precision, 0)"

    def __init__(self, url: str, *, pool_size: int = 10) -> None:
        """Connect (through the process's pool for `url`) and bring the schema up to date; StoreError when it cannot."""
        super().__init__()
        self._url = url
        self.where = redact(url)
        self._pool_size = pool_size
        self._outage = _outage(url)
        try:
            with self._errors(), self._first_connection() as conn:
                migrate(conn, MIGRATIONS, where=self.where)
        except StoreError:
            close_pools(url)  # no pool left retrying in the background for a store this process could not open
            raise
        _pool_for(url, pool_size)  # its connections are made in the background, ready for the first request

    @contextmanager
    def _first_connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection to open the store on: the pool's when this process has one for the URL, else one of its own.

        The pool, asked for its first connection, keeps trying for CONNECT_TIMEOUT_SECONDS whatever the
        reason; a connection of its own fails at once when nothing listens at the address or the
        server refuses the user, password or database, and says which (a typo in store.url shows as
        `serve` starts, not 5 s later as a timeout).
        """
        if self._url in _POOLS:
            with self._pool.connection() as conn:
                yield conn
            return
        try:
            conn = psycopg.connect(self._url, connect_timeout=int(CONNECT_TIMEOUT_SECONDS), autocommit=True)  # as the pool's: migrate opens its transactions
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(
                f"the session store {self.where} could not be opened ({_said(exc)}); check store.url (host, port, user, password "
                "and database) and that PostgreSQL is running there"
            ) from None
        with conn:  # closed on leaving
            yield conn

    def __repr__(self) -> str:
        return f"PostgresStore({self.where!r})"

    @property
    def _pool(self) -> psycopg_pool.ConnectionPool[Any]:
        """The process's pool for this database (a new one after an outage)."""
        return _pool_for(self._url, self._pool_size)

    @contextmanager
    def _transaction(self) -> Iterator[_Connection]:
        with self._errors(), self._pool.connection() as conn, conn.transaction():  # committed on leaving, rolled back on an exception
            yield _Connection(conn)

    def _one_at_a_time(self, db: Any, key: str) -> None:
        """Hold a transaction-scoped advisory lock on `key` (every server on this database waits its turn for it)."""
        db.execute("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", (key,))

    @contextmanager
    def _read(self) -> Iterator[_Connection]:
        with self._errors(), self._pool.connection() as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")  # one round trip, not BEGIN and then SET
            try:
                yield _Connection(conn)
            finally:
                _end_read(conn)

    @contextmanager
    def _one(self) -> Iterator[_Connection]:
        """One statement, its own transaction: a round trip instead of three (BEGIN, it, COMMIT)."""
        with self._errors(), self._pool.connection() as conn:
            yield _Connection(conn)

    _read_one = _write_one = _one

    def _write(self, rows: EventRows) -> list[int]:
        """The whole write as one statement (each table's rows a data-modifying `WITH`): atomic with no transaction around it, one round trip.

        Its log entries send one `NOTIFY twl_events` with the session's id, on commit, if a process
        follows the session (`follow`). A session
        that is not stored fails the rows' foreign keys, or finds no row to update.
        """
        parts: list[str] = []
        params: list[Any] = []
        update = rows.session_update()
        if update is not None:
            parts.append(f"touched AS ({update[0]} RETURNING 1)")
            params += update[1]
        for number, (sql, values) in enumerate(rows.statements()):
            parts.append(f"w{number} AS ({sql})")
            params += values
        logged = rows.log_insert()
        if logged is not None:
            parts.append(f"logged AS ({logged[0]})")
            params += logged[1]
        found = "(SELECT COUNT(*) FROM touched)" if update is not None else "(SELECT COUNT(*) FROM sessions WHERE id = ?)"
        params += [] if update is not None else [rows.session_id]
        ids = "ARRAY(SELECT id FROM logged ORDER BY id)" if logged is not None else "NULL"
        # The notice goes out only when some process follows the session (postgres_schema.py's version 7).
        notify = ", taskweaver_lite_events_logged(?)" if logged is not None else ""
        params += [rows.session_id] if logged is not None else []
        statement = f"WITH {', '.join(parts)} SELECT {found}, {ids}{notify}" if parts else f"SELECT {found}, {ids}"
        with self._one() as db:
            try:
                row = db.execute(statement, params).fetchone()
            except psycopg.errors.ForeignKeyViolation:
                raise self._not_stored(rows.session_id) from None
        if not row[0]:
            raise self._not_stored(rows.session_id)
        return [int(n) for n in row[1] or []]

    def _session_rows(self, session_id: str) -> SessionRows | None:
        """As SqlStore's, in one statement (one moment of the session without a transaction, one round trip): each table's rows as arrays."""
        with self._read_one() as db:
            row = db.execute(
                "SELECT s.title, s.started, s.last_active, s.variables, s.overrides, s.owner, s.kernel_id,"
                " (SELECT json_agg(json_build_array(round_id, idx, user_query, state, error, started_at) ORDER BY seq) FROM rounds WHERE session_id = s.id),"
                " ARRAY(SELECT round_id FROM posts WHERE session_id = s.id ORDER BY seq), ARRAY(SELECT data FROM posts WHERE session_id = s.id ORDER BY seq),"
                " (SELECT json_agg(json_build_array(role, state)) FROM compression WHERE session_id = s.id),"
                " (SELECT json_agg(json_build_array(name, source, after_round, at) ORDER BY seq) FROM files WHERE session_id = s.id),"
                f" (SELECT ARRAY[{USAGE_SUMS}] FROM model_calls WHERE session_id = s.id)"
                " FROM sessions s WHERE s.id = ?",
                (session_id,),
            ).fetchone()
        if row is None:
            return None
        rounds, post_rounds, post_data, states, loads, usage = row[7:]
        return row[:7], rounds or [], list(zip(post_rounds, post_data, strict=True)), states or [], loads or [], usage

    def release_lease(self, session_id: str, holder: str, *, marks: Sequence[str] = ()) -> int:
        """As SqlStore's, in one statement: the newest id is read in the snapshot the lease is freed in (nobody else writes until then)."""
        keys = [session_id + mark for mark in marks]
        unmarked = f"unmarked AS (DELETE FROM leases WHERE holder = ? AND session_id IN ({', '.join('?' * len(keys))}))," if keys else ""
        with self._write_one() as db:
            row = db.execute(
                f"WITH {unmarked} newest AS (SELECT COALESCE(MAX(id), 0) AS id FROM events WHERE session_id = ?),"
                " freed AS (UPDATE leases SET holder = '', expires = 0, version = (SELECT id FROM newest) WHERE session_id = ? AND holder = ?)"
                " SELECT id FROM newest",
                (*([holder, *keys] if keys else []), session_id, session_id, holder),
            ).fetchone()
        return int(row[0])

    def renew_leases(self, held: Sequence[tuple[str, str]], *, seconds: float, read: Sequence[str] = ()) -> tuple[set[str], dict[str, str]]:
        """As SqlStore's, in one statement (the leases of `read` as they were before it: it renews none of them)."""
        if not held and not read:
            return set(), {}
        pairs = ", ".join(["(?, ?)"] * len(held)) if held else "(NULL, NULL)"
        keys = ", ".join("?" * len(read)) if read else "NULL"
        with self._write_one() as db:
            rows = db.execute(
                f"WITH renewed AS (UPDATE leases SET expires = {self.now_sql} + ? WHERE (session_id, holder) IN (VALUES {pairs}) RETURNING session_id)"
                " SELECT session_id, NULL FROM renewed"
                f" UNION ALL SELECT session_id, holder FROM leases WHERE session_id IN ({keys}) AND expires >= {self.now_sql}",
                (seconds, *(value for pair in held for value in pair), *read),
            ).fetchall()
        return {str(key) for key, holder in rows if holder is None}, {str(key): str(holder) for key, holder in rows if holder is not None}

    def tips_version(self) -> tuple[int, int]:
        """As SqlStore's; kept in memory while this process hears every change of the tips (`TipsVersion`), so a search asks nothing then."""
        return _tips_version(self._url).read(super().tips_version)

    def lock(self, session_id: str) -> AdvisoryClaim:
        """Claim the session for this process; SessionBusyError if another process (on any machine) has it open."""
        if not SESSION_ID.match(session_id):
            raise StoreError(f"'{session_id}' is not a valid session id")
        with self._errors():
            return AdvisoryClaim(self._url, session_id, where=self.where)

    def notices(self) -> PostgresNotices:
        """LISTEN and NOTIFY on this database: the store's notices of new events, and the servers' own."""
        return PostgresNotices(self._url, store=self)

    def follow(self, session_id: str, follower: str, *, seconds: float) -> None:
        """From now on (for `seconds`, unless renewed), each write of the session's events notices `follower`'s process.

        Taken exclusively, the lock on the session's events that each write holds (shared) from its
        check of the followers to its commit: a write under way either checks after this row is in,
        or commits before this returns, so what the follower reads next holds it.
        """
        with self._transaction() as db:
            self._one_at_a_time(db, f"taskweaver-lite events of {session_id}")
            db.execute(
                f"INSERT INTO followers (session_id, follower, expires) VALUES (?, ?, {self.now_sql} + ?)"
                " ON CONFLICT (session_id, follower) DO UPDATE SET expires = excluded.expires",
                (session_id, follower, seconds),
            )

    def unfollow(self, session_id: str, follower: str) -> None:
        """`follower`'s process no longer follows the session: its writes stop noticing it."""
        with self._write_one() as db:
            db.execute("DELETE FROM followers WHERE session_id = ? AND follower = ?", (session_id, follower))

    def renew_following(self, follower: str, session_ids: Sequence[str], *, seconds: float) -> None:
        """`follower` follows `session_ids` for `seconds` more (rows lost meanwhile made again); rows that ran out long ago go."""
        with self._write_one() as db:
            db.execute(
                f"WITH gone AS (DELETE FROM followers WHERE expires < {self.now_sql} - ?)"
                f" INSERT INTO followers (session_id, follower, expires) SELECT unnest(?::text[]), ?, {self.now_sql} + ?"
                " ON CONFLICT (session_id, follower) DO UPDATE SET expires = excluded.expires",
                (seconds, list(session_ids), follower, seconds),
            )

    def close(self) -> None:
        """Nothing to close per store: the connections belong to the process's pool, closed at exit."""

    @contextmanager
    def _errors(self) -> Iterator[None]:
        if not self._outage.usable():
            raise StoreUnavailable(f"the session store {self.where} cannot be reached; what is stored is kept: try again once it is back")
        try:
            yield
        except psycopg_pool.PoolTimeout:
            self._outage.found_down()
            raise StoreUnavailable(
                f"the session store {self.where} did not answer within {CONNECT_TIMEOUT_SECONDS:.0f} s (is PostgreSQL running and "
                "reachable? are all store.pool_size connections busy?); what is stored is kept: try again once it is back"
            ) from None
        except psycopg.OperationalError as exc:
            said = _said(exc)
            self._outage.found_down()
            raise StoreUnavailable(f"the session store {self.where} cannot be reached ({said}); what is stored is kept: try again once it is back") from None
        except psycopg.Error as exc:
            raise StoreError(f"the session store {self.where} refused a request ({_said(exc)})") from None


def _end_read(conn: psycopg.Connection[Any]) -> None:
    """End a read's transaction (read only: nothing to keep or undo either way); a connection that cannot be is closed (the pool drops it)."""
    if conn.closed:
        return
    try:
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.execute("ROLLBACK")
    except psycopg.Error:
        conn.close()


class PostgresNotices:
    """Notices between the processes on one database: LISTEN on a connection of its own (a daemon thread), NOTIFY by one statement.

    The store's notices of new events come only for the sessions this process follows (`follow`):
    each followed session is a row in the store, renewed by the LISTEN thread each third of
    FOLLOW_SECONDS, deleted once nothing here follows it.
    """

    def __init__(self, url: str, *, store: PostgresStore) -> None:
        self._url = url
        self._store = store
        self.follower = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._followed: dict[str, int] = {}  # session id -> how many here follow it
        self._following = threading.Lock()  # one change of the rows at a time, each with its count
        self._listener: _Listener | None = None

    def follow(self, session_id: str) -> None:
        """This process follows the session's events from now on (StoreError when the store is down): its writes notice us."""
        with self._following:
            if not self._followed.get(session_id):
                self._store.follow(session_id, self.follower, seconds=FOLLOW_SECONDS)
            self._followed[session_id] = self._followed.get(session_id, 0) + 1

    def unfollow(self, session_id: str) -> None:
        """One follower of the session here fewer; the last one's row goes (left to run out when the store is down)."""
        with self._following:
            left = self._followed.get(session_id, 0) - 1
            if left > 0:
                self._followed[session_id] = left
                return
            self._followed.pop(session_id, None)
            try:
                self._store.unfollow(session_id, self.follower)
            except StoreError as exc:
                _log.warning("session %s: could not stop following its events (%s); it runs out by itself", session_id, exc)

    def renew(self) -> None:
        """Renew what this process follows (rows lost meanwhile made again)."""
        with self._following:
            followed = list(self._followed)
        if followed:
            with contextlib.suppress(StoreError):  # the store is down: renewed at the next turn, or made again then
                self._store.renew_following(self.follower, followed, seconds=FOLLOW_SECONDS)

    @property
    def connected(self) -> bool:
        """Whether the LISTEN connection is up now."""
        return self._listener is not None and self._listener.connected

    def listen(self, handlers: Mapping[str, Callable[[str], object]]) -> None:
        """LISTEN on each channel from now on; each notice's payload goes to its channel's handler."""
        tips = _tips_version(self._url)
        self._listener = _Listener(self._url, {**handlers, TIPS_CHANNEL: tips.changed}, every=(FOLLOW_SECONDS / 3, self.renew), on_connected=tips.hearing)
        self._listener.start()

    def send(self, channel: str, payload: str) -> None:
        """NOTIFY `channel` (nothing sent while the database is down: a notice is a hint)."""
        with contextlib.suppress(psycopg.Error), psycopg.connect(self._url, autocommit=True, connect_timeout=int(CONNECT_TIMEOUT_SECONDS)) as db:
            db.execute("SELECT pg_notify(%s, %s)", (channel, payload))

    def close(self) -> None:
        """Stop listening."""
        if self._listener is not None:
            self._listener.stop()


class _Listener(threading.Thread):
    """The LISTEN connection's thread: hands each notice's payload to its channel's handler; reconnects after a drop."""

    def __init__(
        self,
        url: str,
        handlers: dict[str, Callable[[str], object]],
        *,
        every: tuple[float, Callable[[], object]],
        on_connected: Callable[[bool], object],
    ) -> None:
        """`every`: (seconds, what): called that often from this thread (the followed sessions' renewal); `on_connected` hears the connection come and go."""
        super().__init__(name="store-listen", daemon=True)
        self._url = url
        self._handlers = handlers
        self._every = every
        self._on_connected = on_connected
        self._stopping = threading.Event()
        self.connected = False

    def run(self) -> None:
        seconds, task = self._every
        due = time.monotonic() + seconds
        while not self._stopping.is_set():
            try:
                with psycopg.connect(self._url, autocommit=True, connect_timeout=int(CONNECT_TIMEOUT_SECONDS)) as db:
                    for channel in self._handlers:
                        db.execute(f"LISTEN {channel}")
                    self.connected = True
                    self._on_connected(True)
                    while not self._stopping.is_set():
                        for notice in db.notifies(timeout=1.0):
                            self._handlers[notice.channel](notice.payload)
                        if time.monotonic() >= due:
                            task()
                            due = time.monotonic() + seconds
            except psycopg.Error:
                _outage(self._url).found_down()  # the store is down or restarting: requests are answered at once until a probe finds it back
            finally:
                self._on_connected(False)
            self.connected = False
            self._stopping.wait(LISTEN_RETRY_SECONDS)

    def stop(self) -> None:
        self._stopping.set()


class AdvisoryClaim:
    """A session-level advisory lock on a connection of its own: held until `release()` or until the process dies."""

    def __init__(self, url: str, session_id: str, *, where: str) -> None:
        self.session_id = session_id
        self._conn: psycopg.Connection[Any] | None = psycopg.connect(url, autocommit=True, connect_timeout=int(CONNECT_TIMEOUT_SECONDS))
        row = self._conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (f"taskweaver-lite session {session_id}",)).fetchone()
        if row is None or not row[0]:
            self.release()
            raise SessionBusyError(
                f"session {session_id} is open in another taskweaver-lite process using {where}; close it there first, or resume a different session"
            )

    def release(self) -> None:
        """Let other processes open the session (closing the connection drops the lock)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> AdvisoryClaim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _said(exc: BaseException) -> str:
    """A driver's error as one line, with any password taken out."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return redact_text(lines[0] if lines else type(exc).__name__)
