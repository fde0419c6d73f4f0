"""The server's open sessions: each with its own kernel and store lock, one request at a time.

A `LiveSession` runs `Session.ask` on a worker thread and hands every event the session emits to
the request's event stream (`Turn`) as a JSON-ready dict (`event_json.py`), in order, ending with
the answer or the error. Stop raises KeyboardInterrupt in the worker thread, exactly what Ctrl-C
does in the chat: the cell is interrupted, the round fails, the session and its variables stay.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import functools
import gc
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskweaver_lite.assembly import new_session_id
from taskweaver_lite.config import Config
from taskweaver_lite.errors import SessionBusyError, StoreError, TaskWeaverError
from taskweaver_lite.event_json import event_json
from taskweaver_lite.events import CellPrinted, Event, ModelCalled, PostAdded, ReplyStreamed, Working
from taskweaver_lite.kernel.executor import close_thread_loop
from taskweaver_lite.knowledge.tips import Tip
from taskweaver_lite.llm.streaming import SHOWN_FIELDS, PartialReply
from taskweaver_lite.session import Session
from taskweaver_lite.store.interface import Store
from taskweaver_lite.web.fanout import Fanout
from taskweaver_lite.web.leases import Hold, LeaseBusy, Leases
from taskweaver_lite.web.metrics import Metrics
from taskweaver_lite.web.replica import Replica

END = None  # closes a turn's stream
ANSWER_WRITE_WAIT = 0.05  # seconds a request's thread gives the loop to write its answer before its bookkeeping


class Busy(Exception):
    """A session is answering another request (or is open elsewhere): HTTP 409."""


class Turn:
    """One request's events: put by the worker thread, read by the event stream on the server's loop.

    The loop is woken once per batch with `call_soon_threadsafe`, so a waiting stream holds no
    thread (ten streams at once would otherwise use up the loop's thread pool). A `delta` carries
    everything read of its reply so far, so one still waiting to be sent is replaced by the next
    of the same role: a slow reader gets the latest text, not every step on the way to it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.finished = False  # the final event is on its way
        self.answered = False  # the answer is stored and on its way (the round's bookkeeping follows)
        self._pending: list[dict[str, Any] | None] = []
        self._lock = threading.Lock()
        self._ready = asyncio.Event()
        self._woken = False  # a wake-up is on its way to the loop
        self.answer_sent = threading.Event()  # the answer has been written to the client (or there is none to write to)
        self.since: int | None = None  # the session's newest stored event before this request (a page that loses the stream follows from it)

    @property
    def done(self) -> bool:
        """The answer or the error is out: what the request's thread still does is its own bookkeeping."""
        return self.answered or self.finished

    def put(self, item: dict[str, Any] | None) -> None:
        """From any thread: the next event (END closes the stream)."""
        with self._lock:
            last = self._pending[-1] if self._pending else None
            if item is not None and last is not None and item["type"] == last["type"] == "delta" and item["role"] == last["role"]:
                self._pending[-1] = item
            else:
                self._pending.append(item)
            wake, self._woken = not self._woken, True
        if wake:
            self._loop.call_soon_threadsafe(self._ready.set)

    async def batches(self) -> AsyncIterator[list[dict[str, Any]]]:
        """The events in order, as many at a time as have arrived since the last batch."""
        while True:
            await self._ready.wait()
            with self._lock:
                pending, self._pending = self._pending, []
                self._ready.clear()
                self._woken = False
            ended = END in pending
            batch = [item for item in pending[: pending.index(END) if ended else len(pending)] if item is not None]
            if batch:
                yield batch  # resumed once the server has written it
            if ended or any(item["type"] == "answer" for item in batch):
                self.answer_sent.set()
            if ended:
                return


class LiveSession:
    """A session open in this server: its kernel, its lock, its current turn."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._turn: Turn | None = None
        self._turns: dict[int, Turn] = {}  # a request's thread -> its turn: its events go there, not to a newer one
        self._worker: threading.Thread | None = None
        self._guard = threading.Lock()
        self._partial: dict[str, PartialReply] = {}
        self._saving = False  # /save's distillation is running: no request starts meanwhile
        self._on_answer: Callable[[], None] | None = None
        self.version = 0  # the newest stored event this copy wrote (a replica reuses the copy only while the store has none newer)
        session.add_listener(self._on_event, first=True)  # to the page at once, as to the terminal

    @property
    def id(self) -> str:
        return self.session.id

    @property
    def busy(self) -> bool:
        """A request is being answered (once its answer or error is out, the thread's last steps do not count)."""
        turn = self._turn
        answering = self._worker is not None and self._worker.is_alive() and not (turn is not None and turn.done)
        return answering or self._saving

    def save_experience(self) -> list[Tip]:
        """Distil the session into stored tips (a model call; run it off the loop); Busy while a request runs."""
        with self._guard:
            if self.busy:
                raise Busy("This session is answering a request: save its experience when it is done.")
            self._saving = True
        try:
            if self._worker is not None:
                self._worker.join()  # an answered request finishing its bookkeeping
            return self.session.save_experience()
        finally:
            self._saving = False

    def ask(
        self,
        text: str,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        on_answer: Callable[[], None] | None = None,
        on_done: Callable[[], None] | None = None,
    ) -> Turn:
        """Start answering `text` on a worker thread; its events arrive on the returned turn, read on `loop` (default: the running one).

        `on_answer` is called once the answer is stored, `on_done` once the request's thread has nothing left to do.
        """
        with self._guard:
            if self.busy:
                raise Busy("This session is still answering the previous request: wait for it, or press Stop.")
            previous = self._worker  # answered, perhaps still finishing its round's bookkeeping: the new one waits for it
            turn = self._turn = Turn(loop or asyncio.get_running_loop())
            self._on_answer = on_answer
            self._worker = threading.Thread(target=self._answer, args=(text, turn, previous, on_done), name=f"ask-{self.id}", daemon=True)
            self._worker.start()
        return turn

    def stop(self) -> bool:
        """Cancel the running request like Ctrl-C; False when nothing runs (or its answer is already out)."""
        worker, turn = self._worker, self._turn
        if worker is None or not worker.is_alive() or worker.ident is None or (turn is not None and turn.done):
            return False
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident), ctypes.py_object(KeyboardInterrupt))
        self.session.executor.interrupt()  # a running cell stops now, not at the next bytecode
        return True

    def _answer(self, text: str, turn: Turn, previous: threading.Thread | None, on_done: Callable[[], None] | None) -> None:
        final: dict[str, Any] | None
        self._turns[threading.get_ident()] = turn
        try:
            if previous is not None:
                previous.join()  # Stop while waiting for it cancels this request too
            rnd = self.session.ask(text)
        except KeyboardInterrupt:
            final = {"type": "error", "message": "Stopped. The session and its variables are kept."}
        except TaskWeaverError as exc:
            final = {"type": "error", "message": str(exc)}
        except Exception as exc:  # noqa: BLE001 - the page must hear of it, and the server must go on
            final = {"type": "error", "message": f"Internal error: {type(exc).__name__}: {exc}"}
        else:
            final = None if turn.answered else {"type": "error", "message": f"This request failed: {rnd.error or 'no answer'}"}
        close_thread_loop()  # the kernel client's loop for this thread
        self._turns.pop(threading.get_ident(), None)
        turn.finished = True  # a next request may start: this thread only returns from here
        if final is not None:
            turn.put(final)  # an error after the answer (the round's bookkeeping failed) is still said, last
        turn.put(END)
        if on_done is not None:
            on_done()

    def _on_event(self, event: Event) -> None:
        # A request's thread feeds its own turn, even once a newer request has started (it finishes
        # its round's bookkeeping meanwhile); background folds feed the newest.
        turn = self._turns.get(threading.get_ident(), self._turn)
        if turn is None or turn.answered:
            return  # nothing follows an answer but an error, said by `_answer`
        shown = self._streamed(event) if isinstance(event, ReplyStreamed) else event_json(event, session_id=self.id)
        if shown is not None:
            turn.put(shown)
        if isinstance(event, PostAdded) and event.post.is_answer:
            self._answered(turn, event)

    def _answered(self, turn: Turn, event: PostAdded) -> None:
        """The answer goes to the page when the terminal would print it: once the store holds it (Session._emit).

        Its thread then waits for the loop to write it, rather than take the interpreter from the
        loop for the round's bookkeeping; a client that stopped reading costs at most that wait.
        Should storing the round's end fail, an error follows the answer, last.
        """
        turn.answered = True
        turn.put({"type": "round_ended", "round": event.round.index, "state": "finished", "error": None})
        turn.put({"type": "answer", "text": event.post.message, "round": event.round.index})
        if self._on_answer is not None:
            self._on_answer()
        turn.answer_sent.wait(ANSWER_WRITE_WAIT)

    def _streamed(self, event: ReplyStreamed) -> dict[str, Any] | None:
        """A streaming reply as the fields read from it so far (the message, the code), never its raw JSON."""
        role, delta = event.role, event.delta
        if delta.kind == "start" or role not in self._partial:
            self._partial[role] = PartialReply(SHOWN_FIELDS)
        if delta.kind != "content":
            return None
        partial = self._partial[role]
        partial.feed(delta.text)
        return {"type": "delta", "role": role, "fields": dict(partial.values)} if partial.values else None

    def close(self) -> None:
        self.stop()
        if self._worker is not None:
            self._worker.join(10)
        self.session.close()


