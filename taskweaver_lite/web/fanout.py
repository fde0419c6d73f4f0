"""Telling a replica's event streams that a session has new stored events, whichever replica stored them.

The store writes a session's events and, on PostgreSQL, `NOTIFY twl_events, '<session id>'` in the
same transaction: the notice goes out when the events are committed, to every replica. Each
replica LISTENs on one connection of its own (a thread), and wakes the streams of that session
(`GET /api/sessions/{id}/events`), which then read what is new from the store. A notice carries no
event: the store is the only source, so a notice missed (while the connection was being remade)
costs at most `POLL` seconds, never an event. Without PostgreSQL (one process on SQLite) the
process's own sessions wake their streams directly (`wake`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator

CHANNEL = "twl_events"
STOP_CHANNEL = "twl_stop"  # Stop pressed on one replica, for the replica running the request
# Seconds a stream waits for a notice before it reads the store anyway (and sends a keep-alive).
POLL = 10.0
# Seconds between attempts to listen again after the connection to PostgreSQL dropped.
RETRY = 1.0


class Fanout:
    """Wakes the waiting streams of a session; fed by `wake` (this process) or a LISTEN thread (PostgreSQL)."""

    def __init__(self) -> None:
        self._waiting: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = defaultdict(set)
        self._lock = threading.Lock()
        self._listener: _Listener | None = None
        self._url: str | None = None

    def listen(self, url: str, *, on_stop: Callable[[str], object]) -> None:
        """LISTEN on PostgreSQL at `url` from now on (a daemon thread that reconnects by itself); `on_stop` hears Stop requests."""
        self._url = url
        self._listener = _Listener(url, {CHANNEL: self.wake, STOP_CHANNEL: on_stop})
        self._listener.start()

    def send_stop(self, session_id: str) -> None:
        """Ask every replica to stop the session's running request (the one running it does)."""
        import psycopg

        if self._url is None:
            return
        with contextlib.suppress(psycopg.Error), psycopg.connect(self._url, autocommit=True, connect_timeout=5) as db:
            db.execute("SELECT pg_notify(%s, %s)", (STOP_CHANNEL, session_id))  # missed: the mark in the store still reaches it

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
        """Whether the LISTEN connection is up now (always True without PostgreSQL)."""
        return self._listener is None or self._listener.connected

    def close(self) -> None:
        """Stop listening."""
        if self._listener is not None:
            self._listener.stop()


class _Listener(threading.Thread):
    """The LISTEN connection's thread: hands each notice's session id to its channel's handler; reconnects after a drop."""

    def __init__(self, url: str, handlers: dict[str, Callable[[str], object]]) -> None:
        super().__init__(name="store-listen", daemon=True)
        self._url = url
        self._handlers = handlers
        self._stopping = threading.Event()
        self.connected = False

    def run(self) -> None:
        import psycopg

        while not self._stopping.is_set():
            try:
                with psycopg.connect(self._url, autocommit=True, connect_timeout=5) as db:
                    for channel in self._handlers:
                        db.execute(f"LISTEN {channel}")
                    self.connected = True
                    while not self._stopping.is_set():
                        for notice in db.notifies(timeout=1.0):
                            self._handlers[notice.channel](notice.payload)
            except psycopg.Error:
                pass  # the store is down or restarting: /healthz says so; try again
            self.connected = False
            self._stopping.wait(RETRY)

    def stop(self) -> None:
        self._stopping.set()
