"""The session listener that writes every event to the store as it happens: `StoreRecorder`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from taskweaver_lite.errors import StoreError
from taskweaver_lite.records.event_json import event_json
from taskweaver_lite.records.events import CellPrinted, Event, FileLoaded, Folded, ModelCalled, PostAdded, ReplyStreamed, RoundEnded, Working
from taskweaver_lite.safety.workfiles import read_below
from taskweaver_lite.store.interface import FreedMarks, LeaseMark, Store

MAX_KEPT_BYTES = 50 * 1024 * 1024  # an artifact larger than this stays in its session folder only
HOLD_AT_MOST = 1.0  # seconds a model call's record waits for the next recorded event, once progress is heard
PROGRESS = (Working, ReplyStreamed, CellPrinted)  # shown as they happen, never recorded


class StoreRecorder:
    """A session listener that records every event; safe to call from the session's and the fold threads.

    Each write is one transaction (on PostgreSQL, with one notice to the other replicas), and an
    event is written before anything shows it, so a request's events are written in as few as
    that allows:
    - A model call's record is written with the next event (the post its reply became, the repair,
      the fold, the round's end): a kill -9 in between loses only what `kill -9` during the call's
      own write would have. Progress (a cell starting, printing) is not such an event: a held call
      waits for the cell's result, unless it has waited HOLD_AT_MOST seconds already (a long cell
      that prints). `flush` writes what is held.
    - Events shown together are written together (`record(*events)`: a round's start and its request).
    - The answer ends its round in the store: its write also logs the round's end, and the
      `RoundEnded` that follows for that round writes nothing more.
    - A fold's new compression state is saved in the write of its `Folded` event.
    - A lease row to take as the answer is stored (`mark_answer`: the lease's answered mark on a
      replica) goes in the answer's write, not in a statement of its own; so do lease rows to free
      (`free_marks`: a request handed the lease drops the previous request's marks) in the next write.

    `compression_state(role)` returns that role's CompressionState.to_dict(); with it, each fold also
    saves the role's new state. A store failure in a background thread is raised again on the next
    event from the thread that made the recorder, so the session learns its record is incomplete.

    A store that `keeps_files` (PostgreSQL) also gets the bytes of each cell's artifacts and of each
    loaded file (from `working_dir`), read link-safe, so that any server can serve and export them.
    """

    def __init__(
        self,
        store: Store,
        session_id: str,
        *,
        compression_state: Callable[[str], dict[str, Any] | None] | None = None,
        working_dir: Path | None = None,
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.working_dir = working_dir
        self._compression_state = compression_state
        self._owner = threading.get_ident()
        self._failure: StoreError | None = None
        self._held: list[ModelCalled] = []
        self._held_since = 0.0  # monotonic time the oldest held call was held
        self._held_lock = threading.Lock()
        self._ended_by_answer: str | None = None  # the round whose answer's write also ended it
        self._answer_mark: LeaseMark | None = None  # taken in the next answer's write
        self._marked: LeaseMark | None = None  # the mark the last answer's write took
        self._unmark: tuple[FreedMarks, Callable[[], None]] | None = None  # freed in the next write, then told
        self.newest = 0  # the id of the newest event-log entry written here (0: none yet)

    def __call__(self, event: Event) -> None:
        """Record `event` (the Listener signature)."""
        self.record(event)

    def record(self, *events: Event) -> None:
        """Record `events` in one write (with the model calls held until now), unless they are only model calls and progress (the calls held)."""
        with self._held_lock:
            calls = [event for event in events if isinstance(event, ModelCalled)]
            if calls and not self._held:
                self._held_since = time.monotonic()
            if all(isinstance(event, (ModelCalled, *PROGRESS)) for event in events) and not (
                self._held and not calls and time.monotonic() - self._held_since >= HOLD_AT_MOST
            ):
                self._held.extend(calls)  # nothing to record but calls: they wait for the next event
                held = None
            else:
                held, self._held = self._held, []
        if held is not None:
            try:
                self._write([*held, *(event for event in events if not self._already_ended(event))])
            except StoreError as exc:
                if threading.get_ident() != self._owner:
                    self._failure = exc
                    return
                raise
        if self._failure is not None and threading.get_ident() == self._owner:
            failure, self._failure = self._failure, None
            raise failure

    def _write(self, events: list[Event]) -> None:
        shown = [entry for event in events for entry in self._shown(event)]
        answer = next((e for e in events if isinstance(e, PostAdded) and e.post.is_answer), None)
        if answer is not None:  # the answer ends its round in the store: its end is logged with it, as the page is told
            shown.append({"type": "round_ended", "round": answer.round.index, "state": "finished", "error": None})
        states: dict[str, dict[str, Any]] = {}
        for fold in (event for event in events if isinstance(event, Folded)):
            state = self._compression_state(fold.role) if self._compression_state is not None else None
            if state is not None:
                states[fold.role] = state
        mark = self._answer_mark if answer is not None else None
        unmark = self._unmark if shown else None  # with entries for the log: a write that surely happens
        if events or shown:
            ids = self.store.record(self.session_id, *events, shown=shown, compression=states, mark=mark, unmark=unmark[0] if unmark else None)
            self.newest = max([self.newest, *ids])
            if unmark is not None and self._unmark is unmark:
                self._unmark = None
                unmark[1]()
        if answer is not None:
            self._ended_by_answer = answer.round.id
            self._answer_mark, self._marked = None, mark
        if self.store.keeps_files:
            for event in events:
                self._keep_files(event)

    def mark_answer(self, mark: LeaseMark | None) -> None:
        """Take the lease row `mark` in the next answer's write (None: no row); what an earlier answer took is forgotten."""
        self._answer_mark, self._marked = mark, None

    def free_marks(self, marks: FreedMarks, then: Callable[[], None]) -> None:
        """Delete the lease rows `marks` in the next write that writes anything (`then` is told once it has)."""
        self._unmark = (marks, then)

    def marked(self, mark: LeaseMark) -> bool:
        """Whether the last answer's write took `mark`."""
        return self._marked == mark

    def _already_ended(self, event: Event) -> bool:
        """A round's end that its answer's write already stored and logged."""
        return isinstance(event, RoundEnded) and event.round.id == self._ended_by_answer and event.round.state == "finished"

    def _shown(self, event: Event) -> list[dict[str, Any]]:
        """The event-log entry of `event` (what the events route streams): recorded events the page shows, as it shows them."""
        if isinstance(event, PROGRESS):
            return []  # progress only: not recorded
        shown = event_json(event, session_id=self.session_id)
        return [shown] if shown is not None else []

    def _keep_files(self, event: Event) -> None:
        """The bytes of a cell's artifacts, or of a loaded file, into the store (a file gone or too large is left out)."""
        if isinstance(event, PostAdded) and event.post.execution is not None:
            wanted = [("artifact", Path(path)) for path in event.post.execution.artifacts]
        elif isinstance(event, FileLoaded) and self.working_dir is not None:
            # A kernel on a gateway got the file in its own folder, not in the local one: its source is read then.
            wanted = [("upload", self.working_dir / event.name), ("upload", Path(event.source))]
        else:
            return
        kept: set[tuple[str, str]] = set()
        for kind, path in wanted:
            name = event.name if isinstance(event, FileLoaded) else path.name
            if (kind, name) in kept:
                continue
            try:
                data = read_below(path.parent, path.name, max_bytes=MAX_KEPT_BYTES)
            except OSError:
                continue  # gone, a link, a folder, too large: the record names it; its bytes are not kept
            self.store.put_file(self.session_id, "artifact" if kind == "artifact" else "upload", name, data)
            kept.add((kind, name))

    def flush(self) -> None:
        """Write the model-call records still held (the session is closing)."""
        with self._held_lock:
            held, self._held = self._held, []
        self.store.record(self.session_id, *held)
