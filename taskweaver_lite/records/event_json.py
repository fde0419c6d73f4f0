"""What the page, API clients and the store's event log receive: the session's events and its rounds as JSON objects with a `type`.

The same events the terminal renders (`cli/console.py`), as data: text is sent as it is (the page
shows it as text, never as markup); a cell's `text/html` (a DataFrame) goes separately, for the
page to show in a sandboxed frame; plots as links to the artifacts route.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from taskweaver_lite.records.conversation import Post, Round
from taskweaver_lite.records.events import CellPrinted, Event, FileLoaded, Folded, PostAdded, RoundEnded, RoundStarted, Working
from taskweaver_lite.records.execution import ExecutionResult


def event_json(event: Event, *, session_id: str) -> dict[str, Any] | None:
    """One event as a JSON-ready dict; None for events the page does not show (model call records).

    Streamed reply pieces are read into fields by the session's `LiveSession` (hub.py) first.
    """
    if isinstance(event, CellPrinted):
        return {"type": "output", "stream": event.stream, "text": event.text}
    if isinstance(event, Working):
        return {"type": "status", "activity": event.activity, "detail": event.detail if event.activity != "code_running" else ""}
    if isinstance(event, PostAdded):
        return {"type": "post", "round": event.round.index, **post_json(event.post, session_id=session_id)}
    if isinstance(event, RoundStarted):
        return {"type": "round_started", "round": event.round.index, "text": event.round.user_query}
    if isinstance(event, RoundEnded):
        return {"type": "round_ended", "round": event.round.index, "state": event.round.state, "error": event.round.error}
    if isinstance(event, Folded):
        return {"type": "folded", "role": event.role, "ok": event.ok, "text": event.describe()}
    if isinstance(event, FileLoaded):
        return {"type": "file_loaded", "name": event.name, "text": event.describe()}
    return None


def post_json(post: Post, *, session_id: str) -> dict[str, Any]:
    """A post: who to whom, the message, and its code and execution when it ran some."""
    # `step`: a delegated step (a post with the Planner's plan), shown as the head of what follows.
    shown: dict[str, Any] = {"from": post.send_from, "to": post.send_to, "message": post.message, "step": post.plan is not None}
    if post.code is not None:
        shown["code"] = post.code
    if post.execution is not None:
        shown["execution"] = execution_json(post.execution, session_id=session_id)
    return shown


def execution_json(result: ExecutionResult, *, session_id: str) -> dict[str, Any]:
    """What a cell did, for the page: outcome, output, error, the table's HTML, plot links."""
    return {
        "outcome": result.outcome(),
        "success": result.success,
        "cancelled": result.cancelled,  # stopped by the user: the output is what it printed until then
        "stdout": result.stdout,
        "stderr": result.stderr,
        "result": result.result,
        "html": result.result_html,
        "error": None if result.error is None else {"name": result.error.name, "value": result.error.value, "traceback": result.error.traceback},
        "artifacts": [artifact_url(session_id, path) for path in result.artifacts],
    }


def artifact_url(session_id: str, path: str) -> str:
    """The route that serves one of the session's artifacts, by its file name."""
    return f"/api/sessions/{quote(session_id)}/artifacts/{quote(Path(path).name)}"


def round_json(rnd: Round, *, session_id: str) -> dict[str, Any]:
    """A whole round, for a page (re)loading the session."""
    return {
        "round": rnd.index,
        "text": rnd.user_query,
        "state": rnd.state,
        "error": rnd.error,
        "answer": rnd.answer,
        "posts": [post_json(p, session_id=session_id) for p in rnd.posts],
    }
