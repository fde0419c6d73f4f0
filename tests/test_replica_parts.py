"""The replicas' parts on their own: leases between two replicas, the setup a replica refuses, what /metrics counts.

The whole service (real replicas, PostgreSQL, a kernel gateway) is tests/test_team.py; these run on
the SQLite store, whose leases are the same statements as PostgreSQL's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from helpers import make_project

from taskweaver_lite.config.file import load_config
from taskweaver_lite.errors import ConfigError, StoreError
from taskweaver_lite.records.conversation import Post, Round
from taskweaver_lite.records.events import Folded, ModelCalled, PostAdded, RoundStarted
from taskweaver_lite.store.database import SessionStore
from taskweaver_lite.store.interface import Lease
from taskweaver_lite.store.recorder import StoreRecorder
from taskweaver_lite.web import leases as leases_module
from taskweaver_lite.web.leases import Hold, LeaseBusy, Leases
from taskweaver_lite.web.metrics import Metrics
from taskweaver_lite.web.replica import check_replica_setup

pytestmark = pytest.mark.unit


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SessionStore]:
    opened = SessionStore(tmp_path / "sessions.db")
    opened.create_session("s1", started=time.time())
    yield opened
    opened.close()


def test_one_request_at_a_time_across_replicas_and_the_next_waits_only_for_an_answered_one(store: SessionStore) -> None:
    # A patience far above what a refusal takes even on a loaded machine: a request that waited for it, rather than being
    # refused at once, shows; and the wait for the answered request's release below never runs out before the release.
    patience = 30.0
    first, second = Leases(store, seconds=5, wait=patience), Leases(store, seconds=5, wait=patience)
    try:
        hold = first.take("s1")
        started = time.monotonic()
        with pytest.raises(LeaseBusy):
            second.take("s1")
        assert time.monotonic() - started < patience / 3, "while the holder still answers, another request is refused at once"
        first.answered(hold)
        letting_go = threading.Event()

        def release() -> None:
            letting_go.set()
            first.release(hold)

        threading.Timer(0.5, release).start()
        taken = second.take("s1")  # waits for the answered request's bookkeeping, then runs
        assert letting_go.is_set() and store.lease("s1") is not None, "taken once the answered request let go, not before"
        second.release(taken)
        assert store.lease("s1") is None and store.lease("s1:answered") is None
    finally:
        first.close()
        second.close()


def test_a_replica_that_stops_renewing_loses_its_session_once_the_lease_runs_out(store: SessionStore) -> None:
    dead, alive = Leases(store, seconds=0.6, wait=0), Leases(store, seconds=0.6, wait=0)
    try:
        dead.take("s1")
        dead._stopping.set()  # as kill -9 does: no renewal, nothing released
        with pytest.raises(LeaseBusy):
            alive.take("s1")
        time.sleep(0.9)
        assert alive.take("s1").session_id == "s1"
    finally:
        alive.close()


def test_a_held_lease_is_renewed_past_its_first_term(store: SessionStore) -> None:
    holder, other = Leases(store, seconds=0.6, wait=0), Leases(store, seconds=0.6, wait=0)
    try:
        holder.take("s1")
        time.sleep(1.0)  # past the first term and most of a second (renewed every 0.2 s)
        with pytest.raises(LeaseBusy):
            other.take("s1")
    finally:
        holder.close()
        other.close()


def test_a_postgresql_store_with_local_kernels_is_refused_in_one_line_naming_the_gateway(tmp_path: Path) -> None:
    project = make_project(tmp_path, "http://127.0.0.1:9/v1", store={"url": "postgresql://tw@db.internal/tw"})
    with pytest.raises(ConfigError) as refused:
        check_replica_setup(load_config(project))
    assert "execution.kernel_gateway" in str(refused.value) and "\n" not in str(refused.value)
    single = make_project(tmp_path / "single", "http://127.0.0.1:9/v1", store={"url": "postgresql://tw@db.internal/tw"}, serve={"single_replica": True})
    check_replica_setup(load_config(single))  # one server on that store: local kernels are fine
    check_replica_setup(load_config(make_project(tmp_path / "sqlite", "http://127.0.0.1:9/v1")))


def test_metrics_count_tokens_cached_and_not_by_role_and_folds() -> None:
    metrics = Metrics()
    metrics.observe(ModelCalled("planner", prompt_tokens=1000, completion_tokens=50, latency=0.1, ok=True, cached_tokens=800))
    metrics.observe(ModelCalled("compression_planner", prompt_tokens=300, completion_tokens=40, latency=0.1, ok=False))
    metrics.observe(Folded(role="planner", first_round=1, last_round=2, tokens_before=900, tokens_after=100, ok=True))
    text = metrics.render().decode()
    assert 'taskweaver_prompt_tokens_total{cache="cached",role="planner"} 800.0' in text
    assert 'taskweaver_prompt_tokens_total{cache="uncached",role="planner"} 200.0' in text
    assert 'taskweaver_model_calls_total{ok="false",role="planner (fold)"} 1.0' in text
    assert 'taskweaver_folds_total{ok="true",role="planner"} 1.0' in text


def test_renewing_a_request_that_just_ended_does_not_stop_the_next_one(store: SessionStore) -> None:
    lost: list[str] = []
    leases = Leases(store, seconds=5, wait=0, on_lost=lost.append)
    try:
        ended = leases.take("s1")
        leases.release(ended)
        running = leases.take("s1")
        leases._renew(ended)  # the renewal thread copied the held leases just before the first request ended
        assert lost == [] and leases.held() == [running]
        leases._renew(running)
        assert store.lease("s1") is not None and store.lease("s1").holder == running.holder  # type: ignore[union-attr]
    finally:
        leases.close()


def heard_within(heard: list[str], expected: list[str], *, seconds: float = 5.0) -> bool:
    """Whether `heard` becomes `expected` within `seconds` (a renewal reads the mark; on a loaded machine it may be late)."""
    deadline = time.monotonic() + seconds
    while heard != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return heard == expected


def test_stop_asked_on_another_replica_reaches_the_holder_through_the_store_without_a_notice(store: SessionStore) -> None:
    heard: list[str] = []

    def stop_here(session_id: str) -> bool:
        heard.append(session_id)
        return True  # the request is stopping

    running, elsewhere = Leases(store, seconds=0.75, wait=0, on_stop=stop_here), Leases(store, seconds=0.75, wait=0)
    try:
        assert not elsewhere.ask_to_stop("s1"), "nothing runs: nothing to stop"
        hold = running.take("s1")
        assert elsewhere.ask_to_stop("s1")
        assert heard_within(heard, ["s1"]), "the holder's renewal (every quarter second here) reads the mark and stops its request"
        running.release(hold)
        # A mark left by a request that ended before it was read never stops the session's next request.
        ended = running.take("s1")
        assert elsewhere.ask_to_stop("s1")
        running.release(ended)
        running.take("s1")
        time.sleep(0.65)  # two renewals and more
        assert heard == ["s1"], "a mark names the request it was meant for"
        assert elsewhere.ask_to_stop("s1")  # and Stop pressed again, for this one, replaces the stale mark
        assert heard_within(heard, ["s1", "s1"])
    finally:
        running.close()
        elsewhere.close()


def test_a_contender_whose_two_reads_straddle_the_holder_letting_go_takes_the_session_rather_than_being_refused(tmp_path: Path) -> None:
    # The holder frees its lease and its answered mark in one statement: a contender may find the lease
    # held, and then no mark, because both went in between. It must take the session, not answer 409.
    let_go: list[Hold] = []

    class LettingGo(SessionStore):
        def lease(self, session_id: str) -> Lease | None:
            if session_id == "s1:answered" and let_go:
                holder.release(let_go.pop())  # the holder's bookkeeping ends right between the contender's reads
            return super().lease(session_id)

    store = LettingGo(tmp_path / "sessions.db")
    store.create_session("s1", started=time.time())
    holder, contender = Leases(store, seconds=5, wait=1), Leases(store, seconds=5, wait=1)
    try:
        hold = holder.take("s1")
        holder.answered(hold)
        let_go.append(hold)
        taken = contender.take("s1")
        current = store.lease("s1")
        assert current is not None and current.holder == taken.holder
        assert not let_go, "the contender read the mark once the holder had let go"
    finally:
        holder.close()
        contender.close()
        store.close()


def test_stop_asked_once_the_request_has_answered_finds_nothing_to_stop(store: SessionStore) -> None:
    running, elsewhere = Leases(store, seconds=5, wait=0), Leases(store, seconds=5, wait=0)
    try:
        hold = running.take("s1")
        running.answered(hold)  # the answer is out; the lease stays for the round's bookkeeping
        assert not elsewhere.ask_to_stop("s1"), "an answered request has nothing left that Stop would stop"
        assert store.lease("s1:stop") is None, "and no mark is left to stop it later"
        running.release(hold)
        following = running.take("s1")  # the next request, with the last one's answered mark perhaps still about
        assert elsewhere.ask_to_stop("s1"), "a request still answering is stopped"
        running.release(following)
    finally:
        running.close()
        elsewhere.close()


def test_the_next_request_on_the_replica_holding_the_lease_waits_for_it_there_not_by_asking_the_store(tmp_path: Path) -> None:
    asked: list[str] = []

    class Counted(SessionStore):
        def take_lease(self, session_id: str, holder: str, *, seconds: float) -> Lease | None:
            asked.append(session_id)
            return super().take_lease(session_id, holder, seconds=seconds)

    store = Counted(tmp_path / "sessions.db")
    store.create_session("s1", started=time.time())
    leases = Leases(store, seconds=5, wait=30)
    try:
        hold = leases.take("s1")
        with pytest.raises(LeaseBusy):
            leases.take("s1")  # still answering: refused at once, as another replica's request is
        leases.answered(hold)
        asked.clear()
        threading.Timer(0.5, leases.release, args=(hold,)).start()
        started = time.monotonic()
        following = leases.take("s1")  # waits for the bookkeeping, then runs
        now = store.lease("s1")
        assert time.monotonic() - started >= 0.4 and now is not None and now.holder == following.holder
        assert asked == ["s1"], f"one attempt once the lease was freed, not one every 10 ms while waiting: {asked}"
        leases.release(following)
    finally:
        leases.close()
        store.close()


def test_the_answered_mark_goes_in_the_answers_own_write_and_a_contender_then_waits_for_the_bookkeeping(tmp_path: Path) -> None:
    taken: list[str] = []

    class Counted(SessionStore):
        def take_lease(self, session_id: str, holder: str, *, seconds: float) -> Lease | None:
            taken.append(session_id)
            return super().take_lease(session_id, holder, seconds=seconds)

    store = Counted(tmp_path / "sessions.db")
    store.create_session("s1", started=time.time())
    holder, contender = Leases(store, seconds=5, wait=30), Leases(store, seconds=5, wait=30)
    try:
        hold = holder.take("s1")
        recorder = StoreRecorder(store, "s1")
        mark = holder.answer_mark(hold)
        recorder.mark_answer(mark)
        rnd = Round(index=1, user_query="set x")
        recorder.record(RoundStarted(rnd))
        recorder.record(PostAdded(rnd, Post(send_from="Planner", send_to="CodeInterpreter", message="x = 1")))
        assert store.lease("s1:answered") is None and not recorder.marked(mark), "not before the answer"
        with pytest.raises(LeaseBusy):
            contender.take("s1")  # still answering: refused at once
        recorder.record(PostAdded(rnd, Post(send_from="Planner", send_to="User", message="done")))
        stored = store.lease("s1:answered")
        assert recorder.marked(mark) and stored is not None and stored.holder == hold.holder, "taken in the answer's write"
        taken.clear()
        holder.answered(hold, stored=True)
        assert taken == [], "no statement of its own"
        threading.Timer(0.5, holder.release, args=(hold,)).start()
        following = contender.take("s1")  # waits for the bookkeeping, then runs
        assert following.holder != hold.holder and store.lease("s1:answered") is None, "the mark went with the lease"
        contender.release(following)
    finally:
        holder.close()
        contender.close()
        store.close()


def test_a_contender_never_finds_a_session_held_without_its_answered_mark_while_the_holder_lets_go(tmp_path: Path) -> None:
    seen: list[tuple[bool, bool]] = []  # (lease held, answered mark there) after each row the holder frees

    class Watched(SessionStore):
        def release_lease(self, session_id: str, holder: str, *, marks: Sequence[str] = ()) -> int:
            newest = super().release_lease(session_id, holder, marks=marks)
            seen.append((self.lease("s1") is not None, self.lease("s1:answered") is not None))
            return newest

    store = Watched(tmp_path / "sessions.db")
    store.create_session("s1", started=time.time())
    leases = Leases(store, seconds=5, wait=1)
    try:
        for _ in range(2):
            hold = leases.take("s1")
            leases.answered(hold)
            assert store.lease("s1:answered") is not None, "each answered request marks itself, even with the last one's mark about"
            leases.release(hold)
        assert (True, False) not in seen, f"a contender would have been refused at once (409) instead of waiting: {seen}"
        assert store.lease("s1") is None and store.lease("s1:answered") is None
    finally:
        leases.close()
        store.close()


class Counted(SessionStore):
    """A store that notes each lease statement a replica sends (renewals aside: they run on their own clock)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.sent: list[str] = []

    def take_lease(self, session_id: str, holder: str, *, seconds: float) -> Lease | None:
        self.sent.append(f"take {session_id}")
        return super().take_lease(session_id, holder, seconds=seconds)

    def release_lease(self, session_id: str, holder: str, *, marks: Sequence[str] = ()) -> int:
        self.sent.append(f"release {session_id}")
        return super().release_lease(session_id, holder, marks=marks)

    def lease(self, session_id: str) -> Lease | None:
        self.sent.append(f"read {session_id}")
        return super().lease(session_id)


