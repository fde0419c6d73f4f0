"""The PostgreSQL store's schema: its versions and the steps that upgrade an older database to the newest.

The version lives in a one-row table, `taskweaver_lite_schema`. Each step runs in one transaction
with the version bump (PostgreSQL's DDL is transactional) under an advisory lock, so replicas
starting at once migrate once; a crash mid-step leaves the old version intact. A database from a
newer taskweaver-lite is refused, never misread.

The tables are those of the SQLite store (`schema.py`, version 5 onwards, each later step with its
twin here) in PostgreSQL's types: identity columns for SQLite's rowids, BYTEA for blobs, DOUBLE
PRECISION for times, and booleans kept as 0/1 integers so that both backends share their queries.
Tips carry a `tsvector` column (generated, with a GIN index) that PostgreSQL's full-text search ranked
until version 8; tips are now ranked in memory, as on SQLite, and the column stays for the replicas of
an earlier version during a rolling upgrade.
"""

from __future__ import annotations

from typing import Any

import psycopg

from taskweaver_lite.errors import StoreError

Migration = tuple[str, ...]
MIGRATION_LOCK = 0x7477_6C5F_7363_6865  # an advisory-lock key of our own ("twl_sche")

MIGRATIONS: list[Migration] = [
    (
        """CREATE TABLE sessions (
            id TEXT PRIMARY KEY, started DOUBLE PRECISION NOT NULL, last_active DOUBLE PRECISION NOT NULL,
            title TEXT NOT NULL DEFAULT '', variables TEXT NOT NULL DEFAULT '[]', overrides TEXT NOT NULL DEFAULT '[]', owner TEXT,
            kernel_id TEXT)""",
        "CREATE INDEX sessions_by_owner ON sessions(owner, last_active)",
        """CREATE TABLE rounds (
            seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id), round_id TEXT NOT NULL,
            idx INTEGER NOT NULL, user_query TEXT NOT NULL, state TEXT NOT NULL, error TEXT,
            started_at DOUBLE PRECISION NOT NULL, ended_at DOUBLE PRECISION, UNIQUE (session_id, round_id))""",
        """CREATE TABLE posts (
            seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, session_id TEXT NOT NULL, round_id TEXT NOT NULL, post_id TEXT NOT NULL,
            send_from TEXT NOT NULL, send_to TEXT NOT NULL, success INTEGER, created_at DOUBLE PRECISION NOT NULL,
            data TEXT NOT NULL, UNIQUE (session_id, post_id),
            FOREIGN KEY (session_id, round_id) REFERENCES rounds(session_id, round_id))""",
        "CREATE INDEX posts_by_round ON posts(session_id, round_id, seq)",
        """CREATE TABLE model_calls (
            seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id), purpose TEXT NOT NULL,
            prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, cached_tokens INTEGER NOT NULL DEFAULT 0,
            latency DOUBLE PRECISION NOT NULL, ok INTEGER NOT NULL, error TEXT, prompt TEXT, reply TEXT, at DOUBLE PRECISION NOT NULL)""",
        "CREATE INDEX model_calls_by_session ON model_calls(session_id, seq)",
        """CREATE TABLE folds (
            seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id), role TEXT NOT NULL,
            first_round INTEGER NOT NULL, last_round INTEGER NOT NULL, tokens_before INTEGER NOT NULL,
            tokens_after INTEGER NOT NULL, ok INTEGER NOT NULL, error TEXT, at DOUBLE PRECISION NOT NULL)""",
        """CREATE TABLE compression (
            session_id TEXT NOT NULL REFERENCES sessions(id), role TEXT NOT NULL, state TEXT NOT NULL,
            saved_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (session_id, role))""",
        """CREATE TABLE files (
            seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id), name TEXT NOT NULL,
            source TEXT NOT NULL, after_round INTEGER NOT NULL, at DOUBLE PRECISION NOT NULL)""",
        """CREATE TABLE tips (
            id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, kind TEXT NOT NULL, text TEXT NOT NULL,
            session_id TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
            search TSVECTOR GENERATED ALWAYS AS (to_tsvector('english', text)) STORED)""",
        "CREATE INDEX tips_search ON tips USING GIN (search)",
        """CREATE TABLE users (
            name TEXT PRIMARY KEY, admin INTEGER NOT NULL, token_id TEXT NOT NULL UNIQUE, salt TEXT NOT NULL,
            token_hash TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL)""",
        """CREATE TABLE events (
            id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id), data TEXT NOT NULL,
            at DOUBLE PRECISION NOT NULL)""",
        "CREATE INDEX events_by_session ON events(session_id, id)",
        """CREATE TABLE blobs (
            session_id TEXT NOT NULL REFERENCES sessions(id), kind TEXT NOT NULL, name TEXT NOT NULL, data BYTEA NOT NULL,
            size BIGINT NOT NULL, at DOUBLE PRECISION NOT NULL, PRIMARY KEY (session_id, kind, name))""",
        "CREATE TABLE leases (session_id TEXT PRIMARY KEY, holder TEXT NOT NULL, expires DOUBLE PRECISION NOT NULL)",
        """CREATE TABLE eval_results (
            run_id TEXT NOT NULL, case_name TEXT NOT NULL, result TEXT NOT NULL, at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (run_id, case_name))""",
    ),
    (
        # Version 2: tokens that expire (as SQLite's version 6): when a user's token stops working
        # (NULL: never), and the days it was given for, which `users rotate` gives the next one.
        "ALTER TABLE users ADD COLUMN expires_at DOUBLE PRECISION",
        "ALTER TABLE users ADD COLUMN token_days DOUBLE PRECISION",
    ),
    (
        # Version 3 (as SQLite's version 7): sessions belong to a user's id, not a reusable name; `marks`
        # remembers that the store has had users (removing the last one then refuses every request).
        "ALTER TABLE users ADD COLUMN id TEXT",
        "UPDATE users SET id = substr(md5(random()::text || clock_timestamp()::text || name), 1, 16)",
        "CREATE UNIQUE INDEX users_by_id ON users(id)",
        "UPDATE sessions SET owner = COALESCE((SELECT u.id FROM users u WHERE u.name = sessions.owner), 'removed:' || owner) WHERE owner IS NOT NULL",
        "CREATE TABLE marks (name TEXT PRIMARY KEY, at DOUBLE PRECISION NOT NULL)",
        "INSERT INTO marks (name, at) SELECT 'had_users', created_at FROM users ORDER BY created_at LIMIT 1",
    ),
    (
        # Version 4 (as SQLite's version 8): the page's sign-ins, which a sign-out on any replica ends; the audit
        # trail, append-only: a trigger refuses UPDATE, DELETE and TRUNCATE (pg_dump keeps it with the rest).
        """CREATE TABLE sign_ins (
            id TEXT PRIMARY KEY, user_id TEXT, token_id TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
            until DOUBLE PRECISION NOT NULL, ended_at DOUBLE PRECISION, via TEXT NOT NULL DEFAULT 'token')""",
        "CREATE INDEX sign_ins_by_until ON sign_ins(until)",
        "ALTER TABLE marks ADD COLUMN value TEXT",
        """CREATE TABLE audit (
            id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, at DOUBLE PRECISION NOT NULL, actor TEXT NOT NULL, action TEXT NOT NULL,
            target TEXT NOT NULL DEFAULT '', source TEXT NOT NULL DEFAULT '', detail TEXT NOT NULL DEFAULT '')""",
        "CREATE INDEX audit_by_time ON audit(at)",
        """CREATE FUNCTION taskweaver_lite_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'the audit trail is append-only'; END $$""",
        """CREATE TRIGGER audit_no_change BEFORE UPDATE OR DELETE ON audit
            FOR EACH ROW EXECUTE FUNCTION taskweaver_lite_audit_append_only()""",
        """CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit
            FOR EACH STATEMENT EXECUTE FUNCTION taskweaver_lite_audit_append_only()""",
    ),
    (
        # Version 5 (as SQLite's version 9): the model each call asked for, for usage per user and model.
        "ALTER TABLE model_calls ADD COLUMN model TEXT NOT NULL DEFAULT ''",
    ),
    (
        # Version 6 (as SQLite's version 10): a freed lease keeps its row, with the session's newest event id as it
        # was freed, so the next request reads it as it takes the lease (-1: not freed so).
        "ALTER TABLE leases ADD COLUMN version BIGINT NOT NULL DEFAULT -1",
    ),
    (
        # Version 7 (PostgreSQL's alone: the SQLite file has no notices): the replicas following each session's events
        # (an event stream open there), for as long as they renew their row. A write of events notices them only when
        # some replica follows the session (`twl_events` is store/interface.py's EVENTS_CHANNEL). The check reads the
        # followers in a snapshot of its own, under a lock on the session's events that a new follower takes
        # exclusively (`PostgresStore.follow`): a write checks after it registered, or it registers after the
        # write committed, and then reads what it wrote.
        """CREATE TABLE followers (
            session_id TEXT NOT NULL, follower TEXT NOT NULL, expires DOUBLE PRECISION NOT NULL, PRIMARY KEY (session_id, follower))""",
        """CREATE FUNCTION taskweaver_lite_events_logged(sid TEXT) RETURNS BOOLEAN LANGUAGE plpgsql VOLATILE AS $$
            BEGIN
                PERFORM pg_advisory_xact_lock_shared(hashtextextended('taskweaver-lite events of ' || sid, 0));
                IF EXISTS (SELECT 1 FROM followers WHERE session_id = sid AND expires >= extract(epoch from clock_timestamp())) THEN
                    PERFORM pg_notify('twl_events', sid);
                    RETURN TRUE;
                END IF;
                RETURN FALSE;
            END $$""",
    ),
    (
        # Version 8 (PostgreSQL's alone): every change of the stored tips, by any statement, notices `twl_tips` on commit:
        # a replica keeps the tips' version in memory while it hears them, instead of asking for it at each search.
        """CREATE FUNCTION taskweaver_lite_tips_changed() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM pg_notify('twl_tips', ''); RETURN NULL; END $$""",
        """CREATE TRIGGER tips_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON tips
            FOR EACH STATEMENT EXECUTE FUNCTION taskweaver_lite_tips_changed()""",
    ),
]
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: psycopg.Connection[Any], steps: list[Migration], *, where: str) -> int:
    """Bring the database up to `len(steps)`, one transaction per step; returns the new version."""
    target = len(steps)
    with conn.transaction():  # the usual case, with no lock and no DDL: a role without CREATE rights can open an up-to-date store
        if conn.execute("SELECT to_regclass('taskweaver_lite_schema')").fetchone() not in (None, (None,)) and read_version(conn, where=where) == target:
            return target
    while True:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute("CREATE TABLE IF NOT EXISTS taskweaver_lite_schema (version INTEGER NOT NULL)")
            version = read_version(conn, where=where)
            if version == target:
                return version
            for statement in steps[version]:
                conn.execute(statement)  # our own constant DDL, not user text
            conn.execute("DELETE FROM taskweaver_lite_schema")
            conn.execute("INSERT INTO taskweaver_lite_schema (version) VALUES (%s)", (version + 1,))


def read_version(conn: psycopg.Connection[Any], *, where: str) -> int:
    """The database's schema version (0: none yet); StoreError when it is from a newer taskweaver-lite."""
    row = conn.execute("SELECT version FROM taskweaver_lite_schema").fetchone()
    version = int(row[0]) if row is not None else 0
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{where} was written by a newer taskweaver-lite (store schema version {version}; this one reads "
            f"up to {SCHEMA_VERSION}); upgrade taskweaver-lite on every server that uses it (in a checkout: git pull, then pip install '.[team]')"
        )
    return version
