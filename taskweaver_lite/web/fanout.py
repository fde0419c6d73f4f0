"""Telling a replica's event streams that a session has new stored events, whichever replica stored them.

The store writes a session's events and, on PostgreSQL, notices them (`EVENTS_CHANNEL`) in the same
transaction: the notice goes out when the events are committed, to the replicas that follow that
session (`follow`: an event stream of it is open there), and to no other. Each replica listens
through the store's `Notices` (store/interface.py; on PostgreSQL a LISTEN connection of its own,
`store/postgres.py`), and wakes the streams of that session (`GET /api/sessions/{id}/events`),
which then read what is new from the store. A write that no stream follows (a request's own
events, which its answer stream carries) wakes no replica. A notice carries no event: the store is the only source,
so a notice missed (while the connection was being remade) costs at most `POLL` seconds, never an
event. Without PostgreSQL (one process on SQLite) the process's own sessions wake their streams
directly (`wake`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator

from taskweaver_lite.errors import StoreError
from taskweaver_lite.store.interface import EVENTS_CHANNEL, Notices

STOP_CHANNEL = "twl_stop"  # Stop pressed on one replica, for the replica running the request
# Seconds a stream waits for a notice before it reads the store anyway (and sends a keep-alive).
POLL = 10.0
_log = logging.getLogger(__name__)


class Fanout:
    """Wakes the waiting streams of a session; fed by `wake` (this process) or the store's notices (PostgreSQL)."""

    def __init__(self) -> None:
        self._waiting: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = defaultdict(set)
        self._lock = threading.Lock()
        self._notices: Notices | None = None

    def listen(self, notices: Notices, *, on_stop: Callable[[str], object]) -> None:
        """Hear the store's notices from now on (a thread that reconnects by itself); `on_stop` hears Stop requests."""
        self._notices = notices
        notices.listen({EVENTS_CHANNEL: self.wake, STOP_CHANNEL: on_stop})

    def send_stop(self, session_id: str) -> None:
        """Ask every replica to stop the session's running request (the one running it does)."""
        if self._notices is not None:
            self._notices.send(STOP_CHANNEL, session_id)  # missed: the mark in the store still reaches it

    def following(self, session_id: str) -> Following:
        """This replica's part in the session's notices for one event stream (`Following`)."""
        return Following(self._notices, session_id)

    @contextlib.contextmanager
    def waiter(self, session_id: str) -> Iterator[asyncio.Event]:
        """An event set when `session_id` has news; registered before the store is read, so no notice falls between."""
        signal = asyncio.Event()
        entry = (asyncio.get_running_loop(), signal)
        with self._lock:
            self._waiting[session_id].add(entry)
        try:
            yield signal
        finally:
            with self._lock:
                self._waiting[session_id].discard(entry)
                if not self._waiting[session_id]:
                    del self._waiting[session_id]

    def wake(self, session_id: str) -> None:
        """From any thread: the session has new stored events."""
        with self._lock:
            entries = list(self._waiting.get(session_id, ()))
        for loop, signal in entries:
            with contextlib.suppress(RuntimeError):  # its loop has closed (the server is stopping)
                loop.call_soon_threadsafe(signal.set)

    def wake_all(self) -> None:
        """Wake every waiting stream (the server is stopping: they look at it and end)."""
        with self._lock:
            sessions = list(self._waiting)
        for session_id in sessions:
            self.wake(session_id)

    @property
    def listening(self) -> bool:
        """Whether the store's notices are heard now (always True without PostgreSQL)."""
        return self._notices is None or self._notices.connected

    def close(self) -> None:
        """Stop listening."""
        if self._notices is not None:
            self._notices.close()


class Following:
    """One event stream's following of a session: while it lasts, the session's writes notice this replica.

    `start` (from a thread: a statement) before the stream first reads the store, so that whatever
    is written after that read wakes it; `end` (from the loop, perhaps as the stream is cancelled,
    even while `start` runs) lets go in the background. A stream that could not follow (the store
    down) reads the store every POLL seconds, and starts again at its next turn.
    """

    def __init__(self, notices: Notices | None, session_id: str) -> None:
        self._notices = notices
        self.session_id = session_id
        self.on = notices is None  # one process: its own sessions wake their streams, nothing to follow
        self._ended = False
        self._lock = threading.Lock()  # `start` and `end`'s letting go, one at a time

    def start(self) -> None:
        """Follow the session from now on (nothing when the stream has ended meanwhile)."""
        with self._lock:
            if self.on or self._ended or self._notices is None:
                return
            try:
                self._notices.follow(self.session_id)
            except StoreError as exc:
                _log.warning("session %s: could not follow its events (%s); its stream reads the store every %g s", self.session_id, exc, POLL)
                return
            self.on = True

    def end(self) -> None:
        """The stream has ended: let go of the session (in the background; after a `start` still under way, once it is done)."""
        if self._notices is not None:
            threading.Thread(target=self._let_go, name="unfollow", daemon=True).start()

    def _let_go(self) -> None:
        with self._lock:
            self._ended = True
            if self.on and self._notices is not None:
                self.on = False
                self._notices.unfollow(self.session_id)