def answered_round(leases: Leases, hold: Hold, recorder: StoreRecorder, index: int) -> None:
    """A request's round as a replica stores it: started, answered with the lease's mark in the answer's write."""
    mark = leases.answer_mark(hold)
    recorder.mark_answer(mark)
    rnd = Round(index=index, user_query=f"request {index}")
    recorder.record(RoundStarted(rnd))
    recorder.record(PostAdded(rnd, Post(send_from="Planner", send_to="User", message="done")))
    leases.answered(hold, stored=recorder.marked(mark))


def test_the_sessions_next_request_here_is_handed_the_lease_without_a_statement_and_its_first_write_drops_the_last_mark(tmp_path: Path) -> None:
    store = Counted(tmp_path / "sessions.db")
    store.create_session("s1", started=time.time())
    here, elsewhere = Leases(store, seconds=5, wait=30), Leases(store, seconds=5, wait=0)
    settled: list[Hold] = []
    try:
        recorder = StoreRecorder(store, "s1")
        hold = here.take("s1", handover=True)
        answered_round(here, hold, recorder, 1)
        assert here.linger(hold, lambda: settled.append(hold))
        store.sent.clear()
        following = here.take("s1", handover=True)
        assert store.sent == [], f"the lease was asked of the store again: {store.sent}"
        assert following.handed and following.holder == hold.holder
        recorder.free_marks(here.handed_over(following), lambda: here.confirm(following))
        rnd = Round(index=2, user_query="request 2")
        recorder.record(RoundStarted(rnd))  # the request's first write
        assert store.lease("s1:answered") is None, "the previous request's answered mark must go in the next one's first write"
        assert (held := store.lease("s1")) is not None and held.holder == hold.holder, "the lease stays this replica's throughout"
        with pytest.raises(LeaseBusy):
            elsewhere.take("s1")  # this one is answering: refused at once, as for any running request
        time.sleep(leases_module.LINGER + 0.3)
        assert settled == [], "a lease handed over must not be freed when the previous request's linger would have ended"
        recorder.record(PostAdded(rnd, Post(send_from="Planner", send_to="User", message="done")))
        here.release(following)
        assert store.lease("s1") is None and store.lease("s1:answered") is None
    finally:
        here.close()
        elsewhere.close()
        store.close()


