"""The rows each session event becomes, written inside the store's transaction (`write_event`), for both backends.

A round's row is made the first time one of its events is written; a post carries its cell's
result in its JSON, and each cell's variables snapshot is kept on the session's row; the answer
ends its round in the same write. Progress events (streamed text, a cell's prints) are never rows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

from taskweaver_lite.records.conversation import Post, Round
from taskweaver_lite.records.events import Event, FileLoaded, Folded, ModelCalled, PostAdded, RoundEnded, RoundStarted

TITLE_LENGTH = 60


class Rows(Protocol):
    """A cursor after a statement: what the shared code reads of it (sqlite3's and psycopg's both fit)."""

    @property
    def rowcount(self) -> int: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


class Connection(Protocol):
    """One connection inside a transaction: `?` placeholders on both backends."""

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> Rows: ...


def to_json(value: Any) -> str:
    """A value as the JSON text the store keeps (non-ASCII kept as it is)."""
    return json.dumps(value, ensure_ascii=False)


def shorten(text: str, limit: int = TITLE_LENGTH) -> str:
    """One line of at most `limit` characters, cut at a word with '…' when longer."""
    line = " ".join(text.split())
    if len(line) <= limit:
        return line
    cut = line[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip(" ,.;:") + "…"


def write_event(db: Connection, session_id: str, event: Event, now: float, *, known_rounds: set[tuple[str, str]], made: set[tuple[str, str]]) -> None:
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
        _insert_call(db, session_id, event, now)
    elif isinstance(event, Folded):
        db.execute(
            "INSERT INTO folds (session_id, role, first_round, last_round, tokens_before, tokens_after, ok, error, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (session_id, event.role, event.first_round, event.last_round, event.tokens_before, event.tokens_after, int(event.ok), event.error, now),
        )
    elif isinstance(event, FileLoaded):
        db.execute(
            "INSERT INTO files (session_id, name, source, after_round, at) VALUES (?, ?, ?, ?, ?)",
            (session_id, event.name, event.source, event.after_round, event.at),
        )


def _ensure_round(db: Connection, session_id: str, rnd: Round) -> None:
    db.execute(
        "INSERT INTO rounds (session_id, round_id, idx, user_query, state, error, started_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (session_id, round_id) DO NOTHING",
        (session_id, rnd.id, rnd.index, rnd.user_query, "running", None, rnd.started_at),
    )


def _insert_call(db: Connection, session_id: str, event: ModelCalled, now: float) -> None:
    prompt = to_json(list(event.prompt)) if event.prompt is not None else None
    db.execute(
        "INSERT INTO model_calls (session_id, purpose, prompt_tokens, completion_tokens, cached_tokens, latency, ok, error, prompt, reply, at, model)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            session_id,
            event.purpose,
            event.prompt_tokens,
            event.completion_tokens,
            event.cached_tokens,
            event.latency,
            int(event.ok),
            event.error,
            prompt,
            event.reply,
            now,
            event.model,
        ),
    )


def _end_round(db: Connection, session_id: str, round_id: str, *, state: str, error: str | None, at: float) -> None:
    db.execute("UPDATE rounds SET state = ?, error = ?, ended_at = ? WHERE session_id = ? AND round_id = ?", (state, error, at, session_id, round_id))


def _insert_post(db: Connection, session_id: str, round_id: str, post: Post) -> None:
    execution = post.execution
    if execution is not None:
        # Every cell's result carries the kernel's snapshot after it (empty after a kernel death); a post
        # written before (the same id) leaves the session's as it is. Decided by the database, not by a
        # row count read back, so that PostgreSQL can be sent the whole write at once.
        variables = to_json([v.to_dict() for v in execution.variables])
        db.execute(
            "UPDATE sessions SET variables = ? WHERE id = ? AND NOT EXISTS (SELECT 1 FROM posts WHERE session_id = ? AND post_id = ?)",
            (variables, session_id, session_id, post.id),
        )
    db.execute(
        "INSERT INTO posts (session_id, round_id, post_id, send_from, send_to, success, created_at, data)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (session_id, post_id) DO NOTHING",
        (session_id, round_id, post.id, post.send_from, post.send_to, int(execution.success) if execution else None, post.created_at, to_json(post.to_dict())),
    )
