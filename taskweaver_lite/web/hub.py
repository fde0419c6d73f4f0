"""The server's open sessions: each with its own kernel and store lock, one request at a time.

A `LiveSession` runs `Session.ask` on a worker thread and hands every event the session emits to
the request's event stream (`Turn`) as a JSON-ready dict (`web/events.py`), in order, ending with
the answer or the error. Stop raises KeyboardInterrupt in the worker thread, exactly what Ctrl-C
does in the chat: the cell is interrupted, the round fails, the session and its variables stay.
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from taskweaver_lite.config import Config
from taskweaver_lite.conversation import RoleName
from taskweaver_lite.errors import SessionBusyError, TaskWeaverError
from taskweaver_lite.events import Event, ReplyStreamed
from taskweaver_lite.kernel.executor import close_thread_loop
from taskweaver_lite.session import Session
from taskweaver_lite.streaming import SHOWN_FIELDS, PartialReply
from taskweaver_lite.web.events import event_json

END = None  # closes a turn's stream


class Busy(Exception):
    """A session is answering another request (or is open elsewhere): HTTP 409."""


class Turn:
    """One request's events: put by the worker thread, read by the event stream on the server's loop.

    Handed over with `call_soon_threadsafe`, so a waiting stream holds no thread (ten streams at
    once would otherwise use up the loop's thread pool and wait on one another).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.finished = False  # the final event is on its way
        self._queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    def put(self, item: dict[str, Any] | None) -> None:
        """From any thread: the next event (END closes the stream)."""
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        while (item := await self._queue.get()) is not END:
            yield item


class LiveSession:
    """A session open in this server: its kernel, its lock, its current turn."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._turn: Turn | None = None
        self._worker: threading.Thread | None = None
        self._guard = threading.Lock()
        self._partial: dict[RoleName, PartialReply] = {}
        session.add_listener(self._on_event, first=True)  # to the page at once, as to the terminal

    @property
    def id(self) -> str:
        return self.session.id

    @property
    def busy(self) -> bool:
        return self._worker is not None and self._worker.is_alive()

    def ask(self, text: str) -> Turn:
        """Start answering `text` on a worker thread; its events arrive on the returned turn (call from the server's loop)."""
        with self._guard:
            previous = self._turn
            if self._worker is not None and previous is not None and previous.finished:
                self._worker.join(5)  # its answer was sent; the thread is on its way out
            if self.busy:
                raise Busy("This session is still answering the previous request: wait for it, or press Stop.")
            turn = self._turn = Turn(asyncio.get_running_loop())
            self._worker = threading.Thread(target=self._answer, args=(text, turn), name=f"ask-{self.id}", daemon=True)
            self._worker.start()
        return turn

    def stop(self) -> bool:
        """Cancel the running request like Ctrl-C; False when nothing runs."""
        worker, turn = self._worker, self._turn
        if worker is None or not worker.is_alive() or worker.ident is None or (turn is not None and turn.finished):
            return False
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident), ctypes.py_object(KeyboardInterrupt))
        self.session.executor.interrupt()  # a running cell stops now, not at the next bytecode
        return True

    def _answer(self, text: str, turn: Turn) -> None:
        final: dict[str, Any]
        try:
            rnd = self.session.ask(text)
        except KeyboardInterrupt:
            final = {"type": "error", "message": "Stopped. The session and its variables are kept."}
        except TaskWeaverError as exc:
            final = {"type": "error", "message": str(exc)}
        except Exception as exc:  # noqa: BLE001 - the page must hear of it, and the server must go on
            final = {"type": "error", "message": f"Internal error: {type(exc).__name__}: {exc}"}
        else:
            if rnd.state == "finished" and rnd.answer is not None:
                final = {"type": "answer", "text": rnd.answer, "round": rnd.index}
            else:
                final = {"type": "error", "message": f"This request failed: {rnd.error or 'no answer'}"}
        close_thread_loop()  # the kernel client's loop for this thread
        turn.finished = True  # a next request may start: this thread only returns from here
        turn.put(final)
        turn.put(END)

    def _on_event(self, event: Event) -> None:
        turn = self._turn
        if turn is None:
            return
        shown = self._streamed(event) if isinstance(event, ReplyStreamed) else event_json(event, session_id=self.id)
        if shown is not None:
            turn.put(shown)

    def _streamed(self, event: ReplyStreamed) -> dict[str, Any] | None:
        """A streaming reply as the fields read from it so far (the message, the code), never its raw JSON."""
        role, delta = event.role, event.delta
        if delta.kind == "start" or role not in self._partial:
            self._partial[role] = PartialReply(SHOWN_FIELDS.get(role, ()))
        if delta.kind != "content":
            return None
        partial = self._partial[role]
        partial.feed(delta.text)
        return {"type": "delta", "role": role.value, "fields": dict(partial.values)} if partial.values else None

    def close(self) -> None:
        self.stop()
        if self._worker is not None:
            self._worker.join(10)
        self.session.close()


class Hub:
    """Every session open in this server, by id."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._open: dict[str, LiveSession] = {}
        self._lock = threading.Lock()

    def new(self) -> LiveSession:
        """A new stored session (its kernel starts in the background)."""
        live = LiveSession(Session.open(self.config))
        with self._lock:
            self._open[live.id] = live
        return live

    def resume(self, session_id: str) -> LiveSession:
        """A stored session re-opened here (its cells replayed); Busy when it is open elsewhere."""
        with self._lock:
            if session_id in self._open:
                return self._open[session_id]
        try:
            session, _ = Session.resume(self.config, session_id)  # the replay runs cells from this thread
        except SessionBusyError as exc:
            raise Busy(str(exc)) from None
        finally:
            close_thread_loop()
        live = LiveSession(session)
        with self._lock:
            self._open[live.id] = live
        return live

    def get(self, session_id: str) -> LiveSession | None:
        with self._lock:
            return self._open.get(session_id)

    def upload_dir(self, live: LiveSession) -> Path:
        """Where an upload is received before `/load` copies it into the working folder."""
        folder = self.config.sessions_dir / live.id / "uploads"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def close(self) -> None:
        with self._lock:
            sessions, self._open = list(self._open.values()), {}
        for live in sessions:
            live.close()
        close_thread_loop()