class NotOpen(Exception):
    """The session is not open in this one-process server (it must be resumed first): HTTP 404."""


class Stopping(Exception):
    """This replica is shutting down and takes no new requests (another replica will): HTTP 503."""


@dataclass(frozen=True)
class ServerParts:
    """What the server's sessions share: the one store, the metrics, the event fan-out, and on replicas the leases."""

    store: Store
    metrics: Metrics
    fanout: Fanout
    replica: Replica | None = None  # this server is one of several (a PostgreSQL store, kernels on a gateway)
    leases: Leases | None = None


class Hub:
    """Every session open in this server, by id.

    One process alone: a session is opened or resumed here and stays until the server stops. As a
    replica (`replica.py`), any request may name any stored session: it takes the session's lease,
    uses this server's copy if the store has nothing newer, else loads it, and frees the lease once
    its round's bookkeeping is done.
    """

    def __init__(self, config: Config, parts: ServerParts, *, preload: Sequence[Path] = ()) -> None:
        self.config = config
        self.parts = parts
        self._preload = tuple(preload)  # files loaded into every new session (`serve --demo`: the sample data)
        self._open: dict[str, LiveSession] = {}
        self._lock = threading.Lock()
        self.stopping = False  # SIGTERM: no new requests; running ones finish

    def join_replicas(self, url: str) -> None:
        """Serve as one replica of several on the PostgreSQL store at `url`: leases on sessions, events and Stop heard from the others."""
        replica = Replica(self.config, self.parts.store, metrics=self.parts.metrics)
        leases = Leases(self.parts.store, seconds=self.config.serve.lease_timeout, wait=self.config.serve.lease_wait, on_lost=self.stop_here)
        self.parts = dataclasses.replace(self.parts, replica=replica, leases=leases)
        self.parts.fanout.listen(url, on_stop=self.stop_here)

    def stop_taking(self) -> None:
        """SIGTERM: refuse new requests (503: the load balancer sends them to another replica) and end the event streams."""
        self.stopping = True
        self.parts.fanout.wake_all()

    @property
    def replica(self) -> Replica | None:
        """This server's replica part (None: one process alone)."""
        return self.parts.replica

    def new(self, *, owner: str | None = None) -> LiveSession:
        """A new stored session owned by `owner` (its kernel starts in the background)."""
        self._refuse_when_stopping()
        session_id = new_session_id()
        executor = self.replica.executor(session_id) if self.replica is not None else None
        session = Session.open(self.config, session_id=session_id, executor=executor, owner=owner, store=self.parts.store, claim=self.replica is None)
        for path in self._preload:
            session.load_file(path)
        return self._keep(LiveSession(session))

    def resume(self, session_id: str, *, owner: str | None = None) -> str:
        """A stored session made ready here (alone: re-opened, its cells replayed); Busy when it is open in another process."""
        self._refuse_when_stopping()
        if self.replica is not None:
            return self.parts.store.resolve(session_id, owner=owner)  # loaded by its next request, on whichever replica
        with self._lock:
            if session_id in self._open:
                return session_id
        try:
            session, _ = Session.resume(self.config, session_id, owner=owner, store=self.parts.store)  # the replay runs cells from this thread
        except SessionBusyError as exc:
            raise Busy(str(exc)) from None
        finally:
            close_thread_loop()
        return self._keep(LiveSession(session)).id

    def get(self, session_id: str) -> LiveSession | None:
        """This server's copy of the session, if it holds one (as a replica: perhaps stale)."""
        with self._lock:
            return self._open.get(session_id)

    def ask(self, session_id: str, text: str, *, loop: asyncio.AbstractEventLoop) -> Turn:
        """Start answering `text` in the session, its events read on `loop` (a replica: call from a thread); Busy, NotOpen, Stopping."""
        self._refuse_when_stopping()
        leases = self.parts.leases
        if leases is None:
            live = self._open_here(session_id)
            since = self.parts.store.last_event_id(session_id)
            turn = live.ask(text, loop=loop)
            turn.since = since
            return turn
        hold = self._take(leases, session_id)
        try:
            live = self._current(session_id)
            turn = live.ask(text, loop=loop, on_answer=functools.partial(leases.answered, hold), on_done=functools.partial(self._finish, live, hold))
            turn.since = live.version
            return turn
        except BaseException:
            leases.release(hold)
            raise

    @contextlib.contextmanager
    def using(self, session_id: str) -> Iterator[LiveSession]:
        """The session for a request that is not a message (an upload, its context, its tips): under its lease on a replica."""
        leases = self.parts.leases
        if leases is None:
            yield self._open_here(session_id)
            return
        self._refuse_when_stopping()
        hold = self._take(leases, session_id)
        try:
            live = self._current(session_id)
            if live.busy:
                raise Busy("This session is answering a request: try again when it is done.")
            yield live
        finally:
            self._finish(self.get(session_id), hold)

    def stop(self, session_id: str) -> bool:
        """Cancel the session's running request, here or (through the store) on the replica running it."""
        live = self.get(session_id)
        if live is not None and live.stop():
            return True
        if self.replica is None:
            return False
        running = self.parts.store.lease(session_id) is not None
        if running:
            self.parts.fanout.send_stop(session_id)
        return running

    def stop_here(self, session_id: str) -> None:
        """Another replica asked for the session's request to stop, or its lease was lost: stop it if it runs here."""
        live = self.get(session_id)
        if live is not None:
            live.stop()

    def upload_dir(self, live: LiveSession) -> Path:
        """Where an upload is received before `/load` copies it into the working folder."""
        folder = self.config.sessions_dir / live.id / "uploads"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def running(self) -> int:
        """Requests being answered here now."""
        with self._lock:
            return sum(live.busy for live in self._open.values())

    def close(self) -> None:
        """Close every session held here (on a replica their kernels stay on the gateway) and free what is still leased."""
        with self._lock:
            sessions, self._open = list(self._open.values()), {}
        for live in sessions:
            live.close()
        self.parts.metrics.open_sessions.set(0)
        if self.parts.leases is not None:
            self.parts.leases.close()
        close_thread_loop()

    def _refuse_when_stopping(self) -> None:
        if self.stopping:
            raise Stopping("This server is stopping: send the request again (another replica takes it).")

    def _open_here(self, session_id: str) -> LiveSession:
        live = self.get(session_id)
        if live is None:
            raise NotOpen("This session is not open in this server: resume it first (POST .../resume).")
        return live

    def _take(self, leases: Leases, session_id: str) -> Hold:
        try:
            return leases.take(session_id)
        except LeaseBusy as exc:
            raise Busy(str(exc)) from None

    def _current(self, session_id: str) -> LiveSession:
        """This server's copy if the store has nothing newer, else the session loaded afresh (under the caller's lease)."""
        assert self.replica is not None
        live = self.get(session_id)
        if live is not None and not live.busy and self.replica.is_current(session_id, live.version):
            return live
        if live is not None:
            self._drop(live)
        session = self.replica.load(session_id, listeners=[self.parts.metrics.observe])
        close_thread_loop()  # the replay (if the kernel had to be started afresh) ran cells from this thread
        live = self._keep(LiveSession(session))
        live.version = self.parts.store.last_event_id(session_id)
        return live

    def _finish(self, live: LiveSession | None, hold: Hold) -> None:
        """A request is done: its folds awaited, the copy's version noted, the lease freed."""
        assert self.replica is not None and self.parts.leases is not None
        try:
            if live is not None:
                for context in live.session.contexts().values():
                    context.wait_idle(timeout=self.config.serve.lease_wait)
                live.version = self.parts.store.last_event_id(live.id)
        except StoreError:
            if live is not None:
                live.version = -1  # unknown: the next request here loads the session again
        finally:
            self.parts.leases.release(hold)

    def _keep(self, live: LiveSession) -> LiveSession:
        live.session.add_listener(self.parts.metrics.observe)
        if self.replica is None:
            live.session.add_listener(_waking(self.parts.fanout, live.id))
        _settle()
        with self._lock:
            self._open[live.id] = live
            self.parts.metrics.open_sessions.set(len(self._open))
        return live

    def _drop(self, live: LiveSession) -> None:
        """Let go of a stale copy (its kernel stays on the gateway for the fresh one)."""
        with self._lock:
            if self._open.get(live.id) is live:
                del self._open[live.id]
            self.parts.metrics.open_sessions.set(len(self._open))
        live.close()


def _waking(fanout: Fanout, session_id: str) -> Callable[[Event], None]:
    """A listener that wakes the session's event streams in this process once an event is stored (it is, before listeners hear it)."""

    def wake(event: Event) -> None:
        if not isinstance(event, (Working, ReplyStreamed, CellPrinted, ModelCalled)):
            fanout.wake(session_id)

    return wake


def _settle() -> None:
    """Take what exists now (the modules, the open sessions) out of the garbage collector's view.

    A full collection walks every object in the process: with pandas, the tokenizer and the SDKs
    loaded that is ~200,000 of them and ~100 ms during which no session's thread runs, which the
    ten-session bench saw as a 100-260 ms p95. Sessions open here live until the server stops,
    so what is frozen on opening one stays in use; their later objects are collected as usual.
    """
    gc.freeze()
