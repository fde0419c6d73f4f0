"""The session store: a real session recorded and loaded back, crashes, two processes, bad files, migrations."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import REPO
from recorded_session import PLOT_CODE, WRITE_CODE, RecordedSession, record_session

from taskweaver_lite.errors import SessionBusyError, StoreError
from taskweaver_lite.records.conversation import Conversation, Post, Round, RoundState
from taskweaver_lite.records.events import Folded, ModelCalled, PostAdded, RoundEnded, RoundStarted, Working
from taskweaver_lite.records.execution import ExecutionResult, Variable
from taskweaver_lite.store import recorder as recorder_module
from taskweaver_lite.store.database import SessionStore
from taskweaver_lite.store.interface import Store
from taskweaver_lite.store.postgres import PostgresStore
from taskweaver_lite.store.recorder import StoreRecorder
from taskweaver_lite.store.schema import MIGRATIONS, SCHEMA_VERSION, migrate

pytestmark = pytest.mark.unit

# Records rounds of three posts in a loop and prints how many events are committed after each one.
WRITER = """
import sys, time
from pathlib import Path
from typing import Iterator
from taskweaver_lite.records.conversation import Post, Round
from taskweaver_lite.records.events import PostAdded, RoundEnded, RoundStarted
from taskweaver_lite.records.execution import ExecutionResult
from taskweaver_lite.store.database import SessionStore

store = SessionStore(Path(sys.argv[1]))
session_id, limit = sys.argv[2], int(sys.argv[3])
store.create_session(session_id, started=time.time())
committed = 0

def recorded(event):
    global committed
    store.record(session_id, event)
    committed += 1
    print(committed, flush=True)

index = 0
while committed < limit:
    index += 1
    rnd = Round(index=index, user_query=f"request {index}")
    recorded(RoundStarted(rnd))
    for n in range(3):
        code = f"x{index}_{n} = {n}"
        post = Post("CodeInterpreter", "Planner", f"ran {code}", code=code, execution=ExecutionResult(code=code, success=True, stdout="out " * 50))
        rnd.posts.append(post)
        recorded(PostAdded(rnd, post))
    rnd.state = "finished"
    recorded(RoundEnded(rnd))
"""

HOLDER = """
import sys, time
from pathlib import Path
from typing import Iterator
from taskweaver_lite.store.database import SessionStore

lock = SessionStore(Path(sys.argv[1])).lock(sys.argv[2])
print("locked", flush=True)
time.sleep(120)
"""


def start_python(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True, cwd=REPO)


def stored_events(path: Path, session_id: str) -> int:
    """Events of the WRITER script found in the file: round starts, posts, round ends."""
    with sqlite3.connect(path) as db:
        rounds = db.execute("SELECT COUNT(*) FROM rounds WHERE session_id = ?", (session_id,)).fetchone()[0]
        posts = db.execute("SELECT COUNT(*) FROM posts WHERE session_id = ?", (session_id,)).fetchone()[0]
        ended = db.execute("SELECT COUNT(*) FROM rounds WHERE session_id = ? AND state = 'finished'", (session_id,)).fetchone()[0]
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    return int(rounds + posts + ended)


def table_rows(store: Store, sql: str) -> list[tuple[Any, ...]]:
    """Rows read straight from the store's database, past its interface (to see what it really keeps)."""
    if isinstance(store, SessionStore):
        with sqlite3.connect(store.path) as db:
            return [tuple(row) for row in db.execute(sql).fetchall()]
    assert isinstance(store, PostgresStore)
    with psycopg.connect(store._url) as conn:
        return [tuple(row) for row in conn.execute(sql).fetchall()]


def code_post(code: str, *, success: bool = True, variables: tuple[str, ...] = ()) -> Post:
    result = ExecutionResult(code=code, success=success, variables=tuple(Variable(n, "int", "1") for n in variables))
    return Post("CodeInterpreter", "Planner", "ran it", code=code, execution=result)


