"""What the server writes to the audit trail for a request: who (the request's user), what, on which target, from where.

The store keeps the trail (`Store.audit`, append-only); sign-ins and refused tokens are written where they
are decided (app.py, auth.py), the rest here: session deletes, and an admin opening a session another user
owns. An admin reading one session is one entry an hour per session and replica, not one per request of
the page. While the store is down an entry is a warning line in the log instead: the request goes on.
"""

from __future__ import annotations

import logging
import threading
import time

from starlette.requests import Request

from taskweaver_lite.errors import StoreError
from taskweaver_lite.store.interface import AuditEntry, Store

ADMIN_VISIT_SECONDS = 3600.0  # an admin's visits to one session are written once in this long
_log = logging.getLogger(__name__)


def actor_of(request: Request) -> str:
    """The request's user by name (`-` without users: the server's one token, or loopback)."""
    user = request.scope.get("state", {}).get("user")
    return str(user.name) if user is not None else "-"


def source_of(request: Request) -> str:
    """The client's address as the guard found it (behind a trusted proxy, the one X-Forwarded-For names)."""
    return str(request.scope.get("state", {}).get("client_address") or (request.client.host if request.client else ""))


def record(store: Store, request: Request, action: str, target: str, detail: str = "") -> None:
    """One entry for what `request`'s user did to `target` (blocking: call it off the event loop)."""
    entry = AuditEntry(at=time.time(), actor=actor_of(request), action=action, target=target, source=source_of(request), detail=detail)
    try:
        store.audit(entry)
    except StoreError as exc:
        _log.warning("audit entry not stored (%s %s %s from %s): %s", entry.actor, entry.action, entry.target, entry.source, " ".join(str(exc).split()))


class AdminVisits:
    """When each admin last had a visit to another user's session written: one entry an hour per admin and session."""

    def __init__(self) -> None:
        self._written: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def due(self, admin_id: str, session_id: str) -> bool:
        """Whether this visit is to be written (the first in ADMIN_VISIT_SECONDS); marks it written."""
        now = time.monotonic()
        with self._lock:
            if len(self._written) > 10_000:
                self._written.clear()
            last = self._written.get((admin_id, session_id))
            if last is not None and now - last < ADMIN_VISIT_SECONDS:
                return False
            self._written[(admin_id, session_id)] = now
            return True


def admin_visit(store: Store, request: Request, session_id: str, visits: AdminVisits) -> None:
    """An admin's request about a session another user owns: written once an hour (blocking: call it off the loop)."""
    user = request.scope.get("state", {}).get("user")
    if user is None or not getattr(user, "admin", False):
        return
    owner = store.owner_of(session_id)
    if owner is None or owner == user.id or not visits.due(str(user.id), session_id):
        return
    names = {u.id: u.name for u in store.users()}
    record(store, request, "session-opened-by-admin", session_id, f"owner {names.get(owner, owner)}; {request.method} {request.url.path}")
