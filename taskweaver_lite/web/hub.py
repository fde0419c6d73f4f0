"""The server's sessions, by id: opened here (one process alone), or any stored one on a replica.

One process alone: a session is opened or resumed here and stays until the server stops, its
kernel and its store claim with it. As a replica (`replica.py`), any request may name any stored
session: it takes the session's lease, uses this server's copy if the store has nothing newer,
else loads it, and frees the lease once its round's bookkeeping is done, or hands it to the
session's next request here if that comes within moments (leases.py's LINGER). Each session's requests
run on a worker thread of its `LiveSession` (`live.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import gc
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from taskweaver_lite.config.settings import Config
from taskweaver_lite.errors import SessionBusyError, SessionLimitReached, StoreError, TaskWeaverError, UnknownSessionError
from taskweaver_lite.kernel.executor import close_thread_loop
from taskweaver_lite.records.events import CellPrinted, Event, Listener, ModelCalled, ReplyStreamed, Working
from taskweaver_lite.session.assembly import delete_session, new_session_id
from taskweaver_lite.session.workspace import Workspace
from taskweaver_lite.store.interface import Notices, Store
from taskweaver_lite.store.sql import SESSION_ID
from taskweaver_lite.web.fanout import Fanout
from taskweaver_lite.web.leases import Hold, LeaseBusy, Leases
from taskweaver_lite.web.live import Busy, LiveSession, Turn
from taskweaver_lite.web.metrics import Metrics
from taskweaver_lite.web.replica import Replica

_log = logging.getLogger(__name__)
IDLE_BEFORE_EVICTION = 10.0  # seconds a copy must have gone unused before a replica lets it go for room


class NotOpen(Exception):
    """The session is not open in this one-process server (it must be resumed first): HTTP 404."""


class Stopping(Exception):
    """This replica is shutting down and takes no new requests (another replica will): HTTP 503."""


class AtLimit(Exception):
    """The user already has as many sessions as serve.max_sessions_per_user allows: HTTP 429."""


@dataclass(frozen=True)
class ServerParts:
    """What the server's sessions share: the workspace (its one store, roles and plugins), the metrics, the event fan-out, and on replicas the leases."""

    workspace: Workspace
    metrics: Metrics
    fanout: Fanout
    replica: Replica | None = None  # this server is one of several (a PostgreSQL store, kernels on a gateway)
    leases: Leases | None = None

    @property
    def store(self) -> Store:
        """The workspace's store, which every session here shares."""
        return self.workspace.store


