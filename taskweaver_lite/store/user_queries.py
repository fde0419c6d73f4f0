"""The store's queries about people, written once for both backends: users, the page's sign-ins, and the audit trail.

`SqlStore` (sql.py) takes these in as a base class; they run on its connections. Each change to a
user may name who made it (`by`): its audit entry is then written in the same transaction, so a
change is never without its line, nor a line without its change. The audit table refuses UPDATE and
DELETE (triggers in both schemas): the program appends to it and never edits it.

A sign-in is a row (`sign_ins`) that the page's cookie names; the cookie's signature is made with the
server's key (web/sign_in.py), which is not in the store. A sign-out ends the row, so the cookie is
refused on every replica at once; `users rotate` and `users remove` end every sign-in of that user.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from typing import Any

from taskweaver_lite.errors import StoreError
from taskweaver_lite.store.event_rows import Connection
from taskweaver_lite.store.interface import Actor, AuditEntry, SignIn, User, UserUsage
from taskweaver_lite.store.users import Verifier, check_name, make_token, make_user_id, token_id

SIGN_IN_KEEP_SECONDS = 7 * 86400.0  # sign-ins past their end are deleted this long after it (the audit keeps that they happened)


class UserQueries:
    """Users, sign-ins and the audit trail, on the connections of the store that inherits this."""

    where: str = ""
    cell_seconds_sql = ""
    _verifier: Verifier

    def _transaction(self) -> AbstractContextManager[Connection]:
        raise NotImplementedError(f"{type(self).__name__} is a store backend without _transaction")

    def _read_one(self) -> AbstractContextManager[Connection]:
        raise NotImplementedError(f"{type(self).__name__} is a store backend without _read_one")

    def _write_one(self) -> AbstractContextManager[Connection]:
        raise NotImplementedError(f"{type(self).__name__} is a store backend without _write_one")

    def _read(self) -> AbstractContextManager[Connection]:
        raise NotImplementedError(f"{type(self).__name__} is a store backend without _read")

    # Users

    def add_user(self, name: str, *, admin: bool = False, expires_days: float | None = None, by: Actor | None = None, detail: str = "") -> str:
        """Add a user; returns their token (shown once: only its hash is kept), which stops working after `expires_days`
        (None: never). StoreError if the name is taken."""
        try:
            check_name(name)
        except ValueError as exc:
            raise StoreError(str(exc)) from None
        made = make_token()
        now = time.time()
        with self._transaction() as db:
            if db.execute("SELECT 1 FROM users WHERE name = ?", (name,)).fetchone():
                raise StoreError(f"there is already a user '{name}' in {self.where}; remove it first (taskweaver-lite users remove {name})")
            db.execute(
                "INSERT INTO users (id, name, admin, token_id, salt, token_hash, created_at, expires_at, token_days) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (make_user_id(), name, int(admin), made.token_id, made.salt, made.digest, now, _expiry(now, expires_days), expires_days),
            )
            db.execute("INSERT INTO marks (name, at) VALUES ('had_users', ?) ON CONFLICT (name) DO NOTHING", (now,))
            kind = "admin" if admin else "user"
            _audited(db, by, "user-added", name, detail or (kind if expires_days is None else f"{kind}, token for {expires_days:g} days"))
        return made.token

    def rotate_token(self, name: str, *, expires_days: float | None = None, by: Actor | None = None) -> str | None:
        """A new token for the user (the old one and every sign-in made with it stop working at once); None when there is no such user.

        It expires after `expires_days`, or when None, after as many days as the old one was given (never, if that never did).
        """
        made = make_token()
        now = time.time()
        with self._transaction() as db:
            row = db.execute("SELECT token_days FROM users WHERE name = ?", (name,)).fetchone()
            if row is None:
                return None
            days = expires_days if expires_days is not None else (None if row[0] is None else float(row[0]))
            db.execute(
                "UPDATE users SET token_id = ?, salt = ?, token_hash = ?, expires_at = ?, token_days = ? WHERE name = ?",
                (made.token_id, made.salt, made.digest, _expiry(now, days), days, name),
            )
            _audited(db, by, "user-rotated", name, "" if days is None else f"token for {days:g} days")
        return made.token

    def set_admin(self, name: str, *, admin: bool, by: Actor | None = None) -> bool:
        """Make the user an admin, or no longer one (`users promote`, `users demote`); False when there is no such user."""
        with self._transaction() as db:
            changed = db.execute("UPDATE users SET admin = ? WHERE name = ?", (int(admin), name)).rowcount > 0
            if changed:
                _audited(db, by, "user-promoted" if admin else "user-demoted", name)
            return changed

    def set_expiry(self, name: str, *, expires_days: float | None, by: Actor | None = None) -> bool:
        """The user's token now expires `expires_days` from now (None: never, an expiry cleared); False when there is no such user."""
        now = time.time()
        with self._transaction() as db:
            changed = (
                db.execute("UPDATE users SET expires_at = ?, token_days = ? WHERE name = ?", (_expiry(now, expires_days), expires_days, name)).rowcount > 0
            )
            if changed:
                _audited(db, by, "user-expired", name, "never" if expires_days is None else f"in {expires_days:g} days")
            return changed

    def users(self) -> list[User]:
        """Every user, by name."""
        with self._read_one() as db:
            rows = db.execute("SELECT name, admin, created_at, expires_at, id FROM users ORDER BY name").fetchall()
        return [_user(r) for r in rows]

    def user_by_name(self, name: str) -> User | None:
        """The user of that name; None when there is none."""
        with self._read_one() as db:
            row = db.execute("SELECT name, admin, created_at, expires_at, id FROM users WHERE name = ?", (name,)).fetchone()
        return None if row is None else _user(row)

    def remove_user(self, name: str, *, by: Actor | None = None) -> bool:
        """Remove a user (their token and sign-ins stop working at once; their sessions stay, nobody's but an admin's); False when there is none."""
        with self._transaction() as db:
            removed = db.execute("DELETE FROM users WHERE name = ?", (name,)).rowcount > 0
            if removed:
                _audited(db, by, "user-removed", name)
            return removed

    def has_users(self) -> bool:
        """Whether the store has any user (then every request must name one by its token)."""
        with self._read_one() as db:
            return db.execute("SELECT 1 FROM users LIMIT 1").fetchone() is not None

    def had_users(self) -> bool:
        """Whether the store has ever had a user (then a server on it keeps asking for one, even once the last is removed)."""
        with self._read_one() as db:
            return db.execute("SELECT 1 FROM marks WHERE name = 'had_users'").fetchone() is not None

    def user_for_token(self, token: str) -> User | None:
        """The user whose token this is, an expired one too (`User.expired` says so); None for a wrong, malformed or removed one.

        A refusal costs what a check does whatever the token (its id unknown, malformed, or its secret wrong):
        how long it takes tells nothing of which token ids exist.
        """
        found = self._token_row(token)
        return None if found is None else _user(found)

    def _token_row(self, token: str) -> Any:
        """The user's row (name, admin, created_at, expires_at, id, salt, token_hash) whose token this is; None for any other."""
        ident = token_id(token)
        row = None
        if ident is not None:
            with self._read_one() as db:
                row = db.execute("SELECT name, admin, created_at, expires_at, id, salt, token_hash FROM users WHERE token_id = ?", (ident,)).fetchone()
        if row is None:
            self._verifier.refuse(token)  # the same work as a wrong secret
            return None
        if not self._verifier.matches(token, salt=row[5], digest=row[6]):
            return None
        return row

    def was_removed(self, name: str) -> bool:
        """Whether a user of that name was removed (with `by`: `users remove`, the admin page) and not added again since.

        Single sign-on reads this from the audit trail, which nothing edits: a removed user is not added back by signing in.
        """
        with self._read_one() as db:
            row = db.execute(
                "SELECT action FROM audit WHERE target = ? AND action IN ('user-added', 'user-removed') ORDER BY id DESC LIMIT 1", (name,)
            ).fetchone()
        return row is not None and row[0] == "user-removed"

    def token_id_of(self, name: str) -> str | None:
        """The public id of the user's current token (what a sign-in is made from); None when there is no such user."""
        with self._read_one() as db:
            row = db.execute("SELECT token_id FROM users WHERE name = ?", (name,)).fetchone()
        return None if row is None else str(row[0])

    # Sign-ins

    def add_sign_in(self, sign_in_id: str, *, user_id: str | None, token_id: str, until: float, via: str = "token") -> None:
        """Keep a new sign-in (its cookie is signed by the server); those ended or run out a week ago go."""
        now = time.time()
        with self._transaction() as db:
            db.execute("DELETE FROM sign_ins WHERE until < ?", (now - SIGN_IN_KEEP_SECONDS,))
            db.execute(
                "INSERT INTO sign_ins (id, user_id, token_id, created_at, until, via) VALUES (?, ?, ?, ?, ?, ?)",
                (sign_in_id, user_id, token_id, now, until, via),
            )

    def sign_in(self, sign_in_id: str) -> SignIn | None:
        """The sign-in of that id, with its user as they are now; None when there is none (`SignIn.holds` says whether it still works)."""
        with self._read_one() as db:
            row = db.execute(
                "SELECT s.id, s.user_id, s.token_id, s.created_at, s.until, s.ended_at, s.via,"
                " u.name, u.admin, u.created_at, u.expires_at, u.id, u.token_id"
                " FROM sign_ins s LEFT JOIN users u ON u.id = s.user_id WHERE s.id = ?",
                (sign_in_id,),
            ).fetchone()
        if row is None:
            return None
        user = None if row[7] is None else _user(row[7:12])
        return SignIn(
            id=str(row[0]),
            user_id=None if row[1] is None else str(row[1]),
            token_id=str(row[2]),
            created_at=float(row[3]),
            until=float(row[4]),
            ended_at=None if row[5] is None else float(row[5]),
            via=str(row[6]),
            user=user,
            current_token_id=None if row[12] is None else str(row[12]),
        )

    def end_sign_in(self, sign_in_id: str) -> bool:
        """End a sign-in (a sign-out): its cookie is refused from now on, by every server on this store; False when it had ended."""
        with self._write_one() as db:
            return db.execute("UPDATE sign_ins SET ended_at = ? WHERE id = ? AND ended_at IS NULL", (time.time(), sign_in_id)).rowcount > 0

    def sign_in_key_check(self, check: str) -> str | None:
        """Record `check` (a digest of this server's sign-in key) as the one servers on this store sign with; returns the one it replaced, if different."""
        with self._transaction() as db:
            row = db.execute("SELECT value FROM marks WHERE name = 'sign_in_key'").fetchone()
            before = None if row is None else str(row[0])
            if before != check:
                db.execute(
                    "INSERT INTO marks (name, at, value) VALUES ('sign_in_key', ?, ?)"
                    " ON CONFLICT (name) DO UPDATE SET value = excluded.value, at = excluded.at",
                    (time.time(), check),
                )
        return before if before not in (None, check) else None

    def session_kernels(self) -> dict[str, str]:
        """Which session each kernel on a gateway runs: kernel id -> session id."""
        with self._read_one() as db:
            rows = db.execute("SELECT kernel_id, id FROM sessions WHERE kernel_id IS NOT NULL").fetchall()
        return {str(kernel): str(session) for kernel, session in rows}

    # Usage per user

    def usage_by_user(self) -> list[UserUsage]:
        """What each user's sessions used: model tokens by model, cells run and their seconds (`-`: sessions made without users)."""
        usage: dict[str, UserUsage] = {}
        owner = "COALESCE(u.name, CASE WHEN s.owner IS NULL THEN '-' ELSE s.owner END)"
        with self._read() as db:
            calls = db.execute(
                f"SELECT {owner}, m.model, COUNT(*), COALESCE(SUM(m.prompt_tokens), 0), COALESCE(SUM(m.completion_tokens), 0),"
                " COALESCE(SUM(m.cached_tokens), 0) FROM model_calls m JOIN sessions s ON s.id = m.session_id"
                f" LEFT JOIN users u ON u.id = s.owner GROUP BY {owner}, m.model"
            ).fetchall()
            cells = db.execute(
                f"SELECT {owner}, COUNT(DISTINCT s.id), COUNT(p.success), COALESCE(SUM(CASE WHEN p.success IS NULL THEN 0 ELSE {self.cell_seconds_sql} END), 0)"
                " FROM sessions s LEFT JOIN posts p ON p.session_id = s.id"
                f" LEFT JOIN users u ON u.id = s.owner GROUP BY {owner}"
            ).fetchall()
        for name, sessions, count, seconds in cells:
            usage[str(name)] = UserUsage(user=str(name), sessions=int(sessions), cells=int(count), cell_seconds=float(seconds))
        for name, model, count, prompt, completion, cached in calls:
            entry = usage.setdefault(str(name), UserUsage(user=str(name)))
            tokens = {"prompt_tokens": int(prompt), "completion_tokens": int(completion), "cached_tokens": int(cached)}
            entry.models[str(model) or "unknown"] = {"calls": int(count), **tokens}
        return sorted(usage.values(), key=lambda entry: entry.user)

    # The audit trail

    def audit(self, entry: AuditEntry) -> None:
        """Append one entry to the audit trail."""
        with self._write_one() as db:
            _append(db, entry)

    def audit_entries(self, *, since: float | None = None, limit: int | None = None) -> list[AuditEntry]:
        """The audit trail, oldest first (from `since`, epoch seconds); with `limit`, the latest that many."""
        where, params = ("WHERE at >= ?", (since,)) if since is not None else ("", ())
        query = f"SELECT id, at, actor, action, target, source, detail FROM audit {where} ORDER BY id DESC"
        if limit is not None:
            query += f" LIMIT {int(limit)}"
        with self._read_one() as db:
            rows = db.execute(query, params).fetchall()
        entries = [AuditEntry(id=int(r[0]), at=float(r[1]), actor=r[2], action=r[3], target=r[4], source=r[5], detail=r[6]) for r in rows]
        return entries[::-1]


def _audited(db: Connection, by: Actor | None, action: str, target: str, detail: str = "") -> None:
    """The audit entry of a change `by` made, in the change's own transaction (none when no one is named)."""
    if by is not None:
        _append(db, AuditEntry(at=time.time(), actor=by.name, action=action, target=target, source=by.source, detail=detail))


def _append(db: Connection, entry: AuditEntry) -> None:
    db.execute(
        "INSERT INTO audit (at, actor, action, target, source, detail) VALUES (?, ?, ?, ?, ?, ?)",
        (entry.at, entry.actor, entry.action, entry.target, entry.source, entry.detail),
    )


def _user(row: Any) -> User:
    """A user from a row that starts (name, admin, created_at, expires_at, id)."""
    return User(name=row[0], admin=bool(row[1]), created_at=float(row[2]), expires_at=None if row[3] is None else float(row[3]), id=str(row[4]))


def _expiry(now: float, days: float | None) -> float | None:
    """When a token made at `now` for `days` stops working (None: never)."""
    return None if days is None else now + days * 86400.0