def test_a_lingering_lease_is_freed_when_no_request_comes_and_a_contender_elsewhere_waits_for_it(tmp_path: Path) -> None:
    store = Counted(tmp_path / "sessions.db")
    store.create_session("s1", started=time.time())
    here, elsewhere = Leases(store, seconds=5, wait=30), Leases(store, seconds=5, wait=30)
    freed = threading.Event()
    try:
        recorder = StoreRecorder(store, "s1")
        hold = here.take("s1")
        answered_round(here, hold, recorder, 1)

        def settle() -> None:
            here.release(hold)
            freed.set()

        assert here.linger(hold, settle)
        following = elsewhere.take("s1")  # waits for the linger (and the folds a settle waits for), not refused
        assert freed.is_set() and not following.handed and following.version == recorder.newest, "taken once freed, current to the last event"
        elsewhere.release(following)
    finally:
        here.close()
        elsewhere.close()
        store.close()


def test_a_request_that_did_not_answer_frees_its_lease_at_once(store: SessionStore) -> None:
    leases = Leases(store, seconds=5, wait=0)
    try:
        hold = leases.take("s1", handover=True)
        assert not leases.linger(hold, lambda: None), "a contender would be refused meanwhile: an unanswered request does not linger"
        leases.release(hold)
        assert store.lease("s1") is None
    finally:
        leases.close()