class Hub:
    """Every session this server holds, by id (see the module docstring)."""

    def __init__(self, config: Config, parts: ServerParts, *, preload: Sequence[Path] = ()) -> None:
        self.config = config
        self.parts = parts
        self._preload = tuple(preload)  # files loaded into every new session (`serve --demo`: the sample data)
        self._open: dict[str, LiveSession] = {}
        self._lock = threading.Lock()
        self._starting = 0  # requests past the door but not yet answering: their lease taken, the session or its kernel starting
        self.stopping = False  # SIGTERM: no new requests; running ones finish
        self._closing = threading.Event()

    def join_replicas(self, notices: Notices) -> None:
        """Serve as one replica of several on the shared store: leases on sessions, events and Stop heard from the others (`notices`)."""
        replica = Replica(self.parts.workspace, metrics=self.parts.metrics)
        serve = self.config.serve
        leases = Leases(self.parts.store, seconds=serve.lease_timeout, wait=serve.lease_wait, on_lost=self.cut_here, on_stop=self.stop_here)
        self.parts = dataclasses.replace(self.parts, replica=replica, leases=leases)
        self.parts.fanout.listen(notices, on_stop=self.stop_here)
        self._sweeper = threading.Thread(target=self._sweep, name="hot-sessions", daemon=True)
        self._sweeper.start()

    def _sweep(self) -> None:
        """Every few seconds: let go of copies unused for serve.hot_session_idle, and of those past serve.hot_sessions."""
        idle = self.config.serve.hot_session_idle
        while not self._closing.wait(min(max(idle / 4, 1.0), 30.0)):
            try:
                self._let_go_of_the_oldest(unused_for=idle)
            except Exception as exc:  # noqa: BLE001 - the sweep must go on; the next one tries again
                _log.warning("could not let go of idle sessions: %s", " ".join(str(exc).split()))

    def stop_taking(self) -> None:
        """SIGTERM: refuse new requests (503: the load balancer sends them to another replica) and end the event streams."""
        self.stopping = True
        self.parts.fanout.wake_all()

    @property
    def replica(self) -> Replica | None:
        """This server's replica part (None: one process alone)."""
        return self.parts.replica

    def new(self, *, owner: str | None = None) -> str:
        """A new stored session owned by `owner`; its id.

        Its kernel starts in the background (on a replica: at its first request). Past
        serve.max_sessions_per_user, counted at making under the owner's lock in the store, the
        owner's newest session never asked anything is handed back instead, else AtLimit.
        """
        self._refuse_when_stopping()
        limit = self.config.serve.max_sessions_per_user if owner is not None else None
        session_id = new_session_id()
        executor = self.replica.executor(session_id, owner=owner) if self.replica is not None else None
        try:
            session = self.parts.workspace.new_session(session_id=session_id, executor=executor, owner=owner, claim=self.replica is None, limit=limit)
        except SessionLimitReached as exc:
            if exc.unused is None:
                raise _at_limit(exc.count, exc.limit) from None
            return exc.unused if self.replica is not None else self.resume(exc.unused, owner=owner)
        for path in self._preload:
            session.load_file(path)
        return self._keep(LiveSession(session)).id

    def resume(self, session_id: str, *, owner: str | None = None) -> str:
        """A stored session made ready here (alone: re-opened, its cells replayed); Busy when it is open in another process."""
        self._refuse_when_stopping()
        if self.replica is not None:
            return self.parts.store.resolve(session_id, owner=owner)  # loaded by its next request, on whichever replica
        with self._lock:
            if session_id in self._open:
                return session_id
        try:
            # The replay runs cells from this thread.
            session, _ = self.parts.workspace.resume_session(session_id, owner=owner)
        except SessionBusyError as exc:
            raise Busy(str(exc)) from None
        finally:
            close_thread_loop()
        return self._keep(LiveSession(session)).id

    def open_ids(self) -> list[str]:
        """The sessions this server holds open now (their kernels run here, or are held on the gateway for them)."""
        with self._lock:
            return list(self._open)

    def get(self, session_id: str) -> LiveSession | None:
        """This server's copy of the session, if it holds one (as a replica: perhaps stale)."""
        with self._lock:
            return self._open.get(session_id)

    def ask(self, session_id: str, text: str, *, loop: asyncio.AbstractEventLoop, listener: Callable[[LiveSession], Listener] | None = None) -> Turn:
        """Start answering `text` in the session, its events read on `loop` (a replica: call from a thread); Busy, NotOpen, Stopping.

        `listener(live)`, when given, makes a listener that hears the session's events while this request's turn runs.
        """
        self._refuse_when_stopping()
        started = time.monotonic()
        leases = self.parts.leases
        if leases is None:
            live = self._open_here(session_id)
            since = self.parts.store.last_event_id(session_id)
            heard = listener(live) if listener is not None else None
            turn = live.ask(text, loop=loop, on_answer=functools.partial(self._answered, started, None, None), listener=heard)
            turn.since = since
            return turn
        with self._lock:
            self._starting += 1  # counted as running from here: a SIGTERM meanwhile waits for it, as for a request answering
        try:
            hold = self._take(leases, session_id, handover=True)
            return self._ask_holding(leases, hold, text, loop=loop, listener=listener, started=started)
        finally:
            with self._lock:
                self._starting -= 1

    def ask_at_once(
        self, session_id: str, text: str, *, loop: asyncio.AbstractEventLoop, listener: Callable[[LiveSession], Listener] | None = None
    ) -> Turn | None:
        """`ask` on a replica, from the loop's own thread, when it waits for nothing: None when it would (then call `ask` from a thread).

        It waits for nothing when the session's previous request here left its lease lingering
        (handed over without a statement) and the copy's kernel is known to be there without asking the gateway.
        """
        leases, live = self.parts.leases, self.get(session_id)
        if leases is None or self.stopping or live is None or live.busy or live.version < 0 or not live.session.executor.known_there():
            return None
        hold = leases.hand_over(session_id)
        if hold is None:
            return None
        return self._ask_holding(leases, hold, text, loop=loop, listener=listener, started=time.monotonic())

    def _ask_holding(
        self, leases: Leases, hold: Hold, text: str, *, loop: asyncio.AbstractEventLoop, listener: Callable[[LiveSession], Listener] | None, started: float
    ) -> Turn:
        """`ask`, once the session's lease is held (its lease freed if the request cannot start)."""
        try:
            live, kept = self._current(hold.session_id, hold)
            if hold.handed:  # the previous request's marks go in this one's first write
                live.session.free_lease_marks(leases.handed_over(hold), functools.partial(leases.confirm, hold))
                self.parts.metrics.lease_handovers.inc()
            live.session.executor.start()  # a new session's kernel, at its first request: refused here (429, 503), not in the round
            live.last_used = time.monotonic()
            heard = listener(live) if listener is not None else None
            mark = leases.answer_mark(hold)
            live.session.mark_answer(mark)  # the lease's answered mark goes in the answer's own write
            answered = functools.partial(self._answered, started, hold, lambda: live.session.answer_marked(mark))
            done = functools.partial(self._done, live, hold, kept)
            turn = live.ask(text, loop=loop, on_answer=answered, on_done=done, listener=heard)
            turn.since = live.version
            return turn
        except BaseException:
            leases.release(hold)
            raise

    def _answered(self, started: float, hold: Hold | None, marked: Callable[[], bool] | None) -> None:
        """A request's answer is stored and on its way: its time counted; on a replica, a contender may now wait for the lease.

        `marked`: whether the answer's write took the lease's answered mark (else it is taken now).
        """
        self.parts.metrics.answers.observe(time.monotonic() - started)
        if hold is not None and self.parts.leases is not None:
            self.parts.leases.answered(hold, stored=marked is not None and marked())

    def _done(self, live: LiveSession, hold: Hold, kept: bool) -> None:
        """A request's thread is done: its lease lingers for the session's next request here if the session stays here, else is freed.

        `kept`: the request found this replica's copy current (the session's last request was answered here).
        """
        assert self.parts.leases is not None
        if not (kept and self.parts.leases.linger(hold, functools.partial(self._finish, live, hold))):
            self._finish(live, hold)

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
            live, _ = self._current(session_id, hold)
            live.last_used = time.monotonic()
            if live.busy:
                raise Busy("This session is answering a request: try again when it is done.")
            yield live
        finally:
            self._finish(self.get(session_id), hold)

    def delete(self, session_id: str, *, owner: str | None = None) -> None:
        """Delete the stored session for good (assembly.delete_session), its copy here first; Busy while a request runs in it."""
        self._refuse_when_stopping()
        leases = self.parts.leases
        hold = self._take(leases, session_id) if leases is not None else None
        try:
            live = self.get(session_id)
            if live is not None:
                if live.busy:
                    raise Busy("This session is answering a request: wait for it or press Stop, then delete it.")
                self._drop(live)  # alone: its kernel ends and its claim goes; on a replica the kernel is ended below
            delete_session(self.config, session_id, store=self.parts.store, owner=owner, claim=hold is None)
        except SessionBusyError as exc:
            raise Busy(str(exc)) from None
        finally:
            if hold is not None and leases is not None:
                leases.release(hold)  # its row went with the session: nothing is left to free but this replica's note of it

    def release(self, session_id: str) -> bool:
        """Let go of the session held here (it stays stored): alone, its kernel ends and its claim goes; a replica drops its copy.

        False when none is held here; Busy while it answers.
        """
        live = self.get(session_id)
        if live is None:
            return False
        if live.busy:
            raise Busy("This session is answering a request: close it once the answer is in.")
        with self._lock:
            if self._open.get(session_id) is live:
                del self._open[session_id]
            self.parts.metrics.open_sessions.set(len(self._open))
        live.close(record=self.replica is None)  # a replica's copy may be older than the store
        return True

    def forget_if_deleted(self, session_id: str) -> None:
        """A replica's copy of a session the store no longer has (deleted on another replica) goes, with its folder here."""
        live = self.get(session_id)
        if self.replica is None or live is None or live.busy:
            return
        try:
            self.parts.store.owner_of(session_id)  # still there (only not the caller's): the copy stays
        except UnknownSessionError:
            self._drop(live)
            shutil.rmtree(self.config.sessions_dir / session_id, ignore_errors=True)

    def stop(self, session_id: str) -> bool:
        """Cancel the session's running request, here or on the replica running it (a NOTIFY, and a mark in the store)."""
        live = self.get(session_id)
        if live is not None and live.stop():
            return True
        if self.parts.leases is None:
            return False
        running = self.parts.leases.ask_to_stop(session_id)  # read by the holder's next renewal, should the notice miss it
        if running:
            self.parts.fanout.send_stop(session_id)
        return running

    def stop_here(self, session_id: str) -> bool:
        """Another replica asked for the session's request to stop: stop it if it runs here (True then)."""
        live = self.get(session_id)
        return live is not None and live.stop()

    def cut_here(self, session_id: str) -> None:
        """The session's lease was lost (another replica may take it over): its request here is cut short, marked cut off."""
        live = self.get(session_id)
        if live is not None:
            live.stop(cut=True)

    def cut_running(self) -> int:
        """The drain timeout passed: cut short every request still running here (marked cut off); how many were."""
        with self._lock:
            running = [live for live in self._open.values() if live.busy]
        cut = 0
        for live in running:
            try:
                cut += live.stop(cut=True)
            except TaskWeaverError as exc:  # its kernel gone from the gateway, say: the others are cut all the same
                _log.warning("session %s: could not cut its request short (%s)", live.id, exc)
        return cut

    def upload_dir(self, live: LiveSession) -> Path:
        """Where an upload is received before `/load` copies it into the working folder."""
        folder = self.config.sessions_dir / live.id / "uploads"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def running(self) -> int:
        """Requests being answered here now, and those still taking their lease or starting their session's kernel."""
        with self._lock:
            return self._starting + sum(live.busy for live in self._open.values())

    def close(self) -> None:
        """Close every session held here (on a replica their kernels stay on the gateway) and free what is still leased."""
        self._closing.set()
        with self._lock:
            sessions, self._open = list(self._open.values()), {}
        for live in sessions:
            live.close(record=self.replica is None)  # a replica's copies may be older than the store
        self.parts.metrics.open_sessions.set(0)
        if self.parts.leases is not None:
            self.parts.leases.close()
        close_thread_loop()

    def _user_name(self, owner: str | None) -> str | None:
        """The name of the user whose id `owner` is, for the metrics (a session belongs to an id; an operator reads names); the id once they are gone."""
        if owner is None:
            return None
        try:
            return next((user.name for user in self.parts.store.users() if user.id == owner), owner)
        except StoreError:
            return owner

    def _refuse_when_stopping(self) -> None:
        if self.stopping:
            raise Stopping("This server is stopping: send the request again (another replica takes it).")

    def _open_here(self, session_id: str) -> LiveSession:
        live = self.get(session_id)
        if live is None:
            raise NotOpen("This session is not open in this server: resume it first (POST .../resume).")
        return live

    def _take(self, leases: Leases, session_id: str, *, handover: bool = False) -> Hold:
        try:
            return leases.take(session_id, handover=handover)
        except LeaseBusy as exc:
            raise Busy(str(exc)) from None

    def _current(self, session_id: str, hold: Hold) -> tuple[LiveSession, bool]:
        """This server's copy if the store has nothing newer, or that copy brought up to date; else the session loaded afresh (under the caller's lease).

        With it, whether the copy was current as it was: the session's last request was answered here.
        """
        assert self.replica is not None
        live = self.get(session_id)
        # version -1: the copy's folds were abandoned or its record is unknown; only a load makes it whole.
        if live is not None and not live.busy and live.version >= 0 and hold.handed and live.session.executor.still_there():
            # The lease never left this replica since the copy's last request: nothing is newer than what it wrote.
            live.version = max(live.version, live.session.newest_event)
            live.last_used = time.monotonic()
            return live, True
        # The session's newest event id as the lease was taken (-1: unknown, read below; a lease handed over carries its first take's).
        newest = -1 if hold.handed else hold.version
        if live is not None and not live.busy and live.version >= 0:
            # A copy whose kernel went from the gateway (culled, ended for room, the gateway restarted) is loaded
            # again below, its variables rebuilt by replay; a gateway that does not answer is the request's 503.
            if newest < 0:  # the lease ran out rather than being freed, or is the session's first
                newest = self.parts.store.last_event_id(session_id)  # nobody else writes while the lease is held
            if newest == live.version and live.session.executor.still_there():
                live.last_used = time.monotonic()
                return live, True
            try:
                refreshed = self.replica.refresh(live.session)
            except UnknownSessionError:
                self.forget_if_deleted(session_id)
                raise
            if refreshed:
                live.last_used = time.monotonic()
                live.version = newest
                return live, False
        if live is not None:
            self._drop(live)
        try:
            session = self.replica.load(session_id)  # the metrics' listener is added by _keep (twice would count every call twice)
        except UnknownSessionError:
            if SESSION_ID.match(session_id):  # deleted on another replica: what this one kept of it goes too
                shutil.rmtree(self.config.sessions_dir / session_id, ignore_errors=True)
            raise
        close_thread_loop()  # the replay (if the kernel had to be started afresh) ran cells from this thread
        live = self._keep(LiveSession(session))
        live.version = self.parts.store.last_event_id(session_id)
        return live, False

    def _finish(self, live: LiveSession | None, hold: Hold) -> None:
        """A request is done: its folds awaited (serve.lease_wait in all), the copy's version noted, the lease freed.

        A fold still running then is abandoned before the lease goes: its result, landing after
        another replica went on with the session, would write an older summary over a newer one.
        """
        assert self.replica is not None and self.parts.leases is not None
        whole = False
        try:
            if live is not None:
                deadline = time.monotonic() + self.config.serve.lease_wait  # what a contender waits for the lease, at most
                contexts = live.session.contexts().values()
                whole = all(context.wait_idle(timeout=max(deadline - time.monotonic(), 0.0)) for context in contexts)
                if not whole:
                    for context in contexts:
                        context.close()  # its fold's result is dropped when it returns
        finally:
            if live is not None:
                live.session.mark_answer(None)  # a request that ended without an answer leaves no mark to a later write
            # The copy is current with the store's newest event as the lease goes (read in the same statement):
            # everything since the lease was taken, this copy wrote. A copy without its folds, or a version
            # unknown (the store down), is -1: the next request here loads the session again.
            newest = self.parts.leases.release(hold)
            if live is not None:
                live.version = newest if whole and newest is not None else -1

    def _keep(self, live: LiveSession) -> LiveSession:
        live.session.add_listener(self.parts.metrics.listener(self._user_name(live.session.owner)))
        if self.replica is None:
            live.session.add_listener(_waking(self.parts.fanout, live.id))
        _settle()
        with self._lock:
            self._open[live.id] = live
            self.parts.metrics.open_sessions.set(len(self._open))
        if self.replica is not None:
            self._let_go_of_the_oldest()
        return live

    def _let_go_of_the_oldest(self, *, unused_for: float | None = None) -> None:
        """A replica holds at most serve.hot_sessions copies, and (`unused_for`) none unused that long: the least recently used idle ones go.

        Their kernels stay on the gateway, their connection to them closed: the gateway may cull
        them (gateway.cull_idle_timeout) or end them to make room for their user's next one.
        """
        now = time.monotonic()
        with self._lock:
            settled = now - IDLE_BEFORE_EVICTION  # not one a request has just picked up
            idle = sorted((live for live in self._open.values() if not live.busy and live.last_used < settled), key=lambda live: live.last_used)
            surplus = idle[: max(len(self._open) - self.config.serve.hot_sessions, 0)]
            if unused_for is not None:
                surplus += [live for live in idle[len(surplus) :] if live.last_used < now - unused_for]
        for live in surplus:
            self._drop(live)

    def _drop(self, live: LiveSession) -> None:
        """Let go of a stale copy (its kernel stays on the gateway for the fresh one)."""
        with self._lock:
            if self._open.get(live.id) is live:
                del self._open[live.id]
            self.parts.metrics.open_sessions.set(len(self._open))
        live.close(record=False)


def _at_limit(count: int, limit: int) -> AtLimit:
    return AtLimit(
        f"You have {count} sessions, the most serve.max_sessions_per_user ({limit}) allows here: "
        "continue one of them, or ask an administrator to raise the setting."
    )


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
