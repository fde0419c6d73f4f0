"""The store's team parts on both backends: users and their tokens, owners, the event log, files, leases, eval results.

And what only PostgreSQL has: its schema versions, its full-text tip search, its advisory-lock claims,
and a password that never shows in a message, a repr or a stored row.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import queue
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import cli_env, make_project

from taskweaver_lite.config.settings import ExperienceConfig
from taskweaver_lite.config.store_url import redact, redact_text
from taskweaver_lite.errors import ExperienceError, SessionBusyError, StoreError, StoreUnavailable, UnknownSessionError
from taskweaver_lite.knowledge.experience import Experience
from taskweaver_lite.records.conversation import Post, Round
from taskweaver_lite.records.events import FileLoaded, Folded, ModelCalled, PostAdded, RoundEnded, RoundStarted
from taskweaver_lite.records.execution import ExecutionResult
from taskweaver_lite.session.export import export_notebook
from taskweaver_lite.store.database import SessionStore
from taskweaver_lite.store.interface import EVENTS_CHANNEL, LeaseMark, Store
from taskweaver_lite.store.postgres import CONNECT_TIMEOUT_SECONDS, PostgresStore
from taskweaver_lite.store.postgres_schema import MIGRATIONS as POSTGRES_MIGRATIONS
from taskweaver_lite.store.postgres_schema import SCHEMA_VERSION
from taskweaver_lite.store.postgres_schema import migrate as migrate_postgres
from taskweaver_lite.store.recorder import StoreRecorder
from taskweaver_lite.store.schema import MIGRATIONS as SQLITE_MIGRATIONS
from taskweaver_lite.store.schema import migrate as migrate_sqlite
from taskweaver_lite.store.users import make_token
from taskweaver_lite.testing.postgres_cluster import PostgresCluster, free_port

pytestmark = pytest.mark.unit


def all_rows(store: Store) -> str:
    """Every value of every table, as one text (to look for what must never be stored)."""
    if isinstance(store, SessionStore):
        import sqlite3

        with sqlite3.connect(store.path) as db:
            tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            return repr([db.execute(f"SELECT * FROM {t}").fetchall() for t in tables])
    assert isinstance(store, PostgresStore)
    with psycopg.connect(store._url) as conn:
        tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        return repr([conn.execute(f"SELECT * FROM {t}").fetchall() for t in tables])


def started(store: Store, session_id: str, *, owner: str | None = None, query: str = "a request") -> None:
    store.create_session(session_id, started=time.time(), owner=owner)
    store.record(session_id, RoundStarted(Round(index=1, user_query=query)))


def test_a_token_names_its_user_and_only_its_salted_hash_is_kept(store: Store) -> None:
    assert not store.has_users()
    token = store.add_user("ana")
    admin_token = store.add_user("root", admin=True)
    assert store.has_users() and [(u.name, u.admin) for u in store.users()] == [("ana", False), ("root", True)]
    found = store.user_for_token(token)
    assert found is not None and found.name == "ana" and not found.admin
    assert (admin := store.user_for_token(admin_token)) is not None and admin.admin
    secret = token.split("_", 2)[2]  # twl_<id>_<secret>: the secret may hold "_" itself
    kept = all_rows(store)
    assert token not in kept and secret not in kept and hashlib.sha256(token.encode()).hexdigest() not in kept
    # The same id with another secret, a token cut short, or garbage: nobody.
    forged = token[: token.rindex("_") + 1] + "A" * len(secret)
    assert store.user_for_token(forged) is None and store.user_for_token(token[:-1]) is None and store.user_for_token("nonsense") is None
    with pytest.raises(StoreError, match="already a user 'ana'"):
        store.add_user("ana")
    with pytest.raises(StoreError, match="not a usable user name"):
        store.add_user("ana smith")


def test_a_removed_users_token_stops_working_at_once_even_after_it_was_verified(store: Store) -> None:
    token = store.add_user("ana")
    assert store.user_for_token(token) is not None  # verified once: remembered by this process
    assert store.remove_user("ana") and not store.remove_user("ana")
    assert store.user_for_token(token) is None
    store.add_user("ana")  # the name again, with a new token: the old one still opens nothing
    assert store.user_for_token(token) is None


def test_a_token_expires_after_its_days_and_a_rotated_one_replaces_it_at_once(store: Store) -> None:
    before = time.time()
    token = store.add_user("ana", expires_days=2)
    ana = store.user_for_token(token)
    assert ana is not None and ana.expires_at is not None and abs(ana.expires_at - (before + 2 * 86400)) < 5
    assert not ana.expired() and ana.expired(now=ana.expires_at), "it stops working at its expiry"
    assert [u.to_dict()["expires_at"] for u in store.users()] == [ana.expires_at]
    rotated = store.rotate_token("ana")
    assert rotated is not None and rotated != token
    assert store.user_for_token(token) is None, "the old token stops at once, though this process verified it before"
    renewed = store.user_for_token(rotated)
    assert renewed is not None and renewed.expires_at is not None and abs(renewed.expires_at - (time.time() + 2 * 86400)) < 5, "the same days, from now"
    longer = store.rotate_token("ana", expires_days=10)
    assert longer is not None and (ten := store.user_for_token(longer)) is not None and ten.expires_at is not None
    assert abs(ten.expires_at - (time.time() + 10 * 86400)) < 5
    third = store.rotate_token("ana")
    assert third is not None and (kept := store.user_for_token(third)) is not None and kept.expires_at is not None
    assert abs(kept.expires_at - (time.time() + 10 * 86400)) < 5, "rotated again without days: the ten it was last given"
    lasting = store.add_user("bo")
    assert (bo := store.user_for_token(lasting)) is not None and bo.expires_at is None and not bo.expired(now=before + 1e9)
    assert (again := store.user_for_token(store.rotate_token("bo") or "")) is not None and again.expires_at is None, "no expiry stays none"
    assert store.rotate_token("nobody") is None
    rows = all_rows(store)
    assert all(t not in rows and t.split("_", 2)[2] not in rows for t in (token, rotated, longer, lasting)), "only hashes are kept"


def test_a_users_lists_lookups_and_tips_hold_only_their_own_sessions(store: Store) -> None:
    started(store, "ana-1", owner="ana", query="ana's revenue")
    started(store, "bob-1", owner="bob", query="bob's churn")
    started(store, "solo-1", query="before the team")
    assert {e.id for e in store.list_sessions()} == {"ana-1", "bob-1", "solo-1"}, "no owner given: everyone's (one person, or an admin)"
    assert [e.id for e in store.list_sessions(owner="ana")] == ["ana-1"]
    assert store.resolve("ana", owner="ana") == "ana-1" and store.resolve("last", owner="bob") == "bob-1"
    with pytest.raises(UnknownSessionError):
        store.resolve("bob-1", owner="ana")
    with pytest.raises(UnknownSessionError):
        store.resolve("bob", owner="ana")  # a prefix of another's id finds nothing either
    assert store.owner_of("bob-1") == "bob" and store.owner_of("solo-1") is None and store.load("ana-1").owner == "ana"
    store.save_tips("ana-1", [("preference", "ana's tip")])
    [bobs] = store.save_tips("bob-1", [("preference", "bob's tip")])
    store.save_tips("solo-1", [("preference", "a tip from before the team")])
    assert [t.text for t in store.stored_tips(owner="ana")] == ["ana's tip"], "a session made without users is nobody's: its tips are no user's"
    assert len(store.stored_tips()) == 3, "an admin sees them all"
    assert not store.delete_tip(int(bobs.id), owner="ana"), "another user's tip is not there to delete"
    assert store.delete_tip(int(bobs.id), owner="bob")


def test_the_event_log_keeps_what_was_shown_in_order_with_rising_ids(store: Store) -> None:
    started(store, "s")
    started(store, "other")
    assert store.last_event_id("s") == 0
    recorder = StoreRecorder(store, "s")
    rnd = Round(index=2, user_query="plot it")
    recorder(RoundStarted(rnd))
    first = store.record("s", shown=[{"type": "note", "n": 1}, {"type": "note", "n": 2}])
    store.record("other", shown=[{"type": "note", "n": 99}])
    entries = store.events_after("s", 0)
    assert [e.data for e in entries] == [{"type": "round_started", "round": 2, "text": "plot it"}, {"type": "note", "n": 1}, {"type": "note", "n": 2}]
    assert [e.id for e in entries] == sorted(e.id for e in entries) and entries[-1].id == first[-1] == store.last_event_id("s")
    assert [e.data["n"] for e in store.events_after("s", entries[1].id)] == [2], "a client that saw up to an id gets only what followed"


def test_artifacts_and_uploads_are_kept_as_bytes_per_session(store: Store) -> None:
    started(store, "s")
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40
    store.put_file("s", "artifact", "plot.png", png)
    store.put_file("s", "upload", "sales.csv", b"month,revenue\n1,10\n")
    store.put_file("s", "artifact", "plot.png", png + b"!")  # made again: replaced
    assert store.file("s", "artifact", "plot.png") == png + b"!" and store.file("s", "upload", "plot.png") is None
    assert store.file_names("s", "artifact") == ["plot.png"] and store.file_names("s", "upload") == ["sales.csv"]


def test_one_holder_at_a_time_has_a_sessions_lease_until_it_expires(store: Store) -> None:
    started(store, "s")
    lease = store.take_lease("s", "replica-a/1", seconds=30)
    assert lease is not None and lease.holder == "replica-a/1" and lease.expires > time.time()
    assert store.take_lease("s", "replica-b/1", seconds=30) is None
    assert store.renew_leases([("s", "replica-a/1")], seconds=30) == ({"s"}, {}) and store.renew_leases([("s", "replica-b/1")], seconds=30)[0] == set()
    store.take_lease("s:stop", "replica-a/1", seconds=30)
    store.take_lease("t", "replica-b/1", seconds=-1.0)  # run out already
    renewed, found = store.renew_leases([("s", "replica-a/1"), ("s:stop", "replica-a/1")], seconds=30, read=["s:stop", "t", "u"])
    assert renewed == {"s", "s:stop"} and found == {"s:stop": "replica-a/1"}, "one write renews several rows and reads the live ones asked for"
    store.release_lease("s:stop", "replica-a/1")
    store.release_lease("s", "replica-b/1")  # not theirs: nothing happens
    assert (held := store.lease("s")) is not None and held.holder == "replica-a/1"
    store.release_lease("s", "replica-a/1")
    assert store.lease("s") is None
    assert store.take_lease("s", "replica-b/1", seconds=0.2) is not None
    time.sleep(0.4)
    assert store.lease("s") is None, "an expired lease is no one's"
    taken = store.take_lease("s", "replica-a/2", seconds=30)
    assert taken is not None and taken.holder == "replica-a/2"


def test_a_lease_freed_by_its_holder_tells_the_next_one_the_sessions_newest_event_and_one_that_ran_out_does_not(store: Store) -> None:
    started(store, "s")
    first = store.take_lease("s", "replica-a/1", seconds=30)
    assert first is not None and first.version == -1, "the session's first lease: its newest event is not known"
    written = store.record("s", shown=[{"type": "note", "n": 1}, {"type": "note", "n": 2}])
    assert store.release_lease("s", "replica-a/1") == written[-1]
    assert store.lease("s") is None, "freed: no one's"
    taken = store.take_lease("s", "replica-b/1", seconds=0.2)
    assert taken is not None and taken.version == written[-1], "the next holder knows what its copy must be current with"
    store.record("s", shown=[{"type": "note", "n": 3}])  # written by replica-b, whose lease then runs out (it died)
    time.sleep(0.4)
    after = store.take_lease("s", "replica-a/2", seconds=30)
    assert after is not None and after.version == -1, "a lease that ran out says nothing of what its holder wrote: the store is read"
    assert store.take_lease("s", "replica-a/2", seconds=30) is not None, "its holder takes it again"


def test_an_answers_write_takes_the_lease_mark_with_it_over_an_earlier_one_and_a_failed_write_takes_none(store: Store) -> None:
    started(store, "s")
    assert store.take_lease("s:answered", "replica-a/1", seconds=30) is not None  # a mark an earlier holder left behind
    store.take_lease("s", "replica-b/1", seconds=30)
    rnd = Round(index=2, user_query="again")
    answer = Post(send_from="Planner", send_to="User", message="done")
    store.record("s", PostAdded(rnd, answer), shown=[{"type": "answer"}], mark=LeaseMark("s:answered", "replica-b/1", 30))
    marked = store.lease("s:answered")
    assert marked is not None and marked.holder == "replica-b/1" and marked.expires > time.time() + 20, "taken in the answer's write, for its term"
    assert [e.data for e in store.events_after("s", 0)][-1] == {"type": "answer"}
    assert store.release_lease("s", "replica-b/1", marks=[":answered"]) > 0
    assert store.lease("s:answered") is None, "freed with the lease"
    with pytest.raises(StoreError):
        store.record("gone", shown=[{"type": "answer"}], mark=LeaseMark("gone:answered", "replica-b/2", 30))
    assert store.lease("gone:answered") is None, "a write refused as a whole takes no mark"


def test_eval_results_and_kernel_ids_are_kept(store: Store) -> None:
    store.save_eval_result("run-1", "mean_units", {"score": 0.5})
    store.save_eval_result("run-1", "mean_units", {"score": 1.0})
    store.save_eval_result("run-1", "running_sum", {"score": 0.0})
    assert store.eval_results("run-1") == {"mean_units": {"score": 1.0}, "running_sum": {"score": 0.0}} and store.eval_results("run-2") == {}
    started(store, "s")
    assert store.load("s").kernel_id is None
    store.save_kernel("s", "5f0c-kernel")
    assert store.load("s").kernel_id == "5f0c-kernel"


# --- PostgreSQL only ---------------------------------------------------------------------------


@pytest.mark.postgres
def test_postgresql_tips_are_ranked_in_memory_as_on_sqlite_each_users_own(postgres_url: str, tmp_path: Path) -> None:
    store = PostgresStore(postgres_url)
    started(store, "ana-1", owner="ana")
    started(store, "bob-1", owner="bob")
    store.save_tips("ana-1", [("preference", "Parse the month column as dates before grouping"), ("preference", "Plots need a title")])
    store.save_tips("bob-1", [("preference", "Grouping by months: parse dates first")])
    assert store.search_tips("grouped by month", owner="ana", limit=5) is None, "ranked in memory, not by the database"
    anas = Experience(store=store, folder=tmp_path / "experience", settings=ExperienceConfig(), owner="ana")
    assert [t.text for t in anas.relevant("grouped by month")] == ["Parse the month column as dates before grouping"], "stemmed, and only ana's"
    anas.new_request()
    assert anas.relevant("histogram") == [], "a word of no tip finds nothing"


class _CountedReads(PostgresStore):
    """A PostgreSQL store that counts its one-statement reads."""

    reads = 0

    @contextlib.contextmanager
    def _read_one(self) -> Iterator[Any]:
        type(self).reads += 1
        with super()._read_one() as db:
            yield db


@pytest.mark.postgres
def test_a_replica_that_hears_the_tips_change_asks_for_their_version_only_after_a_change(postgres_url: str) -> None:
    store = _CountedReads(postgres_url)
    started(store, "s")
    store.save_tips("s", [("preference", "Plots need a title")])
    notices = store.notices()
    notices.listen({EVENTS_CHANNEL: lambda _: None})
    try:
        deadline = time.monotonic() + 30
        while not notices.connected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert notices.connected, "the LISTEN connection did not come up"
        _CountedReads.reads = 0
        first = store.tips_version()
        assert [store.tips_version() for _ in range(3)] == [first] * 3 and _CountedReads.reads == 1, "asked once, then kept"
        with psycopg.connect(postgres_url) as elsewhere:  # another replica (or an administrator) changes the tips
            elsewhere.execute("DELETE FROM tips")
        deadline = time.monotonic() + 10
        while store.tips_version() == first and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.tips_version() == (0, 0), "the change was heard, and the version read again"
    finally:
        notices.close()
    deadline = time.monotonic() + 10
    while notices.connected and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # the LISTEN thread lets go of the version as it leaves
    _CountedReads.reads = 0
    store.tips_version()
    store.tips_version()
    assert _CountedReads.reads == 2, "not hearing the changes, it asks at each search"


@pytest.mark.postgres
def test_a_session_is_claimed_by_one_process_until_it_lets_go(postgres_url: str) -> None:
    store = PostgresStore(postgres_url)
    claim = store.lock("s")
    with pytest.raises(SessionBusyError, match="open in another taskweaver-lite process"):
        store.lock("s")
    claim.release()
    store.lock("s").release()


@pytest.mark.postgres
def test_the_postgresql_schema_is_versioned_and_a_newer_one_is_refused(postgres_url: str) -> None:
    PostgresStore(postgres_url)
    PostgresStore(postgres_url)  # opened again: nothing to do
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT version FROM taskweaver_lite_schema").fetchall() == [(SCHEMA_VERSION,)]
        conn.execute("UPDATE taskweaver_lite_schema SET version = version + 1")
    with pytest.raises(StoreError, match=r"written by a newer taskweaver-lite .*upgrade taskweaver-lite"):
        PostgresStore(postgres_url)


@pytest.mark.postgres
def test_the_password_never_shows_in_an_error_or_a_repr(postgres_cluster: PostgresCluster, postgres_url: str) -> None:
    password = postgres_cluster.password
    store = PostgresStore(postgres_url)
    assert password not in repr(store) and password not in store.where and ":***@" in store.where
    wrong = postgres_cluster.url(postgres_url.rsplit("/", 1)[1], password="not-" + password)
    with pytest.raises(StoreError) as refused:
        PostgresStore(wrong)
    assert "not-" + password not in str(refused.value) and password not in str(refused.value), str(refused.value)
    nobody = f"postgresql://twl:{password}@127.0.0.1:{free_port()}/none"
    with pytest.raises(StoreUnavailable) as down:
        PostgresStore(nobody)
    message = str(down.value)
    assert password not in message and "\n" not in message and "twl:***@127.0.0.1" in message, message


@pytest.mark.postgres
def test_a_store_url_with_a_wrong_password_or_port_fails_at_once_saying_why(postgres_cluster: PostgresCluster, postgres_url: str) -> None:
    # Not after the pool's wait for a connection (CONNECT_TIMEOUT_SECONDS), as "did not answer": the server's own reason, at once.
    wrong = postgres_cluster.url(postgres_url.rsplit("/", 1)[1], password="not-" + postgres_cluster.password)
    nobody = f"postgresql://twl:{postgres_cluster.password}@127.0.0.1:{free_port()}/none"
    for url, reason in ((wrong, "password authentication failed"), (nobody, "refused")):
        began = time.monotonic()
        with pytest.raises(StoreUnavailable) as failed:
            PostgresStore(url)
        took, message = time.monotonic() - began, str(failed.value)
        assert reason in message and "store.url" in message and "did not answer" not in message, message
        assert took < CONNECT_TIMEOUT_SECONDS / 2, f"{redact(url)} failed after {took:.1f} s: {message}"


@pytest.mark.postgres
def test_serve_on_a_store_url_with_a_wrong_password_stops_at_once_in_one_line_saying_why(
    postgres_cluster: PostgresCluster, postgres_url: str, tmp_path: Path
) -> None:
    wrong = postgres_cluster.url(postgres_url.rsplit("/", 1)[1], password="not-" + postgres_cluster.password)
    project = make_project(tmp_path, "http://127.0.0.1:9/v1", store={"url": wrong})
    command = [sys.executable, "-m", "taskweaver_lite", "serve", "-p", str(project), "--port", str(free_port())]
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, env=cli_env())
    said = done.stderr.strip()
    assert done.returncode != 0 and "serving" not in said, said
    assert "password authentication failed" in said and "store.url" in said and "Traceback" not in said and "\n" not in said, said
    assert postgres_cluster.password not in said, said  # the server's reason, which the pool's wait for a connection never gave


def test_urls_and_driver_messages_lose_their_passwords() -> None:
    assert redact("postgresql://tw:s3cr%40t@db:5432/team?sslmode=require") == "postgresql://tw:***@db:5432/team?sslmode=require"
    assert redact("postgresql://tw@db/team?password=hunter2") == "postgresql://tw@db/team?password=***"
    said = redact_text('connection to "postgresql://tw:hunter2@db/team" failed; password=hunter2 user=tw')
    assert "hunter2" not in said and re.search(r"tw:\*\*\*@db", said)


@pytest.mark.postgres
def test_appending_to_a_sessions_event_log_notifies_the_other_replicas_once_per_write(postgres_url: str) -> None:
    store = PostgresStore(postgres_url)
    started(store, "s")
    store.notices().follow("s")  # an event stream of the session is open on some replica
    with psycopg.connect(postgres_url, autocommit=True) as listener:
        listener.execute("LISTEN twl_events")
        store.record("s", shown=[{"type": "post", "text": "one"}, {"type": "post", "text": "two"}])
        store.record("s", ModelCalled("planner", 10, 2, 0.1, ok=True))  # nothing for the log: no notice
        heard = [n.payload for n in listener.notifies(timeout=2.0)]
    assert heard == ["s"], "each write that appends to the log tells the other replicas, once, by the session's id"


def _heard_until_the_end(listener: psycopg.Connection[Any]) -> list[str]:
    """The event notices `listener` got, up to an `end` sent last (notices come in the order their writes committed)."""
    listener.execute("SELECT pg_notify('twl_events', 'end')")
    heard: list[str] = []
    for notice in listener.notifies(timeout=10.0):
        if notice.payload == "end":
            return heard
        heard.append(notice.payload)
    raise AssertionError(f"the closing notice never came (heard {heard})")


@pytest.mark.postgres
def test_a_write_of_events_notices_only_while_some_replica_follows_its_session(postgres_url: str) -> None:
    store = PostgresStore(postgres_url)
    for session_id in ("a", "b"):
        started(store, session_id)
    here, there = store.notices(), store.notices()  # two replicas
    shown = [{"type": "post", "text": "one"}]
    with psycopg.connect(postgres_url, autocommit=True) as listener:
        listener.execute("LISTEN twl_events")
        store.record("a", shown=shown)  # nobody follows either session: no replica is woken
        here.follow("b")
        here.follow("b")  # two streams of it on one replica
        there.follow("b")
        store.record("a", shown=shown)
        store.record("b", shown=shown)
        assert _heard_until_the_end(listener) == ["b"], "only the followed session's write notices"
        here.unfollow("b")
        there.unfollow("b")
        store.record("b", shown=shown)
        assert _heard_until_the_end(listener) == ["b"], "followed while one stream of it is still open"
        here.unfollow("b")
        store.record("b", shown=shown)
        assert _heard_until_the_end(listener) == [], "once the last stream of it has ended, nobody is woken"
        with psycopg.connect(postgres_url, autocommit=True) as db:
            assert db.execute("SELECT COUNT(*) FROM followers").fetchone() == (0,), "no row is left behind"


@pytest.mark.postgres
def test_a_write_sees_a_follower_that_registered_while_it_waited_whatever_the_databases_default_isolation(postgres_cluster: PostgresCluster) -> None:
    url = postgres_cluster.new_database()
    with psycopg.connect(postgres_cluster.url(), autocommit=True) as admin:  # an administrator's choice for the database
        admin.execute(f"ALTER DATABASE \"{url.rsplit('/', 1)[1]}\" SET default_transaction_isolation = 'repeatable read'")
    store = PostgresStore(url + "?options=-c%20search_path%3Dpublic")  # the URL's own server options are kept
    started(store, "s")
    with store._transaction() as db:  # as a write of events: its snapshot taken, then the follower registers
        assert db.execute("SHOW transaction_isolation").fetchone()[0] == "read committed"
        assert db.execute("SHOW search_path").fetchone()[0] == "public"
        assert db.execute("SELECT COUNT(*) FROM followers").fetchone() == (0,)  # the snapshot a REPEATABLE READ would keep
        store.follow("s", "replica-1", seconds=60)
        assert db.execute("SELECT taskweaver_lite_events_logged('s')").fetchone() == (True,), "a write missed a follower that registered"


@pytest.mark.postgres
def test_a_new_follower_waits_for_a_write_under_way_so_that_its_next_read_holds_that_write(postgres_url: str) -> None:
    """A write that found nobody following commits before a follower registers: the follower's first read then has it."""
    store = PostgresStore(postgres_url)
    started(store, "s")
    followed = threading.Event()
    with psycopg.connect(postgres_url) as writer:  # a write of events under way: checked for followers, not committed
        assert writer.execute("SELECT taskweaver_lite_events_logged('s')").fetchone() == (False,)

        def follow() -> None:
            store.follow("s", "replica-1", seconds=60)
            followed.set()

        follower = threading.Thread(target=follow)
        follower.start()
        assert not followed.wait(1.0), "a follower registered while a write that did not notice it was still under way"
        writer.commit()
    assert followed.wait(10), "registered once that write committed"
    follower.join()
    with psycopg.connect(postgres_url) as writer:
        assert writer.execute("SELECT taskweaver_lite_events_logged('s')").fetchone() == (True,), "the next write notices it"


