"""The access log of `serve --log`: one line per request, its token never written.

Uvicorn's own access log would write the page's `/?token=...` address as it came; this one
writes the path with the token's value replaced, the status, and how long the answer took.
What a client chose (the path, the query) is written with its control characters escaped
(`\n` as `\x0a`): a request cannot forge a line of its own, or recolour a terminal tailing the log.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from pathlib import Path
from typing import TextIO
from urllib.parse import parse_qsl, urlencode

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from taskweaver_lite.telemetry.log_lines import utc_stamp

HIDDEN = "***"
_SESSION_PATH = re.compile(r"^/api/sessions/([^/]+)")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class AccessLog:
    """Where the lines go: a file (appended to) or stderr for `-`."""

    def __init__(self, target: str) -> None:
        self._stream: TextIO = sys.stderr if target == "-" else Path(target).expanduser().open("a", encoding="utf-8")
        self._owned = target != "-"
        self._lock = threading.Lock()

    def write(self, line: str) -> None:
        """One line, flushed at once (a log read while the server runs is up to date)."""
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()

    def close(self) -> None:
        """Close the file (stderr stays open)."""
        if self._owned:
            self._stream.close()


def request_line(scope: Scope, *, status: int, seconds: float) -> str:
    """`<time> <client> <METHOD> <path?query> <status> <ms>ms user=<name> session=<id>`, a `token` value in the query hidden.

    The user is the one the request's token named (`-` without users, or when refused); the token itself is never written.
    """
    client = scope.get("client") or ("-", 0)
    query = scope.get("query_string", b"").decode("latin-1")
    pairs = [(key, HIDDEN if key == "token" else value) for key, value in parse_qsl(query, keep_blank_values=True)]
    path = scope.get("path", "")
    raw = scope.get("raw_path")  # as sent, still percent-encoded: a decoded space could pass for the line's next field
    target = (raw.decode("latin-1") if isinstance(raw, bytes) else path) + (f"?{urlencode(pairs, safe='*')}" if pairs else "")
    stamp = utc_stamp()  # UTC, said so with its Z: replicas in other time zones line up
    user = getattr(scope.get("state", {}).get("user"), "name", None) or "-"
    session = _SESSION_PATH.match(path)
    line = f"{stamp} {client[0]} {scope.get('method', '-')} {target} {status} {seconds * 1000:.0f}ms user={user} session={session[1] if session else '-'}"
    return escaped(line)


def escaped(text: str) -> str:
    """`text` with each control character (and Unicode's line separators) written as its escape, so it stays one line."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}" if ord(m.group(0)) < 0x100 else f"\\u{ord(m.group(0)):04x}", text)


class AccessLogMiddleware:
    """Writes each HTTP request's line once its response has started (an event stream is logged when it opens)."""

    def __init__(self, app: ASGIApp, log: AccessLog) -> None:
        self._app = app
        self._log = log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = time.monotonic()

        async def logged(message: Message) -> None:
            if message["type"] == "http.response.start":
                self._log.write(request_line(scope, status=message["status"], seconds=time.monotonic() - started))
            await send(message)

        await self._app(scope, receive, logged)
