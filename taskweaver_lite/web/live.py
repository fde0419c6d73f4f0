"""A session open in this server, and one request's event stream: the worker thread that answers, the events it hands the page.

A `LiveSession` runs `Session.ask` on a worker thread and hands every event the session emits to
the request's event stream (`Turn`) as a JSON-ready dict (`event_json.py`), in order, ending with
the answer or the error. Stop raises KeyboardInterrupt in the worker thread, exactly what Ctrl-C
does in the chat: the cell is interrupted, the round fails, the session and its variables stay.
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from taskweaver_lite.errors import TaskWeaverError
from taskweaver_lite.kernel.executor import close_thread_loop
from taskweaver_lite.llm.streaming import SHOWN_FIELDS, PartialReply
from taskweaver_lite.records.conversation import Round
from taskweaver_lite.records.event_json import event_json
from taskweaver_lite.records.events import Event, Listener, PostAdded, ReplyStreamed
from taskweaver_lite.records.tips import Tip
from taskweaver_lite.session.session import Session
from taskweaver_lite.telemetry import tracing

END = None  # closes a turn's stream
CUT_SHORT = "This server is shutting down and the request ran out of time to finish: send it again (another server takes it)"
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
        self.stop_asked = False  # Stop was pressed for this request (once is enough)

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
        self.last_used = time.monotonic()  # a replica lets the least recently used copies go first
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
        listener: Listener | None = None,
    ) -> Turn:
        """Start answering `text` on a worker thread; its events arrive on the returned turn, read on `loop` (default: the running one).

        `on_answer` is called once the answer is stored, `on_done` once the request's thread has nothing left to do;
        `listener` hears the session's events while this request's turn runs (MCP's note of the files its cells write).
        """
        with self._guard:
            if self.busy:
                raise Busy("This session is still answering the previous request: wait for it, or press Stop.")
            previous = self._worker  # answered, perhaps still finishing its round's bookkeeping: the new one waits for it
            turn = self._turn = Turn(loop or asyncio.get_running_loop())
            self._on_answer = on_answer
            # In this context: with tracing on, the turn continues the trace of the HTTP request that asked.
            answer = tracing.carried(self._answer)
            self._worker = threading.Thread(target=answer, args=(text, turn, previous, on_done, listener), name=f"ask-{self.id}", daemon=True)
            self._worker.start()
        return turn

    def stop(self, *, cut: bool = False) -> bool:
        """Cancel the running request like Ctrl-C; False when nothing runs (or its answer is already out).

        `cut`: the server is going away under it (its drain timeout passed, its lease was lost), not
        the user: the round is marked cut off, as for a replica that died, rather than cancelled.
        """
        worker, turn = self._worker, self._turn
        if worker is None or not worker.is_alive() or worker.ident is None or (turn is not None and turn.done):
            return False
        if turn is not None and turn.stop_asked and not cut:
            # Stop heard twice (the NOTIFY and the store's mark): a second interrupt would cut short the
            # wait for the cell to stop, and the cell's output with it. Only a cut insists.
            return True
        if turn is not None:
            turn.stop_asked = True
        if cut:
            self.session.ending = True
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident), ctypes.py_object(KeyboardInterrupt))
        self.session.executor.interrupt()  # a running cell stops now, not at the next bytecode
        return True

    def _answer(self, text: str, turn: Turn, previous: threading.Thread | None, on_done: Callable[[], None] | None, listener: Listener | None) -> None:
        final: dict[str, Any] | None
        self._turns[threading.get_ident()] = turn
        try:
            if previous is not None:
                previous.join()  # Stop while waiting for it cancels this request too
            rnd = self._asked(text, listener)
        except KeyboardInterrupt:
            final = {"type": "error", "message": f"{CUT_SHORT if self.session.ending else 'Stopped'}. The session and its variables are kept."}
        except TaskWeaverError as exc:
            final = {"type": "error", "message": str(exc)}
        except Exception as exc:  # noqa: BLE001 - the page must hear of it, and the server must go on
            final = {"type": "error", "message": f"Internal error: {type(exc).__name__}: {exc}"}
        else:
            final = None if turn.answered else {"type": "error", "message": f"This request failed: {rnd.error or 'no answer'}"}
        close_thread_loop()  # the kernel client's loop for this thread
        self._turns.pop(threading.get_ident(), None)
        turn.finished = True  # a next request may start: this thread only returns from here
        if final is not None and not turn.answered and on_done is not None:
            on_done()  # no answer, so no folds to wait for: the session is free before the error is out (a retry is not refused)
            on_done = None
        if final is not None:
            turn.put(final)  # an error after the answer (the round's bookkeeping failed) is still said, last
        turn.put(END)
        if on_done is not None:
            on_done()

    def _asked(self, text: str, listener: Listener | None) -> Round:
        """`Session.ask`, with `listener` hearing its events meanwhile."""
        if listener is None:
            return self.session.ask(text)
        self.session.add_listener(listener)
        try:
            return self.session.ask(text)
        finally:
            self.session.remove_listener(listener)

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
        """The answer goes to the page when the terminal would print it: once the store holds it (Session._emit), and the request is marked answered.

        Its thread then waits for the loop to write it, rather than take the interpreter from the
        loop for the round's bookkeeping; a client that stopped reading costs at most that wait.
        Should storing the round's end fail, an error follows the answer, last.
        """
        turn.answered = True
        if self._on_answer is not None:
            # Before the client has the answer: a request it sends the moment the answer arrives must find this
            # one marked answered (on a replica: the lease's mark), and wait for its bookkeeping, not be refused.
            self._on_answer()
        turn.put({"type": "round_ended", "round": event.round.index, "state": "finished", "error": None})
        turn.put({"type": "answer", "text": event.post.message, "round": event.round.index})
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

    def close(self, *, record: bool = True) -> None:
        """Stop what runs and close the session; `record=False` writes nothing more to the store.

        A replica's copy may be older than the store (another replica went on with the session):
        closing it must not write its summaries over newer ones. Each fold saved its own as it landed.
        A request still running is cut short: the server is going away, not the user cancelling.
        """
        self.stop(cut=True)
        if self._worker is not None:
            self._worker.join(10)
        if not record:
            self.session.store = None
        self.session.close()