@pytest.mark.postgres
def test_the_stores_notices_carry_a_sessions_new_events_and_the_servers_own_messages(postgres_url: str, tmp_path: Path) -> None:
    store = PostgresStore(postgres_url)
    started(store, "s")
    heard: queue.Queue[tuple[str, str]] = queue.Queue()
    notices = store.notices()
    notices.listen({EVENTS_CHANNEL: lambda payload: heard.put(("events", payload)), "twl_stop": lambda payload: heard.put(("stop", payload))})
    try:
        deadline = time.monotonic() + 30
        while not notices.connected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert notices.connected, "the LISTEN connection did not come up"
        notices.follow("s")  # an event stream of the session is open here
        store.record("s", shown=[{"type": "post", "text": "one"}])
        assert heard.get(timeout=10) == ("events", "s"), "an append to the event log reaches the listeners as the session's id"
        store.notices().send("twl_stop", "s")
        assert heard.get(timeout=10) == ("stop", "s"), "a server's own notice reaches the listeners of its channel"
    finally:
        notices.close()
    assert SessionStore(tmp_path / "sessions.db").notices() is None, "the SQLite file is one process's: nobody to notify"


@pytest.mark.postgres
@pytest.mark.parametrize("failed", ["_write_one", "_read_one", "_read"])
def test_a_connection_lent_for_one_statement_keeps_later_writes_atomic_even_after_that_statement_failed(postgres_url: str, failed: str) -> None:
    store = PostgresStore(postgres_url, pool_size=1)  # one connection: the one that failed is the one lent next
    started(store, "s")
    with pytest.raises(StoreError), getattr(store, failed)() as db:
        db.execute("SELECT 1 / 0")
    with pytest.raises(RuntimeError), store._transaction() as db:
        db.execute("UPDATE sessions SET title = 'half-way' WHERE id = 's'")
        raise RuntimeError("a write that fails half-way")
    assert store.load("s").title != "half-way", "the connection went back to the pool still committing each statement"
    assert store.take_lease("s", "me", seconds=5) is not None and store.lease("s") is not None