def test_an_upload_or_delete_after_an_answer_waits_for_the_lingering_lease_to_be_freed_then_takes_it(store: SessionStore) -> None:
    leases = Leases(store, seconds=5, wait=30)
    try:
        recorder = StoreRecorder(store, "s1")
        hold = leases.take("s1", handover=True)
        answered_round(leases, hold, recorder, 1)
        settled: list[str] = []

        def settle() -> None:
            settled.append("folds awaited")
            leases.release(hold)

        assert leases.linger(hold, settle)
        taken = leases.take("s1")  # not a message: it writes no event to carry the marks' end
        assert settled == ["folds awaited"] and not taken.handed and taken.holder != hold.holder
        leases.release(taken)
    finally:
        leases.close()


def test_a_lease_the_store_has_not_confirmed_for_half_its_term_is_not_handed_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leases_module, "LINGER", 30.0)  # only a request ends the linger here

    class Unreachable(Counted):
        down = False

        def renew_leases(self, held: Sequence[tuple[str, str]], *, seconds: float, read: Sequence[str] = ()) -> tuple[set[str], dict[str, str]]:
            if self.down:
                raise StoreError("the store is down")
            return super().renew_leases(held, seconds=seconds, read=read)

    store = Unreachable(tmp_path / "sessions.db")
    store.create_session("s1", started=time.time())
    leases = Leases(store, seconds=1.0, wait=30)
    try:
        recorder = StoreRecorder(store, "s1")
        hold = leases.take("s1", handover=True)
        answered_round(leases, hold, recorder, 1)
        assert leases.linger(hold, lambda: leases.release(hold))
        store.down = True  # renewals fail: the lease may have run out in the store, and another taken it
        time.sleep(0.6)
        following = leases.take("s1", handover=True)
        assert not following.handed and following.holder != hold.holder, "handed over on the strength of an old renewal"
        assert "take s1" in store.sent
        leases.release(following)
    finally:
        leases.close()
        store.close()


