"""One request at a time per session across every replica: leases in the store, renewed while held.

A request takes the session's lease (a row in the store, timed by the database's clock, so the
replicas' clocks do not matter) before it touches the session, and frees it once its round's
bookkeeping (the background folds) is done. A thread renews every lease this replica holds, all in
one write, each third of `serve.lease_timeout`; a replica that dies stops renewing, and its leases run out within
`serve.lease_timeout` seconds: the next request on any replica takes the session over.

Taking a lease is one statement that exactly one contender wins. The loser is told at once (409)
while the holder still answers; once the holder has answered (it marks that with a second row,
`<id>:answered`, in the answer's own write, before the client has the answer), the loser waits for it to finish its
bookkeeping, up to `serve.lease_wait` seconds, rather than send a person who typed quickly an
error. The holder frees the lease and its mark in one statement; a loser that finds no mark tries
once more before it refuses, since both may have gone between its two reads.

A session whose requests keep coming to this replica keeps its lease between them: an answered
request that is done leaves it lingering (`linger`) for LINGER seconds, still renewed, and the
session's next request here is handed it (`take(..., handover=True)`) without a word to the store:
one holder for both, the store told in the new request's first write, which deletes the answered
mark and any Stop meant for the previous request (`FreedMarks`). Nobody else can have taken the
lease meanwhile: it is handed over only while the store confirmed it within half a term. Once
LINGER has passed with no request, the lease is freed as usual (its folds awaited first); a
contender on another replica meanwhile waits, as for any answered request's bookkeeping.

Stop pressed on another replica reaches this one twice over: at once by NOTIFY (`fanout.py`), and
through the store, as a third row (`<id>:stop`, naming the request it stops) that the renewing
thread reads: a notice lost while the LISTEN connection was being remade, or one that came while
the request was still loading its session, stops it at the next renewal all the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from taskweaver_lite.errors import StoreError
from taskweaver_lite.store.interface import FreedMarks, LeaseMark, Store

ANSWERED = ":answered"
STOP = ":stop"  # a row naming (as its holder) the request that Stop was pressed for
LINGER = 0.3  # seconds an answered request's lease waits for the session's next request on this replica
POLL = 0.01  # seconds between attempts while the holder finishes its bookkeeping (two indexed queries each)
BUSY = "This session is answering another request (perhaps from another tab): wait for it, or press Stop."
_log = logging.getLogger(__name__)


class LeaseBusy(Exception):
    """Another request (here or on another replica) is answering in this session: HTTP 409."""


@dataclass(frozen=True)
class Hold:
    """A lease this replica holds for one request: the session and the holder string it was taken as."""

    session_id: str
    holder: str
    version: int = -1  # the session's newest event id as the lease's last holder freed it (-1: unknown), as `take` found it
    # Handed over from this replica's previous request of the session (the copy here is current): until the store
    # has freed that request's marks (`handed_over`), a Stop row there is the previous request's, not this one's.
    handed: bool = False


@dataclass(frozen=True)
class _Linger:
    """An answered request's lease, kept for the session's next request here until `until` (monotonic); `settle` frees it (folds awaited)."""

    hold: Hold
    settle: Callable[[], object]
    until: float


class Leases:
    """The leases this replica holds, and the thread that renews them."""

    def __init__(
        self,
        store: Store,
        *,
        seconds: float,
        wait: float,
        on_lost: Callable[[str], object] | None = None,
        on_stop: Callable[[str], bool] | None = None,
    ) -> None:
        """`on_lost` hears a session whose lease another took; `on_stop` one whose request Stop was asked for (True once it is stopping)."""
        self.replica = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._store = store
        self._seconds = seconds
        self._wait = wait
        self._on_lost = on_lost
        self._on_stop = on_stop
        self._stopped: set[str] = set()  # holders whose request was told to stop (once is enough)
        self._held: dict[str, Hold] = {}  # by the row's key (a session id, or one with ANSWERED)
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)  # told each time a lease held here has been freed in the store
        self._freeing: dict[str, int] = {}  # sessions whose lease is being freed in the store now (how many times at once)
        self._lingering: dict[str, _Linger] = {}  # answered, done, and kept for the session's next request here
        self._confirmed: dict[str, float] = {}  # session -> monotonic time before the store's last take or renewal of its lease
        self._stopping = threading.Event()
        self._wake = threading.Event()  # the renewing thread looks again now (a first lease lingering, or closing)
        self._renewer = threading.Thread(target=self._renew_loop, name="lease-renew", daemon=True)
        self._renewer.start()

    def take(self, session_id: str, *, handover: bool = False) -> Hold:
        """The session's lease for a new request; LeaseBusy when another request runs it (StoreError when the store is down).

        `handover`: the request writes the session's events (a message), so it may be handed the lease
        the previous request here left lingering (its first write frees that one's marks, `FreedMarks`).
        """
        hold = Hold(session_id, f"{self.replica}/{uuid.uuid4().hex[:8]}")
        deadline = time.monotonic() + self._wait
        handed = self._wait_here(session_id, deadline, handover=handover)
        if handed is not None:
            return handed
        sent = time.monotonic()
        while (taken := self._store.take_lease(session_id, hold.holder, seconds=self._seconds)) is None:
            # No mark: the holder is still answering, or has just let go of the lease and its mark together
            # (one statement) since the attempt above; one more attempt tells which.
            unmarked = self._store.lease(session_id + ANSWERED) is None
            if unmarked and (taken := self._store.take_lease(session_id, hold.holder, seconds=self._seconds)) is not None:
                break
            if unmarked or time.monotonic() > deadline:
                raise LeaseBusy(BUSY)
            time.sleep(POLL)
            sent = time.monotonic()
        hold = dataclasses.replace(hold, version=taken.version)
        with self._lock:
            self._held[session_id] = hold
            self._confirmed[session_id] = sent
        return hold

    def _wait_here(self, session_id: str, deadline: float, *, handover: bool) -> Hold | None:
        """While a request on this replica holds the session's lease: LeaseBusy if it is answering, else wait until it has freed it.

        What the store would say, known here without asking it again and again: the session's next
        request, sent once the answer is in, usually comes to the replica that answered it. A lease
        left lingering is handed to a request that may take it over (`handover`, returned), else freed now.
        """
        with self._lock:
            while True:
                if handover and (handed := self._hand_over(session_id)) is not None:
                    return handed
                linger = self._lingering.pop(session_id, None)
                if linger is not None:
                    self._lock.release()  # its folds awaited, off the lock: then taken as usual
                    try:
                        linger.settle()
                    finally:
                        self._lock.acquire()
                    continue
                held = self._held.get(session_id)
                if held is None and session_id not in self._freeing:
                    return None
                mark = self._held.get(session_id + ANSWERED)
                if held is not None and (mark is None or mark.holder != held.holder):
                    raise LeaseBusy(BUSY)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LeaseBusy(BUSY)
                self._freed.wait(timeout=left)

    def hand_over(self, session_id: str) -> Hold | None:
        """The session's lease, lingering here, for its next request (without waiting or a statement); None when there is none to hand over."""
        with self._lock:
            return self._hand_over(session_id)

    def _hand_over(self, session_id: str) -> Hold | None:
        """`hand_over`; the lock must be held. Only a lease the store confirmed within half a term: nobody else can have it."""
        linger = self._lingering.get(session_id)
        confirmed = self._confirmed.get(session_id)
        if linger is None or confirmed is None or time.monotonic() - confirmed >= self._seconds / 2:
            return None
        del self._lingering[session_id]
        self._held.pop(session_id + ANSWERED, None)
        self._stopped.discard(linger.hold.holder)
        handed = dataclasses.replace(linger.hold, handed=True)
        self._held[session_id] = handed
        return handed

    def handed_over(self, hold: Hold) -> FreedMarks:
        """The rows a handed-over request's first write frees: the previous request's answered mark, and a Stop meant for it."""
        return FreedMarks((hold.session_id + ANSWERED, hold.session_id + STOP), hold.holder)

    def confirm(self, hold: Hold) -> None:
        """The store has freed the previous request's marks (`handed_over`): a Stop row for `hold` is now this request's."""
        with self._lock:
            if self._held.get(hold.session_id) == hold:
                self._held[hold.session_id] = dataclasses.replace(hold, handed=False)

    def linger(self, hold: Hold, settle: Callable[[], object]) -> bool:
        """Keep `hold`'s lease LINGER seconds for the session's next request here, then `settle()` (which frees it); False when not answered.

        A request that did not answer frees its lease at once: a contender would be refused meanwhile.
        """
        with self._lock:
            current, mark = self._held.get(hold.session_id), self._held.get(hold.session_id + ANSWERED)
            if current is None or current.holder != hold.holder or mark is None or mark.holder != hold.holder or self._stopping.is_set():
                return False
            self._lingering[hold.session_id] = _Linger(current, settle, time.monotonic() + LINGER)
            first = len(self._lingering) == 1
            self._freed.notify_all()  # a request here waiting for this one's bookkeeping is handed the lease now
        if first:
            self._wake.set()  # the renewing thread ends lingers too: it looks every third of LINGER while any is left
        return True

    def _end_lingers(self) -> None:
        """Settle, each on a thread of its own (its folds may take a while), the lingering leases no request came for."""
        now = time.monotonic()
        with self._lock:
            ended = [linger for linger in self._lingering.values() if linger.until <= now]
            for linger in ended:
                del self._lingering[linger.hold.session_id]
        for linger in ended:
            threading.Thread(target=linger.settle, name=f"lease-settle-{linger.hold.session_id}", daemon=True).start()

    def answer_mark(self, hold: Hold) -> LeaseMark:
        """The answered mark of `hold`'s request, for the store to take in the answer's own write (`Store.record`'s `mark`)."""
        return LeaseMark(hold.session_id + ANSWERED, hold.holder, self._seconds)

    def answered(self, hold: Hold, *, stored: bool = False) -> None:
        """The request has answered: a contender now waits for the bookkeeping rather than being refused.

        `stored`: the answer's write took the mark already (`answer_mark`); else it is taken here.
        """
        marker = Hold(hold.session_id + ANSWERED, hold.holder)
        with contextlib.suppress(StoreError):  # only a contender's patience depends on it
            if stored or self._mark(marker.session_id, marker.holder):
                with self._lock:
                    self._held[marker.session_id] = marker

    def ask_to_stop(self, session_id: str) -> bool:
        """Mark the session's running request, whichever replica holds it, to be stopped; False when none runs, or its answer is out.

        An answered request holds the lease only for its bookkeeping (the folds), which Stop does not cut short.
        """
        running = self._store.lease(session_id)
        if running is None:
            return False
        answered = self._store.lease(session_id + ANSWERED)
        if answered is not None and answered.holder == running.holder:
            return False
        self._mark(session_id + STOP, running.holder)
        return True

    def _mark(self, key: str, holder: str) -> bool:
        """Take the mark row `key` for `holder`, freeing an earlier request's mark that has not run out yet; False if another took it meanwhile."""
        for _ in range(2):
            if self._store.take_lease(key, holder, seconds=self._seconds) is not None:
                return True
            earlier = self._store.lease(key)
            if earlier is not None:
                self._store.release_lease(key, earlier.holder)
        return False

    def release(self, hold: Hold) -> int | None:
        """Free the lease (and its answered mark); the session's newest event id as it was freed (None: the store is down, the lease runs out instead)."""
        with self._lock:
            self._stopped.discard(hold.holder)
            linger = self._lingering.get(hold.session_id)
            if linger is not None and linger.hold.holder == hold.holder:
                del self._lingering[hold.session_id]
            self._confirmed.pop(hold.session_id, None)
            held = [h for key, h in self._held.items() if h.holder == hold.holder]
            for h in held:
                del self._held[h.session_id]
            self._freeing[hold.session_id] = self._freeing.get(hold.session_id, 0) + 1
        # The lease and its mark in one statement: a contender that finds the lease held and no mark is
        # refused at once, so the mark must never go before the lease.
        marks = [h.session_id.removeprefix(hold.session_id) for h in held if h.session_id != hold.session_id]
        if any(h.handed for h in held):  # the previous request's marks, which its first write did not get to free
            marks = sorted({*marks, ANSWERED, STOP})
        try:
            return self._store.release_lease(hold.session_id, hold.holder, marks=marks)
        except StoreError:
            _log.warning("could not free the lease of session %s (the store is unreachable); it runs out by itself", hold.session_id)
            return None
        finally:
            with self._lock:
                left = self._freeing.pop(hold.session_id) - 1
                if left:
                    self._freeing[hold.session_id] = left
                self._freed.notify_all()

    def held(self) -> list[Hold]:
        """The leases held now (for a replica stopping: what it still runs)."""
        with self._lock:
            return [hold for key, hold in self._held.items() if not key.endswith(ANSWERED)]

    def close(self) -> None:
        """Stop renewing and free what is still held."""
        self._stopping.set()
        self._wake.set()
        for hold in self.held():
            self.release(hold)

    def _renew_loop(self) -> None:
        renewal = time.monotonic() + self._seconds / 3
        while not self._stopping.is_set():
            left = renewal - time.monotonic()
            self._wake.wait(min(left, LINGER / 3) if self._lingering else left)
            self._wake.clear()
            if self._stopping.is_set():
                return
            self._end_lingers()
            if time.monotonic() >= renewal:
                renewal = time.monotonic() + self._seconds / 3
                with self._lock:
                    held = list(self._held.values())
                if held:
                    self._renew(*held)

    def _renew(self, *holds: Hold) -> None:
        """Renew `holds` (leases and their marks) in one write, reading the Stop rows of the requests that may be stopped."""
        watched = [hold for hold in holds if self._may_stop(hold)]
        sent = time.monotonic()
        try:
            renewed, found = self._store.renew_leases(
                [(hold.session_id, hold.holder) for hold in holds], seconds=self._seconds, read=[hold.session_id + STOP for hold in watched]
            )
        except StoreError:
            return  # the store is down: renewed again once it is back (if it stays down past the lease, another may take it)
        for hold in holds:
            if hold.session_id in renewed:
                if not hold.session_id.endswith(ANSWERED):
                    with self._lock:
                        if (current := self._held.get(hold.session_id)) is not None and current.holder == hold.holder:
                            self._confirmed[hold.session_id] = sent
            else:
                self._lose(hold)
        for hold in watched:
            if found.get(hold.session_id + STOP) == hold.holder and hold.session_id in renewed and self._on_stop is not None and self._on_stop(hold.session_id):
                with self._lock:
                    if self._held.get(hold.session_id) == hold:
                        self._stopped.add(hold.holder)

    def _lose(self, hold: Hold) -> None:
        """`hold` was not renewed: unless freed meanwhile, another has it (or it is gone with its session)."""
        with self._lock:
            # Released meanwhile (and perhaps taken again by the session's next request): not lost, and not ours to drop.
            lost = self._held.get(hold.session_id) == hold
            if lost:
                del self._held[hold.session_id]
                self._confirmed.pop(hold.session_id, None)
                self._lingering.pop(hold.session_id, None)
        if lost and self._on_lost is not None and not hold.session_id.endswith(ANSWERED):
            self._on_lost(hold.session_id)

    def _may_stop(self, hold: Hold) -> bool:
        """Whether Stop may still be asked for `hold`'s request in the store: running, not stopping yet, and the store's Stop row its own."""
        return (
            self._on_stop is not None
            and not hold.session_id.endswith(ANSWERED)
            and hold.holder not in self._stopped
            and not hold.handed
            and hold.session_id not in self._lingering
        )