@pytest.mark.postgres
def test_a_postgresql_store_keeps_artifacts_and_uploads_so_any_server_exports_them(postgres_url: str, tmp_path: Path) -> None:
    store = PostgresStore(postgres_url)
    started(store, "s")
    cwd = tmp_path / "s" / "cwd"
    cwd.mkdir(parents=True)
    png = b"\x89PNG\r\n\x1a\n" + b"plot" * 100
    (cwd / "trend.png").write_bytes(png)
    (cwd / "sales.csv").write_text("month,revenue\n", encoding="utf-8")
    (cwd / "secret").write_text("not theirs", encoding="utf-8")
    (cwd / "link.png").symlink_to(cwd / "secret")
    recorder = StoreRecorder(store, "s", working_dir=cwd)
    rnd = Round(index=1, user_query="plot")
    result = ExecutionResult(code="plot()", success=True, artifacts=(str(cwd / "trend.png"), str(cwd / "link.png")))
    post = Post("CodeInterpreter", "Planner", "plotted", code="plot()", execution=result)
    rnd.posts.append(post)
    recorder(PostAdded(rnd, post))
    recorder(FileLoaded(name="sales.csv", source=str(tmp_path / "elsewhere.csv"), after_round=1, at=time.time()))
    assert store.file("s", "artifact", "trend.png") == png and store.file("s", "upload", "sales.csv") == b"month,revenue\n"
    assert store.file("s", "artifact", "link.png") is None, "a link a kernel left is never followed into the store"
    shutil.rmtree(tmp_path / "s")  # another server: the session's folder is not on its disk
    notebook = export_notebook(store.load("s"), tmp_path / "s.ipynb", kept=lambda name: store.file("s", "artifact", name))
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    shown = [output["data"] for cell in cells for output in cell.get("outputs", []) if "data" in output]
    assert base64.b64decode(shown[0]["image/png"]) == png and "image/png" not in shown[1], "the link is named, not embedded"