def test_a_stop_left_for_the_answered_request_does_not_stop_the_one_handed_its_lease(tmp_path: Path) -> None:
    heard: list[str] = []

    def stop_here(session_id: str) -> bool:
        heard.append(session_id)
        return True

    store = SessionStore(tmp_path / "sessions.db")
    store.create_session("s1", started=time.time())
    here, elsewhere = Leases(store, seconds=1.2, wait=30, on_stop=stop_here), Leases(store, seconds=1.2, wait=0)
    try:
        recorder = StoreRecorder(store, "s1")
        hold = here.take("s1", handover=True)
        answered_round(here, hold, recorder, 1)
        store.take_lease("s1:stop", hold.holder, seconds=60)  # Stop pressed elsewhere just as it answered
        assert here.linger(hold, lambda: here.release(hold))
        following = here.take("s1", handover=True)
        assert following.handed
        time.sleep(1.0)  # two renewals and more, before the request's first write
        assert heard == [], "a Stop meant for the previous request stopped the one handed its lease"
        recorder.free_marks(here.handed_over(following), lambda: here.confirm(following))
        recorder.record(RoundStarted(Round(index=2, user_query="request 2")))
        assert store.lease("s1:stop") is None, "the previous request's Stop goes in the first write"
        assert elsewhere.ask_to_stop("s1"), "this request runs, unanswered: Stop elsewhere marks it"
        assert heard_within(heard, ["s1"]), "and its renewal reads the mark and stops it"
        here.release(following)
    finally:
        here.close()
        elsewhere.close()
        store.close()


def test_a_handed_request_that_ends_before_its_first_write_leaves_none_of_the_previous_ones_marks(store: SessionStore) -> None:
    leases = Leases(store, seconds=5, wait=0)
    try:
        hold = leases.take("s1", handover=True)
        answered_round(leases, hold, StoreRecorder(store, "s1"), 1)
        assert leases.linger(hold, lambda: leases.release(hold))
        following = leases.take("s1", handover=True)  # then fails at once: the kernel could not start, say
        leases.release(following)
        assert store.lease("s1") is None and store.lease("s1:answered") is None, "a stale answered mark would make a contender wait for nothing"
    finally:
        leases.close()
