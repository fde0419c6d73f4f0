"""Sessions that survive: kill -9 mid-turn, resume with replay, export, and guarded access."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import time
from pathlib import Path

import nbformat
import pytest
from helpers import make_project, run_cli, running_cli, watch_stderr

from taskweaver_lite.config.file import load_config
from taskweaver_lite.errors import SessionBusyError
from taskweaver_lite.session.assembly import open_session, resume_session
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply, summary_reply

pytestmark = pytest.mark.cli


def planner_prompts(server: ScriptedServer) -> list[list[dict]]:
    return [r.messages for r in server.requests if r.role == "planner"]


def script_two_rounds_then_a_hang(server: ScriptedServer) -> None:
    server.set_default("compression", summary_reply("The user built totals a and b.", []))
    server.enqueue(
        "planner",
        planner_reply("Set a = 40 and print it."),
        planner_reply("a is 40.", send_to="User"),
        planner_reply("Set b = a + 2 and print it."),
        planner_reply("b is 42.", send_to="User"),
        planner_reply("Sleep for a minute."),
    )
    server.enqueue("code_generator", code_reply("a = 40\nprint(a)"), code_reply("b = a + 2\nprint(b)"), code_reply("import time\ntime.sleep(60)"))


def folded_roles(store: Path) -> set[str]:
    """The roles whose compression state, saved in the store, has folded at least one round."""
    if not store.exists():
        return set()
    try:
        with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as db:
            rows = db.execute("SELECT role, state FROM compression").fetchall()
    except sqlite3.OperationalError:  # the table is not there yet
        return set()
    return {role for role, state in rows if json.loads(state).get("folded_through", 0) >= 1}


def kill_during_third_request(project: Path) -> str:
    """Run the CLI, kill -9 it while its third request's cell runs, once both roles' folds of round 1 are saved.

    Returns what it printed. The folds run in the background: the kill waits for them, never for a time.
    """
    compress_one_keep_one = ["--set", "round_compressor.rounds_to_compress=1", "--set", "round_compressor.rounds_to_retain=1"]
    with running_cli("chat", "-p", str(project), *compress_one_keep_one) as proc:
        seen, sleeping, watcher = watch_stderr(proc, "time.sleep(60)")
        assert proc.stdin is not None
        proc.stdin.write("make a\nmake b\nnow wait\n")
        proc.stdin.flush()
        assert sleeping.wait(60), "".join(seen)
        deadline = time.monotonic() + 60
        while folded_roles(project / "sessions.db") != {"planner", "code_generator"}:
            assert time.monotonic() < deadline and proc.poll() is None, "round 1 was never folded and saved:\n" + "".join(seen)
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        watcher.join(timeout=10)  # it reads stderr to the end; the pipe closes when we leave the block
    return "".join(seen)


def test_after_kill_9_resume_brings_back_rounds_summaries_and_variables(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    script_two_rounds_then_a_hang(server)
    kill_during_third_request(project)

    server.enqueue("planner", planner_reply("Print a + b."), planner_reply("a + b = 82.", send_to="User"))
    server.enqueue("code_generator", code_reply("print(a + b)"))
    done = run_cli("chat", "-p", str(project), "--resume", "last", stdin="add them up\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "a + b = 82.\n"
    assert "Resumed session" in done.stderr and "3 earlier requests" in done.stderr
    assert "was cut off" in done.stderr and "Re-ran 2 cells" in done.stderr
    report = planner_prompts(server)[-1][-1]["content"]
    assert "82" in report, "replay rebuilt a and b in the new kernel"
    first_prompt_after_resume = planner_prompts(server)[-2]
    text = "\n".join(m["content"] for m in first_prompt_after_resume)
    assert "The user built totals a and b." in text, "the Planner's summary came back"
    assert "make b" in text, "the retained round came back verbatim"
    assert "now wait" not in text, "the cut-off round is failed and stays out of prompts"

    listing = run_cli("sessions", "-p", str(project), "--json")
    sessions = json.loads(listing.stdout)
    assert len(sessions) == 1 and sessions[0]["rounds"] == 4 and sessions[0]["title"] == "make a"


def test_resume_without_replay_tells_the_model_which_variables_are_gone(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    server.enqueue("planner", planner_reply("Set total = 7."), planner_reply("Done.", send_to="User"))
    server.enqueue("code_generator", code_reply("total = 7"))
    assert run_cli("chat", "-p", str(project), stdin="make total\n").returncode == 0

    server.enqueue("planner", planner_reply("Print total."), planner_reply("Needs recomputing.", send_to="User"))
    server.enqueue("code_generator", code_reply("total = 7\nprint(total)"))
    done = run_cli("chat", "-p", str(project), "--resume", "last", "--no-replay", stdin="print total\n")
    assert done.returncode == 0, done.stderr
    assert "gone until recomputed: total" in done.stderr
    coder_system = "\n".join(m["content"] for m in [r.messages for r in server.requests if r.role == "code_generator"][-1])
    assert "Lost in a kernel restart (recompute before use): total" in coder_system


def test_export_writes_a_notebook_that_validates_and_a_markdown_transcript(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    server.enqueue("planner", planner_reply("Print the sum of 1..4."), planner_reply("It is 10.", send_to="User"))
    server.enqueue("code_generator", code_reply("print(sum(range(1, 5)))"))
    assert run_cli("chat", "-p", str(project), stdin="sum 1 to 4\n").returncode == 0
    notebook = tmp_path / "out.ipynb"
    done = run_cli("export", "last", "-p", str(project), "--format", "ipynb", "-o", str(notebook))
    assert done.returncode == 0, done.stderr
    nb = nbformat.read(notebook, as_version=4)
    nbformat.validate(nb)
    sources = [c.source for c in nb.cells]
    assert any("sum 1 to 4" in s for s in sources) and any("print(sum(range(1, 5)))" in s for s in sources)
    markdown = tmp_path / "out.md"
    assert run_cli("export", "last", "-p", str(project), "--format", "md", "-o", str(markdown)).returncode == 0
    text = markdown.read_text()
    assert "sum 1 to 4" in text and "print(sum(range(1, 5)))" in text and "It is 10." in text


def test_a_session_open_in_one_place_cannot_be_opened_twice(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    config = load_config(project)
    with open_session(config) as first:
        done = run_cli("chat", "-p", str(project), "--resume", first.id, stdin="hello\n", timeout=30)
        assert done.returncode != 0
        assert "open in another taskweaver-lite process" in done.stderr and "Traceback" not in done.stderr
        with pytest.raises(SessionBusyError):
            resume_session(config, first.id)


def test_a_history_command_shows_folded_rounds_in_full(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url, round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1})
    server.set_default("compression", summary_reply("Greetings were exchanged.", []))
    for n in range(4):
        server.enqueue("planner", planner_reply(f"Reply {n}.", send_to="User"))
    config = load_config(project)
    with open_session(config) as session:
        for n in range(3):
            session.ask(f"Message {n}")
            assert session.contexts()["planner"].wait_idle(timeout=10)
        assert session.contexts()["planner"].state.folded_through >= 1, "round 1 was folded out of the prompts"
        session.ask("Message 3")
        from taskweaver_lite.cli.chat import round_transcript

        history = "\n".join(round_transcript(r) for r in session.conversation.rounds)
    last_prompt = "\n".join(m["content"] for m in planner_prompts(server)[-1])
    assert "Message 0" not in last_prompt and "Greetings were exchanged." in last_prompt
    assert all(f"Message {n}" in history and f"Reply {n}." in history for n in range(4)), "/history shows every round in full"


@pytest.mark.parametrize("damage", ["garbage", "newer"])
def test_a_corrupted_or_newer_store_gives_a_clear_error(tmp_path: Path, damage: str) -> None:
    project = make_project(tmp_path, "http://127.0.0.1:9/v1")
    db = project / "sessions.db"
    if damage == "garbage":
        db.write_bytes(b"this is not a database" * 100)
    else:
        with sqlite3.connect(db) as conn:
            conn.execute("PRAGMA user_version = 999")
    done = run_cli("sessions", "-p", str(project), timeout=30)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert str(db) in done.stderr
    assert ("newer" in done.stderr) if damage == "newer" else ("not a readable session store" in done.stderr)