def _full_session(store: Store, session_id: str, word: str) -> None:
    """A session with a row in every table a session has: a finished round with a cell, a model call, a fold, files, tips, a lease."""
    store.create_session(session_id, started=time.time(), owner="ana")
    rnd = Round(index=1, user_query=f"{word} request")
    post = Post("CodeInterpreter", "Planner", f"{word} result", code="x = 1", execution=ExecutionResult(code="x = 1", success=True))
    rnd.posts.append(post)
    rnd.state = "finished"
    store.record(
        session_id,
        RoundStarted(rnd),
        ModelCalled("planner", 10, 2, 0.1, ok=True),
        PostAdded(rnd, post),
        Folded("planner", 1, 1, 100, 20, ok=True),
        FileLoaded(name=f"{word}.csv", source="/data", after_round=1, at=time.time()),
        RoundEnded(rnd),
        shown=[{"type": "post", "text": f"{word} shown"}],
    )
    store.save_compression(session_id, "planner", {"summary": f"{word} summary"})
    store.put_file(session_id, "artifact", f"{word}.png", b"png")
    store.save_tips(session_id, [("preference", f"{word} tip")])
    store.take_lease(session_id, "replica-a", seconds=30)
    store.take_lease(session_id + ":answered", "replica-a", seconds=30)


