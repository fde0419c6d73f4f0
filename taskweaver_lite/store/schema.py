"""The session store's schema: its versions and the steps that upgrade an older file to the newest.

The version lives in SQLite's `PRAGMA user_version` (0 = a new, empty file). Each step runs in one
transaction together with the version bump, so a crash mid-upgrade leaves the old version intact.
A file from a newer taskweaver-lite is refused, never misread.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from taskweaver_lite.errors import StoreError

Migration = tuple[str, ...]

# MIGRATIONS[n] upgrades a store from schema version n to n + 1; the version lives in PRAGMA user_version.
MIGRATIONS: list[Migration] = [
    (
        """CREATE TABLE sessions (
            id TEXT PRIMARY KEY, started REAL NOT NULL, last_active REAL NOT NULL,
            title TEXT NOT NULL DEFAULT '', variables TEXT NOT NULL DEFAULT '[]')""",
        """CREATE TABLE rounds (
            seq INTEGER PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id), round_id TEXT NOT NULL,
            idx INTEGER NOT NULL, user_query TEXT NOT NULL, state TEXT NOT NULL, error TEXT,
            started_at REAL NOT NULL, ended_at REAL, UNIQUE (session_id, round_id))""",
        """CREATE TABLE posts (
            seq INTEGER PRIMARY KEY, session_id TEXT NOT NULL, round_id TEXT NOT NULL, post_id TEXT NOT NULL,
            send_from TEXT NOT NULL, send_to TEXT NOT NULL, success INTEGER, created_at REAL NOT NULL,
            data TEXT NOT NULL, UNIQUE (session_id, post_id),
            FOREIGN KEY (session_id, round_id) REFERENCES rounds(session_id, round_id))""",
        "CREATE INDEX posts_by_round ON posts(session_id, round_id, seq)",
        """CREATE TABLE model_calls (
            seq INTEGER PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id), purpose TEXT NOT NULL,
            prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, latency REAL NOT NULL,
            ok INTEGER NOT NULL, error TEXT, prompt TEXT, reply TEXT, at REAL NOT NULL)""",
        "CREATE INDEX model_calls_by_session ON model_calls(session_id, seq)",
        """CREATE TABLE folds (
            seq INTEGER PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id), role TEXT NOT NULL,
            first_round INTEGER NOT NULL, last_round INTEGER NOT NULL, tokens_before INTEGER NOT NULL,
            tokens_after INTEGER NOT NULL, ok INTEGER NOT NULL, error TEXT, at REAL NOT NULL)""",
        """CREATE TABLE compression (
            session_id TEXT NOT NULL REFERENCES sessions(id), role TEXT NOT NULL, state TEXT NOT NULL,
            saved_at REAL NOT NULL, PRIMARY KEY (session_id, role))""",
    ),
    (
        # Version 2: files loaded with /load (for /history and the exports), and the --set values a
        # session started with (re-applied on resume).
        """CREATE TABLE files (
            seq INTEGER PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id), name TEXT NOT NULL,
            source TEXT NOT NULL, after_round INTEGER NOT NULL, at REAL NOT NULL)""",
        "ALTER TABLE sessions ADD COLUMN overrides TEXT NOT NULL DEFAULT '[]'",
    ),
    (
        # Version 3: the prompt tokens each call's server took from its prefix cache.
        "ALTER TABLE model_calls ADD COLUMN cached_tokens INTEGER NOT NULL DEFAULT 0",
    ),
    (
        # Version 4: experience tips distilled from sessions (/save); searched in memory with FTS5, so a
        # store opened by an SQLite without FTS5 still works (only the search is off).
        """CREATE TABLE tips (
            id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, text TEXT NOT NULL,
            session_id TEXT NOT NULL, created_at REAL NOT NULL)""",
    ),
    (
        # Version 5: the team service's tables. Sessions get an owner (NULL: made without users); users
        # with their token's id and scrypt hash; the event log a server streams from; artifacts and
        # uploads as bytes (PostgreSQL keeps them; an SQLite store leaves them in the session folder);
        # request leases; eval results. The same tables as the PostgreSQL schema (postgres_schema.py).
        "ALTER TABLE sessions ADD COLUMN owner TEXT",
        "ALTER TABLE sessions ADD COLUMN kernel_id TEXT",
        "CREATE INDEX sessions_by_owner ON sessions(owner, last_active)",
        """CREATE TABLE users (
            name TEXT PRIMARY KEY, admin INTEGER NOT NULL, token_id TEXT NOT NULL UNIQUE, salt TEXT NOT NULL,
            token_hash TEXT NOT NULL, created_at REAL NOT NULL)""",
        """CREATE TABLE events (
            id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL REFERENCES sessions(id), data TEXT NOT NULL, at REAL NOT NULL)""",
        "CREATE INDEX events_by_session ON events(session_id, id)",
        """CREATE TABLE blobs (
            session_id TEXT NOT NULL REFERENCES sessions(id), kind TEXT NOT NULL, name TEXT NOT NULL, data BLOB NOT NULL,
            size INTEGER NOT NULL, at REAL NOT NULL, PRIMARY KEY (session_id, kind, name))""",
        "CREATE TABLE leases (session_id TEXT PRIMARY KEY, holder TEXT NOT NULL, expires REAL NOT NULL)",
        """CREATE TABLE eval_results (
            run_id TEXT NOT NULL, case_name TEXT NOT NULL, result TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (run_id, case_name))""",
    ),
    (
        # Version 6: tokens that expire. When a user's token stops working (NULL: never), and the days
        # it was given for, which `users rotate` gives the next one. The same as PostgreSQL's version 2.
        "ALTER TABLE users ADD COLUMN expires_at REAL",
        "ALTER TABLE users ADD COLUMN token_days REAL",
    ),
    (
        # Version 7: sessions belong to a user's id, not their name: a user removed and added again under
        # the same name is someone new, who does not inherit the old one's sessions or tips. Each user gets
        # an id; a session's `owner` becomes its user's id (`removed:NAME` where that user is gone, which no
        # id matches). `marks` remembers that the store has had users, so removing the last one leaves every
        # request refused rather than every session open. The same as PostgreSQL's version 3.
        "ALTER TABLE users ADD COLUMN id TEXT",
        "UPDATE users SET id = lower(hex(randomblob(8)))",
        "CREATE UNIQUE INDEX users_by_id ON users(id)",
        "UPDATE sessions SET owner = COALESCE((SELECT u.id FROM users u WHERE u.name = sessions.owner), 'removed:' || owner) WHERE owner IS NOT NULL",
        "CREATE TABLE marks (name TEXT PRIMARY KEY, at REAL NOT NULL)",
        "INSERT INTO marks (name, at) SELECT 'had_users', created_at FROM users ORDER BY created_at LIMIT 1",
    ),
    (
        # Version 8: the page's sign-ins, each a row the cookie names (signed with the server's key, which is
        # not in the store), ended by a sign-out on any replica; and the audit trail, append-only (triggers
        # refuse every UPDATE and DELETE). The same as PostgreSQL's version 4.
        """CREATE TABLE sign_ins (
            id TEXT PRIMARY KEY, user_id TEXT, token_id TEXT NOT NULL, created_at REAL NOT NULL, until REAL NOT NULL, ended_at REAL,
            via TEXT NOT NULL DEFAULT 'token')""",
        "CREATE INDEX sign_ins_by_until ON sign_ins(until)",
        "ALTER TABLE marks ADD COLUMN value TEXT",
        """CREATE TABLE audit (
            id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, actor TEXT NOT NULL, action TEXT NOT NULL,
            target TEXT NOT NULL DEFAULT '', source TEXT NOT NULL DEFAULT '', detail TEXT NOT NULL DEFAULT '')""",
        "CREATE INDEX audit_by_time ON audit(at)",
        "CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END",
        "CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END",
    ),
    (
        # Version 9: the model each call asked for, for usage per user and model (calls made before read '').
        # The same as PostgreSQL's version 5.
        "ALTER TABLE model_calls ADD COLUMN model TEXT NOT NULL DEFAULT ''",
    ),
    (
        # Version 10: a freed lease keeps its row, with the session's newest event id as it was freed, so the next
        # request reads it as it takes the lease (-1: not freed so). The same as PostgreSQL's version 6.
        "ALTER TABLE leases ADD COLUMN version INTEGER NOT NULL DEFAULT -1",
    ),
]
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(db: sqlite3.Connection, steps: list[Migration], *, path: Path) -> int:
    """Bring the open database up to `len(steps)`, one transaction per step; returns the new version."""
    target = len(steps)
    while True:
        version = _schema_version(db, target, path=path)
        if version == target:
            return version  # the usual case: no write lock needed just to open
        db.execute("BEGIN IMMEDIATE")
        try:
            # Another process may have migrated while we waited for the write lock.
            if _schema_version(db, target, path=path) == version:
                for statement in steps[version]:
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {version + 1}")
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise


def read_version(db: sqlite3.Connection, *, path: Path) -> int:
    """The store's schema version without migrating (for read-only use); StoreError if it is not ours or too new."""
    return _schema_version(db, SCHEMA_VERSION, path=path)


def _schema_version(db: sqlite3.Connection, target: int, *, path: Path) -> int:
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version > target:
        raise StoreError(
            f"{path} was written by a newer taskweaver-lite (store schema version {version}; this one reads "
            f"up to {target}); upgrade taskweaver-lite to open it (in a checkout: git pull, then pip install .)"
        )
    if version == 0 and db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0]:
        raise StoreError(f"{path} is an SQLite file but not a taskweaver-lite session store; move it aside or set store.path")
    return version