def record_round(store: Store, session_id: str, index: int, query: str, posts: list[Post], *, state: RoundState | None = "finished") -> Round:
    rnd = Round(index=index, user_query=query)
    store.record(session_id, RoundStarted(rnd))
    for post in posts:
        rnd.posts.append(post)
        store.record(session_id, PostAdded(rnd, post))
    if state is not None:
        rnd.state = state
        rnd.error = "it broke" if state == "failed" else None
        store.record(session_id, RoundEnded(rnd))
    return rnd


# --- a real session, recorded and loaded back --------------------------------------------------


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> RecordedSession:
    return record_session(tmp_path_factory.mktemp("recorded"))


@pytest.mark.kernel  # the recorded session ran in a real kernel
def test_a_recorded_session_loads_back_round_for_round_with_summaries_and_usage(recorded: RecordedSession) -> None:
    store = SessionStore(recorded.store_path)
    stored = store.load(store.resolve("last"))
    assert stored.id == recorded.session_id
    assert [r.to_dict() for r in stored.rounds] == recorded.rounds
    assert stored.compression == recorded.states and stored.compression["planner"]["folded_through"] == 1
    assert (stored.usage.calls, stored.usage.prompt_tokens, stored.usage.completion_tokens) == (
        recorded.usage.calls,
        recorded.usage.prompt_tokens,
        recorded.usage.completion_tokens,
    )
    assert [v.name for v in stored.last_variables] == ["df"] and stored.interrupted == ()
    artifacts = [a for r in stored.rounds for p in r.posts for a in p.artifacts]
    assert len(artifacts) == 1 and artifacts[0].endswith(".png") and Path(artifacts[0]).is_file()
    store.close()


@pytest.mark.kernel  # the recorded session ran in a real kernel
def test_the_replay_gets_the_successful_cells_in_the_order_they_ran(recorded: RecordedSession) -> None:
    store = SessionStore(recorded.store_path)
    assert store.successful_cells(recorded.session_id) == [WRITE_CODE, PLOT_CODE]  # the NameError attempt is left out
    store.close()


@pytest.mark.kernel  # the recorded session ran in a real kernel
def test_sessions_list_newest_first_with_title_rounds_and_times(recorded: RecordedSession) -> None:
    store = SessionStore(recorded.store_path)
    store.create_session("older", started=1_000.0)
    record_round(store, "older", 1, "an old question", [])
    with sqlite3.connect(store.path) as db:  # pin its activity time: recording stamps it with now
        db.execute("UPDATE sessions SET last_active = 1000.0 WHERE id = 'older'")
    [newest, older] = store.list_sessions()
    assert newest.id == recorded.session_id and newest.rounds == 2 and newest.started <= newest.last_active
    assert newest.title == "Make a small table of the numbers 1 to 3 and save it as…"
    assert older.to_dict() == {"id": "older", "title": "an old question", "rounds": 1, "started": 1_000.0, "last_active": 1_000.0, "owner": None}
    store.close()


# --- sessions, rounds and events ------------------------------------------------------------------


def test_ids_resolve_from_last_an_exact_id_or_a_unique_prefix(store: Store) -> None:
    for number, session_id in enumerate(["20250101-a", "20250102-b", "20250102-c"]):
        store.create_session(session_id, started=100.0 + number)
        record_round(store, session_id, 1, f"question {number}", [])
    store.record("20250101-a", ModelCalled("planner", 1, 1, 0.1, ok=True))  # a write that starts no round: not what `last` goes by
    assert store.resolve("last") == "20250102-c"
    record_round(store, "20250101-a", 2, "one more question", [])  # a new request: now the most recently active
    assert store.resolve("last") == "20250101-a"
    assert store.resolve("20250102-b") == "20250102-b" and store.resolve("20250101") == "20250101-a"
    with pytest.raises(StoreError, match="matches several sessions"):
        store.resolve("20250102")
    with pytest.raises(StoreError, match=r"no session 'nope' .*run `taskweaver-lite sessions` to see the ids"):
        store.resolve("nope")