def test_a_deleted_session_leaves_no_row_behind_and_the_others_stay_whole(store: Store) -> None:
    _full_session(store, "gone-1", "zanzibar")
    _full_session(store, "kept-1", "quokka")
    kept = store.load("kept-1")
    assert store.delete_session("gone-1")
    left = all_rows(store)
    assert "gone-1" not in left and "zanzibar" not in left, "a deleted session's rows (or its tips' words in the search index) stay"
    assert store.load("kept-1") == kept and [t.text for t in store.stored_tips()] == ["quokka tip"]
    assert store.file("kept-1", "artifact", "quokka.png") == b"png" and store.lease("kept-1") is not None
    with pytest.raises(UnknownSessionError):
        store.load("gone-1")
    assert not store.delete_session("gone-1")
    started(store, "gone-1")  # the id may be used again, from nothing
    assert [r.user_query for r in store.load("gone-1").rounds] == ["a request"]


def test_a_sessions_remembered_settings_never_keep_an_api_key_or_the_stores_address(store: Store) -> None:
    started(store, "s")
    store.save_overrides("s", ["llm.model=gpt-4o", "llm.api_key=sk-hidden", "store.url=postgresql://tw:hunter2@db/team", "planner.llm.api_key=sk-2"])
    assert store.overrides("s") == ["llm.model=gpt-4o"]
    assert "hunter2" not in all_rows(store) and "sk-hidden" not in all_rows(store)


