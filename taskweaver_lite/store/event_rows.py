"""The rows a write of session events becomes (`EventRows`), gathered once and written by either backend.

A round's row is made the first time one of its events is written; a post carries its cell's
result in its JSON, and each cell's variables snapshot is kept on the session's row; the answer
ends its round in the same write; the session's `last_active` is set once per round, by the write
that starts it. Progress events (streamed text, a cell's prints) are never rows.

`EventRows.statements()` gives the write as a few statements with `?` placeholders, each table's
rows in one: SQLite runs them in one transaction, PostgreSQL sends them as one statement (each a
data-modifying `WITH`), which needs no transaction around it. Both work because no statement reads
what another of the same write changed: a round made in the write is made with its end already,
and the session's row is updated by one statement that does all of it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from taskweaver_lite.records.conversation import Post
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


Statement = tuple[str, list[Any]]


@dataclass
class EventRows:
    """The rows of one write of a session's events, by table (see the module docstring)."""

    session_id: str
    now: float
    active: bool = False  # a round starts (or a file is loaded): the session's last_active is set
    title: str | None = None  # the first request's, kept only by a session without a title yet
    variables: list[tuple[str, str]] = field(default_factory=list)  # (post id, variables JSON) of each cell's result, in order
    rounds: dict[str, list[Any]] = field(default_factory=dict)  # round id -> the values of its row, made unless it exists
    ends: dict[str, tuple[str, str | None, float]] = field(default_factory=dict)  # round id -> (state, error, ended_at)
    posts: list[list[Any]] = field(default_factory=list)
    calls: list[list[Any]] = field(default_factory=list)
    folds: list[list[Any]] = field(default_factory=list)
    files: list[list[Any]] = field(default_factory=list)
    states: dict[str, str] = field(default_factory=dict)  # role -> its compression state's JSON
    log: list[str] = field(default_factory=list)  # the event log's entries, JSON, in order
    mark: Statement | None = None  # a lease row taken in the same write (the answered mark: `Store.record`'s `mark`)
    unmark: Statement | None = None  # lease rows deleted in the same write (`Store.record`'s `unmark`)

    def add(self, event: Event, *, known_rounds: set[tuple[str, str]]) -> None:
        """Gather `event`'s rows (a round's row too unless `known_rounds` has it)."""
        if isinstance(event, (RoundStarted, PostAdded, RoundEnded)):
            rnd = event.round
            if (self.session_id, rnd.id) not in known_rounds and rnd.id not in self.rounds:
                self.rounds[rnd.id] = [self.session_id, rnd.id, rnd.index, rnd.user_query, "running", None, rnd.started_at, None]
        if isinstance(event, RoundStarted):
            self.active = True
            self.title = shorten(event.round.user_query) if self.title is None else self.title
        elif isinstance(event, PostAdded):
            self._post(event.round.id, event.post)
            if event.post.is_answer:  # the answer ends its round: both are kept in one write
                self._end(event.round.id, "finished", None)
        elif isinstance(event, RoundEnded):
            self._end(event.round.id, event.round.state, event.round.error)
        elif isinstance(event, ModelCalled):
            prompt = to_json(list(event.prompt)) if event.prompt is not None else None
            self.calls.append(
                [
                    self.session_id,
                    event.purpose,
                    event.prompt_tokens,
                    event.completion_tokens,
                    event.cached_tokens,
                    event.latency,
                    int(event.ok),
                    event.error,
                    prompt,
                    event.reply,
                    self.now,
                    event.model,
                ]
            )
        elif isinstance(event, Folded):
            fold = [event.role, event.first_round, event.last_round, event.tokens_before, event.tokens_after, int(event.ok), event.error]
            self.folds.append([self.session_id, *fold, self.now])
        elif isinstance(event, FileLoaded):
            self.active = True
            self.files.append([self.session_id, event.name, event.source, event.after_round, event.at])

    def _post(self, round_id: str, post: Post) -> None:
        execution = post.execution
        if execution is not None:  # every cell's result carries the kernel's snapshot after it (empty after a kernel death)
            self.variables.append((post.id, to_json([v.to_dict() for v in execution.variables])))
        success = int(execution.success) if execution else None
        self.posts.append([self.session_id, round_id, post.id, post.send_from, post.send_to, success, post.created_at, to_json(post.to_dict())])

    def _end(self, round_id: str, state: str, error: str | None) -> None:
        self.ends[round_id] = (state, error, self.now)
        made = self.rounds.get(round_id)
        if made is not None:  # made in this write: made ended (an update in the same statement would not see it)
            made[4:6], made[7] = [state, error], self.now

    @property
    def empty(self) -> bool:
        """Nothing to write."""
        return not any((self.active, self.title, self.variables, self.rounds, self.ends, self.posts, self.calls, self.folds, self.files, self.states, self.log))

    def session_update(self) -> Statement | None:
        """The one statement that changes the session's row (last_active, title, variables), None when the write does not.

        A cell's variables are kept unless its post was written before (the same id): decided by the
        database, before this write's posts are in, so the statement may go with them. Of several
        cells in one write, the last one new wins.
        """
        sets: list[str] = []
        params: list[Any] = []
        if self.active:
            sets.append("last_active = ?")
            params.append(self.now)
        if self.title is not None:
            sets.append("title = CASE WHEN title = '' THEN ? ELSE title END")
            params.append(self.title)
        if self.variables:
            cases = " ".join("WHEN NOT EXISTS (SELECT 1 FROM posts WHERE session_id = ? AND post_id = ?) THEN ?" for _ in self.variables)
            sets.append(f"variables = CASE {cases} ELSE variables END")
            for post_id, variables in reversed(self.variables):
                params += [self.session_id, post_id, variables]
        if not sets:
            return None
        return f"UPDATE sessions SET {', '.join(sets)} WHERE id = ?", [*params, self.session_id]

    def statements(self) -> list[Statement]:
        """The write's other statements, each table's rows in one, parents before the rows that refer to them (the log apart: `log_insert`)."""
        out: list[Statement] = []
        if self.rounds:
            columns = "rounds (session_id, round_id, idx, user_query, state, error, started_at, ended_at)"
            out.append(_insert(columns, list(self.rounds.values()), " ON CONFLICT (session_id, round_id) DO NOTHING"))
        if self.posts:
            columns = "posts (session_id, round_id, post_id, send_from, send_to, success, created_at, data)"
            out.append(_insert(columns, self.posts, " ON CONFLICT (session_id, post_id) DO NOTHING"))
        for round_id, (state, error, at) in self.ends.items():
            end = "UPDATE rounds SET state = ?, error = ?, ended_at = ? WHERE session_id = ? AND round_id = ?"
            out.append((end, [state, error, at, self.session_id, round_id]))
        if self.calls:
            columns = "model_calls (session_id, purpose, prompt_tokens, completion_tokens, cached_tokens, latency, ok, error, prompt, reply, at, model)"
            out.append(_insert(columns, self.calls))
        if self.folds:
            out.append(_insert("folds (session_id, role, first_round, last_round, tokens_before, tokens_after, ok, error, at)", self.folds))
        if self.files:
            out.append(_insert("files (session_id, name, source, after_round, at)", self.files))
        if self.states:
            rows = [[self.session_id, role, state, self.now] for role, state in self.states.items()]
            upsert = " ON CONFLICT (session_id, role) DO UPDATE SET state = excluded.state, saved_at = excluded.saved_at"
            out.append(_insert("compression (session_id, role, state, saved_at)", rows, upsert))
        out += [statement for statement in (self.mark, self.unmark) if statement is not None]
        return out

    def log_insert(self) -> Statement | None:
        """The event log's new entries, one statement returning their ids (None when there are none)."""
        if not self.log:
            return None
        return _insert("events (session_id, data, at)", [[self.session_id, entry, self.now] for entry in self.log], " RETURNING id")


def _insert(table: str, rows: list[list[Any]], tail: str = "") -> Statement:
    """One INSERT of `rows` into `table` ('name (columns)'), in their order."""
    one = f"({', '.join('?' * len(rows[0]))})"
    return f"INSERT INTO {table} VALUES {', '.join([one] * len(rows))}{tail}", [value for row in rows for value in row]