def test_sessions_without_a_round_are_not_listed_and_never_last(store: Store) -> None:
    store.create_session("real", started=100.0)
    record_round(store, "real", 1, "sum the sales", [code_post("total = 1")])
    store.create_session("left-at-once", started=time.time())  # newer and more recently active, but empty
    store.create_session("failed-start", started=time.time())
    store.record("failed-start", ModelCalled("planner", 0, 0, 0.1, ok=False, error="unreachable"))  # activity is not a round
    assert [row.id for row in store.list_sessions()] == ["real"]
    assert store.resolve("last") == "real"
    assert store.resolve("left-at-once") == "left-at-once", "an empty session named outright still resolves"
    assert store.load("left-at-once").rounds == []


def test_last_is_a_clear_error_when_no_session_has_a_round(store: Store) -> None:
    with pytest.raises(StoreError, match=rf"there are no stored sessions in {re.escape(store.where)} yet"):
        store.resolve("last")
    store.create_session("left-at-once", started=time.time())
    assert store.list_sessions() == []
    with pytest.raises(StoreError, match=rf"there are no stored sessions in {re.escape(store.where)} yet"):
        store.resolve("last")


def test_a_round_left_running_by_a_crash_is_reported_then_marked_failed(store: Store) -> None:
    store.create_session("s", started=time.time())
    record_round(store, "s", 1, "first", [code_post("a = 1", variables=("a",))])
    record_round(store, "s", 2, "second", [code_post("b = 2", variables=("a", "b"))], state=None)
    assert store.load("s").interrupted == (2,)
    assert store.mark_interrupted("s") == (2,)
    stored = store.load("s")
    assert stored.interrupted == () and [r.state for r in stored.rounds] == ["finished", "failed"]
    assert stored.rounds[1].error == "Cut off: the program stopped during this request."
    assert [v.name for v in stored.last_variables] == ["a", "b"]
    assert store.successful_cells("s") == ["a = 1", "b = 2"]  # the kernel ran both, whatever became of round 2


def test_cells_of_failed_rounds_replay_but_failed_cells_do_not(store: Store) -> None:
    store.create_session("s", started=time.time())
    record_round(store, "s", 1, "one", [code_post("a = 1"), code_post("oops", success=False)], state="failed")
    record_round(store, "s", 2, "two", [code_post("b = a + 1")])
    assert store.successful_cells("s") == ["a = 1", "b = a + 1"]


def test_prompt_text_is_kept_only_when_the_call_carries_it(store: Store) -> None:
    store.create_session("s", started=time.time())
    store.record("s", ModelCalled("planner", 10, 2, 0.5, ok=True))
    store.record("s", ModelCalled("planner", 12, 3, 0.5, ok=True, prompt=({"role": "user", "content": "hi"},), reply="{}"))
    store.record("s", ModelCalled("code_generator", 0, 0, 0.1, ok=False, error="unreachable"))
    store.record("s", Working("planner_thinking"))
    rows = table_rows(store, "SELECT prompt, reply, ok, error FROM model_calls ORDER BY seq")
    assert rows == [(None, None, 1, None), ('[{"role": "user", "content": "hi"}]', "{}", 1, None), (None, None, 0, "unreachable")]
    usage = store.load("s").usage
    assert (usage.calls, usage.failed_calls, usage.prompt_tokens, usage.completion_tokens) == (3, 1, 22, 5)


def test_recording_into_an_unknown_session_is_a_clear_error(store: Store) -> None:
    with pytest.raises(StoreError, match=rf"session ghost is not in {re.escape(store.where)}"):
        store.record("ghost", ModelCalled("planner", 1, 1, 0.1, ok=True))


def test_the_recorder_takes_events_from_many_threads_at_once(store: Store) -> None:
    store.create_session("s", started=time.time())
    recorder = StoreRecorder(store, "s")

    def calls() -> None:
        for _ in range(50):
            recorder(ModelCalled("compression_planner", 3, 1, 0.01, ok=True))

    threads = [threading.Thread(target=calls) for _ in range(6)]
    for thread in threads:
        thread.start()
    record_round(store, "s", 1, "meanwhile", [code_post(f"v{n} = {n}") for n in range(20)])
    for thread in threads:
        thread.join()
    recorder.flush()  # the session closes: the calls' records are written
    stored = store.load("s")
    assert (stored.usage.calls, stored.usage.prompt_tokens) == (300, 900) and len(stored.rounds[0].posts) == 20