def test_a_user_deletes_their_own_tips_but_not_those_of_sessions_made_without_users(store: Store, tmp_path: Path) -> None:
    started(store, "ana-1", owner="ana")
    started(store, "solo-1")
    [mine] = store.save_tips("ana-1", [("preference", "ana likes bar charts")])
    [shared] = store.save_tips("solo-1", [("preference", "revenue is in euros")])
    experience = Experience(store=store, folder=tmp_path / "none", settings=ExperienceConfig(), owner="ana")
    assert {t.text for t in experience.all()} == {"ana likes bar charts"}
    with pytest.raises(ExperienceError, match="there is no tip"):
        experience.delete(shared.id)
    assert experience.delete(mine.id).text == "ana likes bar charts"
    admin = Experience(store=store, folder=tmp_path / "none", settings=ExperienceConfig())
    assert admin.delete(shared.id).text == "revenue is in euros" and store.stored_tips() == []


@pytest.mark.postgres
def test_a_role_without_create_rights_uses_a_store_an_administrator_migrated(postgres_cluster: PostgresCluster, postgres_url: str) -> None:
    PostgresStore(postgres_url)  # migrated by the owner
    database = postgres_url.rsplit("/", 1)[1]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE app_{database} LOGIN PASSWORD 'app-pass'")
        conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO app_{database}")
    app_url = postgres_url.replace(f"twl:{postgres_cluster.password}@", f"app_{database}:app-pass@")
    store = PostgresStore(app_url)
    started(store, "s")
    assert [e.id for e in store.list_sessions()] == ["s"]


