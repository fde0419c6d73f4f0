"""Hostile model servers, seen from a session and the CLI: a broken reply fails the round
with one clear line instead of leaving it running, a huge bad reply is cut so its repair turn fits
the window, and credentials inside `llm.api_base` reach neither the terminal nor the store.
The client-level cases (cut-off bodies, dripped replies, Retry-After...) are in test_llm.py."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from pathlib import Path

import pytest
from helpers import make_project, run_cli

from taskweaver_lite.config.file import load_config
from taskweaver_lite.errors import LLMError
from taskweaver_lite.llm.tokens import get_tokenizer
from taskweaver_lite.records.model_calls import Message
from taskweaver_lite.session import assembly
from taskweaver_lite.session.session import Session
from taskweaver_lite.testing.scripted_server import Reply, ScriptedServer, planner_reply

pytestmark = pytest.mark.kernel


def open_session(tmp_path: Path, server: ScriptedServer, **sections: Mapping[str, object]) -> Session:
    return assembly.open_session(load_config(make_project(tmp_path, server.url, **sections)))


def stored_rounds(store: Path) -> list[tuple[str, str | None]]:
    with sqlite3.connect(store) as db:
        return [(state, error) for state, error in db.execute("SELECT state, error FROM rounds ORDER BY seq")]


def test_a_cut_off_reply_body_fails_the_round_with_one_line_instead_of_leaving_it_running(tmp_path: Path, server: ScriptedServer) -> None:
    server.enqueue("planner", *[Reply(raw_body='{"choices": [')] * 2)
    with open_session(tmp_path, server, llm={"max_retries": 1}) as session:
        store = session.config.store_path
        with pytest.raises(LLMError, match=r"not valid JSON \(cut off\?\).*after 1 retry"):
            session.ask("How many rows?")
        [rnd] = session.conversation.rounds
        assert rnd.state == "failed"
    [(state, error)] = stored_rounds(store)
    assert state == "failed" and error is not None and "not valid JSON" in error


def test_a_2_mb_bad_reply_is_cut_so_the_repair_request_fits_the_window(tmp_path: Path, server: ScriptedServer) -> None:
    huge = "Sure, here is my plan. " + "blah " * 400_000  # 2 MB, about 400k tokens, not JSON
    server.enqueue("planner", huge, planner_reply("Done.", send_to="User"))
    window, reserve = 16_000, 2_000
    # A 2 MB reply takes seconds to stream on a loaded machine: past the tests' usual 10 s, the call would be sent
    # again and the scripted "Done." would answer the resend, with no repair turn to check.
    with open_session(tmp_path, server, llm={"context_window": window, "reply_reserve": reserve, "timeout": 90}) as session:
        rnd = session.ask("Plan something.")
    assert rnd.state == "finished" and rnd.answer == "Done.", rnd.error
    planner = [r.messages for r in server.requests if r.role == "planner"]
    first, repair = planner[0], planner[-1]
    assert first[-1]["content"] != repair[-1]["content"], "the last call is the repair turn"
    echoed = repair[-2]
    assert echoed["role"] == "assistant" and "tokens left out here" in echoed["content"]
    sent = [Message(role=m["role"], content=m["content"]) for m in repair]
    assert get_tokenizer().count_messages(sent) <= window - reserve, "the repair request fits the window"


def test_credentials_inside_the_api_base_reach_neither_the_terminal_nor_the_store(tmp_path: Path, server: ScriptedServer) -> None:
    password, query_key = "pw-in-the-url-424242", "key-in-the-query-737373"
    port = server.url.split(":")[2].split("/")[0]
    # The query spoils the request path, so the server answers 404 and echoes the path, key included.
    address = f"http://alice:{password}@127.0.0.1:{port}/v1?api-key={query_key}"
    project = make_project(tmp_path, address, llm={"max_retries": 0})
    done = run_cli("chat", "-p", str(project), stdin="hello\n")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "***@127.0.0.1" in done.stderr and "api-key=***" in done.stderr, done.stderr
    failure = next(line for line in done.stderr.splitlines() if line.startswith("taskweaver-lite: "))
    assert stored_rounds(project / "sessions.db") == [("failed", failure.removeprefix("taskweaver-lite: "))]
    written = [path for path in project.rglob("*") if path.is_file() and path.name != "taskweaver_config.yaml"]
    stored = b"".join(path.read_bytes() for path in written)
    for secret in (password, query_key):
        assert secret not in done.stderr and secret not in done.stdout
        assert secret.encode() not in stored