def test_a_cell_starting_does_not_write_the_call_that_wrote_it_alone(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    store.create_session("s", started=time.time())
    recorder = StoreRecorder(store, "s")
    recorder(ModelCalled("code_generator", 7, 2, 0.05, ok=True))
    recorder(Working("code_running"))  # progress: shown, never recorded
    assert store.load("s").usage.calls == 0, "a progress event wrote the held call in a write of its own"
    monkeypatch.setattr(recorder_module, "HOLD_AT_MOST", 0.0)  # a cell that has run (and printed) a while
    recorder(Working("code_running"))
    assert store.load("s").usage.calls == 1, "a call held through a long cell is written at its next progress"


def test_a_model_calls_record_is_written_with_the_post_its_reply_became(store: Store) -> None:
    store.create_session("s", started=time.time())
    recorder = StoreRecorder(store, "s")
    rnd = Conversation().start_round("hello")
    recorder(RoundStarted(rnd))
    recorder(ModelCalled("planner", 7, 2, 0.05, ok=True))
    assert store.load("s").usage.calls == 0, "held until the reply is a post: one transaction for both"
    answer = Post(send_from="Planner", send_to="User", message="Hi.")
    rnd.posts.append(answer)
    recorder(PostAdded(rnd, answer))
    stored = store.load("s")
    assert stored.usage.calls == 1 and stored.rounds[0].posts[-1].message == "Hi."
    assert stored.rounds[0].state == "finished", "the answer and its round's end are one write"
    recorder(ModelCalled("compression_planner", 3, 1, 0.01, ok=True))
    recorder.flush()  # the session closes with a record still held
    assert store.load("s").usage.calls == 2


def test_a_store_failure_in_a_fold_thread_reaches_the_session_thread(store: Store) -> None:
    recorder = StoreRecorder(store, "later")
    fold = Folded("planner", 1, 2, 100, 10, ok=True)
    thread = threading.Thread(target=recorder, args=(fold,))
    thread.start()
    thread.join()  # the background thread is not the place to raise: the session would never hear of it
    store.create_session("later", started=time.time())
    with pytest.raises(StoreError, match="session later is not in"):
        recorder(ModelCalled("planner", 1, 1, 0.1, ok=True))
    recorder.flush()
    assert store.load("later").usage.calls == 1, "the event itself is still recorded"


def test_a_fold_saves_the_roles_new_compression_state(store: Store) -> None:
    store.create_session("s", started=time.time())
    state = {"summary": "they loaded data", "variables": [], "lost": [], "folded_through": 2, "log": []}
    recorder = StoreRecorder(store, "s", compression_state=lambda role: state if role == "planner" else None)
    recorder(Folded("planner", 1, 2, 900, 80, ok=True))
    store.save_compression("s", "code_generator", {**state, "folded_through": 1})
    store.save_compression("s", "code_generator", {**state, "folded_through": 2})  # replaces, not appends
    assert store.load("s").compression == {"planner": state, "code_generator": state}


# --- crashes and other processes --------------------------------------------------------------------


@pytest.mark.cli  # starts writer processes: not the quick tier
@pytest.mark.parametrize("kill_after", [37, 250])
def test_kill_9_while_writing_keeps_every_committed_event_and_a_sound_file(tmp_path: Path, kill_after: int) -> None:
    path = tmp_path / "sessions.db"
    writer = start_python(WRITER, str(path), "s", "1000000")
    assert writer.stdout is not None
    committed = 0
    while committed < kill_after:
        committed = int(writer.stdout.readline())
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    committed = max([committed, *(int(line) for line in writer.stdout.read().split())])
    writer.stdout.close()
    found = stored_events(path, "s")
    assert committed <= found <= committed + 1, "at most the event in flight may be missing from the printout"
    store = SessionStore(path)
    stored = store.load("s")
    if stored.interrupted:
        assert store.mark_interrupted("s") == (len(stored.rounds),)
    assert all(r.state == "finished" for r in store.load("s").rounds[:-1])
    store.close()


@pytest.mark.cli  # starts writer processes: not the quick tier
def test_a_session_open_in_another_process_is_refused_until_that_process_dies(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = SessionStore(path)
    store.create_session("s1", started=time.time())
    holder = start_python(HOLDER, str(path), "s1")
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(SessionBusyError) as busy:
            store.lock("s1")
        assert f"session s1 is open in another taskweaver-lite process (pid {holder.pid})" in str(busy.value)
        with store.lock("s2"):
            pass  # other sessions stay free
    finally:
        holder.kill()  # kill -9: the lock must not outlive the process
        holder.communicate()
    with store.lock("s1") as lock:
        assert lock.path == path.parent / "sessions.db.locks" / "s1.lock"
        assert (path.parent / "sessions.db.locks" / "s1.owner").read_text().strip() == str(os.getpid())
    lock.release()
    store.close()


@pytest.mark.cli  # starts writer processes: not the quick tier
def test_two_processes_writing_at_once_keep_every_event_of_both(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    SessionStore(path).close()  # both writers find the schema in place, as two CLIs on one project would
    writers = [start_python(WRITER, str(path), name, "400") for name in ("left", "right")]
    for writer in writers:
        out, _ = writer.communicate(timeout=60)
        assert writer.returncode == 0 and out.split()[-1] == "400"
    assert stored_events(path, "left") == stored_events(path, "right") == 400


# --- bad files and schema versions ------------------------------------------------------------------


def test_a_file_that_is_not_a_database_gives_a_clear_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    path.write_bytes(b"definitely not SQLite\n" * 300)
    with pytest.raises(StoreError) as error:
        SessionStore(path)
    assert str(path) in str(error.value) and "move it aside" in str(error.value)


def test_a_damaged_database_gives_a_clear_error_instead_of_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = SessionStore(path)
    store.create_session("s", started=time.time())
    record_round(store, "s", 1, "q", [code_post("x = 1" * 2000) for _ in range(20)])
    store.close()
    data = bytearray(path.read_bytes())
    data[4096 * 2 : 4096 * 6] = b"\xff" * (4096 * 4)  # clobber pages of the tables
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=f"{path}.*move it aside"):
        reopened = SessionStore(path)
        try:
            reopened.load("s")
        finally:
            reopened.close()


def test_a_store_from_a_newer_version_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    SessionStore(path).close()
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError) as error:
        SessionStore(path)
    message = str(error.value)
    assert f"schema version {SCHEMA_VERSION + 1}" in message and "upgrade taskweaver-lite" in message and str(path) in message
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1


def test_another_programs_sqlite_file_is_not_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE notes (text TEXT)")
    with pytest.raises(StoreError, match="not a taskweaver-lite session store"):
        SessionStore(path)


def test_an_empty_version_0_file_is_migrated_to_the_current_schema(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    sqlite3.connect(path).close()
    store = SessionStore(path)
    store.create_session("s", started=1.0)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == len(MIGRATIONS)
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.close()


def test_an_older_store_is_upgraded_step_by_step_and_keeps_its_sessions(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = SessionStore(path)
    store.create_session("s", started=1.0)
    record_round(store, "s", 1, "keep me", [code_post("a = 1")])
    store.close()
    next_version = [*MIGRATIONS, ("ALTER TABLE sessions ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0", "UPDATE sessions SET pinned = 1")]
    with sqlite3.connect(path, isolation_level=None) as db:
        assert migrate(db, next_version, path=path) == SCHEMA_VERSION + 1
        assert db.execute("SELECT id, pinned FROM sessions").fetchall() == [("s", 1)]
        assert db.execute("SELECT user_query FROM rounds").fetchall() == [("keep me",)]


def test_a_migration_step_that_fails_leaves_the_store_at_its_old_version(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    SessionStore(path).close()
    broken = [*MIGRATIONS, ("ALTER TABLE sessions ADD COLUMN pinned INTEGER", "ALTER TABLE no_such_table ADD COLUMN x")]
    with sqlite3.connect(path, isolation_level=None) as db:
        with pytest.raises(sqlite3.OperationalError):
            migrate(db, broken, path=path)
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert "pinned" not in [row[1] for row in db.execute("PRAGMA table_info(sessions)")]