def test_an_sqlite_store_from_before_expiring_tokens_is_upgraded_and_its_tokens_never_expire(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    with sqlite3.connect(path, isolation_level=None) as db:
        migrate_sqlite(db, SQLITE_MIGRATIONS[:5], path=path)  # the store as the version before wrote it, with a user
        made = make_token()
        db.execute(
            "INSERT INTO users (name, admin, token_id, salt, token_hash, created_at) VALUES (?, ?, ?, ?, ?, ?)",
            ("ana", 0, made.token_id, made.salt, made.digest, time.time()),
        )
    store = SessionStore(path)
    try:
        ana = store.user_for_token(made.token)
        assert ana is not None and ana.name == "ana" and ana.expires_at is None
        assert store.rotate_token("ana") is not None and store.user_for_token(made.token) is None
    finally:
        store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == len(SQLITE_MIGRATIONS) == 10


@pytest.mark.postgres
def test_a_postgresql_store_from_before_expiring_tokens_is_upgraded_and_its_tokens_never_expire(postgres_url: str) -> None:
    made = make_token()
    with psycopg.connect(postgres_url) as conn:
        migrate_postgres(conn, POSTGRES_MIGRATIONS[:1], where="the test database")  # as the version before wrote it
        with conn.transaction():
            conn.execute(
                "INSERT INTO users (name, admin, token_id, salt, token_hash, created_at) VALUES (%s, %s, %s, %s, %s, %s)",
                ("ana", 1, made.token_id, made.salt, made.digest, time.time()),
            )
    store = PostgresStore(postgres_url)
    try:
        ana = store.user_for_token(made.token)
        assert ana is not None and ana.admin and ana.expires_at is None
        assert store.add_user("bo", expires_days=1) and store.users()[1].expires_at is not None
    finally:
        store.close()
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT version FROM taskweaver_lite_schema").fetchall() == [(SCHEMA_VERSION,)] and SCHEMA_VERSION == 8


def test_a_store_from_before_user_ids_gives_its_users_ids_and_their_sessions_follow_them(store: Store) -> None:
    """Upgraded from the version before (sessions owned by a name): each user gets an id, each session its user's, and a gone user's are nobody's."""
    if isinstance(store, SessionStore):
        path = store.path
        store.close()
        path.unlink()
        for extra in (Path(f"{path}-wal"), Path(f"{path}-shm")):
            extra.unlink(missing_ok=True)
        with sqlite3.connect(path, isolation_level=None) as db:
            migrate_sqlite(db, SQLITE_MIGRATIONS[:6], path=path)
            _old_rows(db.execute, "?")
        upgraded: Store = SessionStore(path)
    else:
        assert isinstance(store, PostgresStore)
        with psycopg.connect(store._url) as conn:
            conn.execute("DROP SCHEMA public CASCADE")
            conn.execute("CREATE SCHEMA public")
            migrate_postgres(conn, POSTGRES_MIGRATIONS[:2], where="the test database")
            with conn.transaction():
                _old_rows(conn.execute, "%s")
        upgraded = PostgresStore(store._url)
    try:
        ana = next(user for user in upgraded.users() if user.name == "ana")
        assert len(ana.id) == 16 and upgraded.owner_of("ana-1") == ana.id and upgraded.owner_of("solo-1") is None
        assert upgraded.owner_of("gone-1") == "removed:gone", "a session of a user removed before the upgrade is nobody's to claim"
        assert [e.id for e in upgraded.list_sessions(owner=ana.id)] == ["ana-1"] and upgraded.had_users()
        upgraded.remove_user("ana")
        upgraded.add_user("ana")
        assert upgraded.list_sessions(owner=upgraded.users()[0].id) == [], "the name again is someone new"
        assert not upgraded.has_users() or upgraded.had_users()
    finally:
        upgraded.close()


def _old_rows(execute: Any, mark: str) -> None:
    """Rows as the version before user ids wrote them: ana's session, a removed user's, one made without users."""
    made = make_token()
    execute(
        f"INSERT INTO users (name, admin, token_id, salt, token_hash, created_at) VALUES ({', '.join([mark] * 6)})",
        ("ana", 0, made.token_id, made.salt, made.digest, 1.0),
    )
    for session_id, owner in (("ana-1", "ana"), ("gone-1", "gone"), ("solo-1", None)):
        execute(f"INSERT INTO sessions (id, started, last_active, owner) VALUES ({mark}, 1.0, 1.0, {mark})", (session_id, owner))
        execute(f"INSERT INTO rounds (session_id, round_id, idx, user_query, state, started_at) VALUES ({mark}, 'r', 1, 'q', 'finished', 1.0)", (session_id,))


def test_a_store_remembers_it_has_had_users_once_the_last_is_removed(store: Store) -> None:
    assert not store.had_users()
    store.add_user("ana")
    store.remove_user("ana")
    assert not store.has_users() and store.had_users()


def test_the_audit_trail_and_sign_ins_are_kept_by_both_backends_and_the_trail_refuses_every_change(store: Store) -> None:
    from taskweaver_lite.store.interface import Actor, AuditEntry

    by = Actor("cli:root", "cli@host")
    store.add_user("ana", by=by)
    store.set_admin("ana", admin=True, by=by)
    store.rotate_token("ana", expires_days=2, by=by)
    store.audit(AuditEntry(at=time.time(), actor="-", action="token-refused", target="token 00", source="198.51.100.9"))
    ana = store.user_by_name("ana")
    current = store.token_id_of("ana")
    assert ana is not None and current is not None
    store.add_sign_in("a" * 32, user_id=ana.id, token_id=current, until=time.time() + 60)
    found = store.sign_in("a" * 32)
    assert found is not None and found.holds() and found.user is not None and found.user.name == "ana"
    assert store.end_sign_in("a" * 32) and not store.end_sign_in("a" * 32)
    ended = store.sign_in("a" * 32)
    assert ended is not None and not ended.holds(), "a sign-out ends it for every server on the store"
    store.add_sign_in("b" * 32, user_id=ana.id, token_id=current, until=time.time() + 60)
    store.rotate_token("ana", by=by)
    rotated = store.sign_in("b" * 32)
    assert rotated is not None and not rotated.holds(), "a new token ends the sign-ins made with the old one"
    assert [(e.actor, e.action, e.target) for e in store.audit_entries()] == [
        ("cli:root", "user-added", "ana"),
        ("cli:root", "user-promoted", "ana"),
        ("cli:root", "user-rotated", "ana"),
        ("-", "token-refused", "token 00"),
        ("cli:root", "user-rotated", "ana"),
    ]
    assert [e.action for e in store.audit_entries(limit=1)] == ["user-rotated"]
    assert store.audit_entries(since=time.time() + 5) == []
    changes = ("UPDATE audit SET actor = 'nobody'", "DELETE FROM audit") + (("TRUNCATE audit",) if isinstance(store, PostgresStore) else ())
    for change in changes:
        if isinstance(store, PostgresStore):
            with psycopg.connect(store._url) as conn, pytest.raises(psycopg.Error, match="append-only"):
                conn.execute(change)
        else:
            assert isinstance(store, SessionStore)
            with sqlite3.connect(store.path) as db, pytest.raises(sqlite3.DatabaseError, match="append-only"):
                db.execute(change)
    assert len(store.audit_entries()) == 5


@pytest.mark.postgres
def test_pg_dump_keeps_the_audit_trail(postgres_cluster: PostgresCluster, postgres_url: str) -> None:
    from taskweaver_lite.store.interface import Actor
    from taskweaver_lite.testing.postgres_cluster import binaries

    store = PostgresStore(postgres_url)
    try:
        store.add_user("dumped-user", by=Actor("cli:root", "cli@backup-host"))
    finally:
        store.close()
    bin_dir = binaries()
    assert bin_dir is not None
    import subprocess

    dump = subprocess.run([str(bin_dir / "pg_dump"), "--table=audit", postgres_url], capture_output=True, text=True, timeout=60)
    assert dump.returncode == 0, dump.stderr
    assert "dumped-user" in dump.stdout and "cli@backup-host" in dump.stdout and "user-added" in dump.stdout
