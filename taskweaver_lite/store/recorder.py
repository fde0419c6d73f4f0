"""The session listener that writes every event to the store as it happens: `StoreRecorder`."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from taskweaver_lite.errors import StoreError
from taskweaver_lite.records.event_json import event_json
from taskweaver_lite.records.events import CellPrinted, Event, FileLoaded, Folded, ModelCalled, PostAdded, ReplyStreamed, Working
from taskweaver_lite.safety.workfiles import read_below
from taskweaver_lite.store.interface import Store

MAX_KEPT_BYTES = 50 * 1024 * 1024  # an artifact larger than this stays in its session folder only


class StoreRecorder:
    """A session listener that records every event; safe to call from the session's and the fold threads.

    A model call's record is written with the next event (the post its reply became, the repair,
    the fold, the round's end): one transaction instead of two, and a kill -9 in between loses
    only what `kill -9` during the call's own write would have. `flush` writes what is held.

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
        self._held_lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        """Record `event` (the Listener signature)."""
        with self._held_lock:
            if isinstance(event, ModelCalled):
                self._held.append(event)
                held = None
            else:
                held, self._held = self._held, []
        if held is not None:
            try:
                self.store.record(self.session_id, *held, event, shown=self._shown(event))
                if self.store.keeps_files:
                    self._keep_files(event)
                if isinstance(event, Folded) and self._compression_state is not None:
                    state = self._compression_state(event.role)
                    if state is not None:
                        self.store.save_compression(self.session_id, event.role, state)
            except StoreError as exc:
                if threading.get_ident() != self._owner:
                    self._failure = exc
                    return
                raise
        if self._failure is not None and threading.get_ident() == self._owner:
            failure, self._failure = self._failure, None
            raise failure

    def _shown(self, event: Event) -> list[dict[str, Any]]:
        """The event-log entry of `event` (what the events route streams): recorded events the page shows, as it shows them."""
        if isinstance(event, (Working, ReplyStreamed, CellPrinted)):
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
