"""Trying it without a model: `demo --chat`, `serve --demo`, and the error that points at them."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from helpers import cli_env, run_cli
from test_serve_start import serving

from taskweaver_lite.cli.demo_model import DemoModel, match_step
from taskweaver_lite.config.file import load_config
from taskweaver_lite.config.settings import Config
from taskweaver_lite.llm.discovery import KNOWN_SERVERS, LocalServer, discover, no_model_found
from taskweaver_lite.store.database import SessionStore, stored_sessions

pytestmark = pytest.mark.cli


def test_demo_chat_answers_the_scripted_requests_by_words_or_number_and_lists_them_otherwise(tmp_path: Path) -> None:
    asked = "which region grew its revenue fastest from 2023 to 2024\n4\nwhat is the weather\n"
    done = run_cli("demo", "--chat", "-p", str(tmp_path / "demo"), stdin=asked, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "**South +18.9%** is the fastest-growing region" in done.stdout, "real code ran on the loaded sales.csv, asked in any order"
    assert "**Software 52.0%** has the best profit margin" in done.stdout
    assert "I can answer these requests" in done.stdout and "3. Plot monthly revenue by region and save the chart." in done.stdout
    assert "<data>" not in done.stdout, "the prompt's data markers stay out of the answers"


def test_a_requests_number_is_stored_as_the_request_it_numbers_and_a_resume_after_model_goes_on(tmp_path: Path) -> None:
    done = run_cli("demo", "--chat", "-p", str(tmp_path / "demo"), stdin="/model scripted-demo\n4\n", timeout=180)
    assert done.returncode == 0, done.stderr
    assert "**Software 52.0%** has the best profit margin" in done.stdout
    assert (done.stdout + done.stderr).count("4. Which product category has the best profit margin?") == 1, "the chat lists the requests once"
    config = load_config(tmp_path / "demo")
    (entry,) = stored_sessions(config.store_path)
    assert entry.title == "Which product category has the best profit margin?"
    store = SessionStore(config.store_path, read_only=True)
    try:
        (rnd,) = store.load(entry.id).rounds
    finally:
        store.close()
    assert rnd.user_query == "Which product category has the best profit margin?", "the round holds the request, not its number"
    # /model was remembered with the session; the resume command it printed keeps the demo's own model and address under it.
    again = run_cli("demo", "--chat", "-p", str(tmp_path / "demo"), "--resume", "last", stdin="4\n", timeout=180)
    assert f"Resumed session {entry.id}: 1 earlier request." in again.stderr + again.stdout
    assert again.returncode == 0, again.stderr
    assert "**Software 52.0%** has the best profit margin" in again.stdout, again.stderr


def test_serve_demo_answers_on_the_page_api_with_the_sample_data_loaded(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with serving("--demo", "-p", str(tmp_path / "demo"), "--port", str(port)) as (_, line):
        assert "serving" in line, line
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            session = client.post("/api/sessions").json()["id"]
            with client.stream("POST", f"/api/sessions/{session}/messages", json={"text": "1"}) as stream:
                events = [json.loads(row[6:]) for row in stream.iter_lines() if row.startswith("data: ")]
            state = client.get(f"/api/sessions/{session}").json()
    assert [r["text"] for r in state["rounds"]] == ["Load sales.csv and give me a quick overview of what's in it."], "the request, not '1'"
    assert state["suggested_requests"][0] == "Load sales.csv and give me a quick overview of what's in it."
    answer = events[-1]
    assert answer["type"] == "answer", events[-3:]
    assert "holds 288 rows" in answer["text"]


def test_the_demo_model_matches_close_wordings_and_numbers_only() -> None:
    assert match_step("Do discounts drive more units sold") is not None
    assert match_step("note about a file\n\nwere there unusual months for any region") is match_step("Were there unusual months for any region?")
    assert match_step("tell me a joke") is None
    reply = json.loads(DemoModel().planner([{"role": "user", "content": "tell me a joke"}]))["response"]
    assert reply["send_to"] == "User" and "1. Load sales.csv" in reply["message"]


def test_the_no_model_error_says_what_discovery_tried_and_names_demo_models_and_the_settings() -> None:
    text = no_model_found(Config(), [])
    for name, port in KNOWN_SERVERS:
        assert f"{name} :{port}" in text
    for part in ("llm.api_key", "OPENAI_API_KEY", "llm.api_base", "OPENAI_BASE_URL", "taskweaver-lite models", "taskweaver-lite demo --chat"):
        assert part in text
    other = no_model_found(Config.model_validate({"llm": {"model": "mistral"}}), [LocalServer("Ollama", "http://127.0.0.1:11434/v1", ("llama3.2",))])
    assert "do not serve llm.model 'mistral'" in other and "Ollama at http://127.0.0.1:11434/v1 serves llama3.2" in other


def test_chat_with_no_model_anywhere_stops_with_that_line(tmp_path: Path) -> None:
    if discover():
        pytest.skip("a local model server answers here")
    project = tmp_path / "project"
    project.mkdir()
    (project / "taskweaver_config.yaml").write_text(yaml.safe_dump({"execution": {"timeout": 30}}), encoding="utf-8")
    done = run_cli("chat", "-p", str(project), stdin="hi\n")
    assert done.returncode == 1
    assert "No model to talk to" in done.stderr and "demo --chat" in done.stderr and "tried Ollama :11434" in done.stderr


def test_a_serve_demo_that_fails_leaves_no_temporary_folder(tmp_path: Path) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "taskweaver_lite", "serve", "--demo", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**cli_env(), "TMPDIR": str(temp)},
        )
    assert done.returncode != 0 and "already in use" in done.stderr, done.stderr
    assert not [path.name for path in temp.iterdir() if path.name.startswith("taskweaver-demo-")], "the demo's folder went with it"
    assert "The scripted model answers" not in done.stderr, "the busy port is the only thing said"


def test_serve_demo_opens_on_a_new_session_and_stopped_keeps_the_pages_sessions_saying_where(tmp_path: Path) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    for _ in range(3):  # a free port may be taken by another test's server or kernel before `serve` binds it: then another
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        command = [sys.executable, "-m", "taskweaver_lite", "serve", "--demo", "--port", str(port)]
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**cli_env(), "TMPDIR": str(temp)})
        assert proc.stderr is not None
        said = [proc.stderr.readline()]
        while "serving" not in said[-1] and said[-1]:  # the start line, after the request list
            said.append(proc.stderr.readline())
        if "already in use" not in said[0]:
            break
        proc.wait(30)
    with proc:
        assert proc.stderr is not None
        start = said[-1]
        assert any("The scripted model answers these requests" in line for line in said), said
        assert start.rstrip().endswith(f"http://127.0.0.1:{port}/#new"), "the link opens the page on a new session"
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            session = client.post("/api/sessions").json()["id"]
            with client.stream("POST", f"/api/sessions/{session}/messages", json={"text": "1"}) as stream:
                list(stream.iter_lines())
        proc.terminate()
        rest = proc.stderr.read()
        proc.wait(60)
    [folder] = [path for path in temp.iterdir() if path.name.startswith("taskweaver-demo-")]
    assert (folder / "sessions.db").is_file(), "the page's session is kept"
    assert f"The demo's 1 session stay in {folder}: `taskweaver-lite serve --demo -p {folder}` goes on with them" in rest, rest


def test_a_demo_chat_says_how_to_continue_it_and_continues(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    first = run_cli("demo", "--chat", "-p", str(folder), stdin="1\n", timeout=180)
    assert first.returncode == 0, first.stderr
    hint = re.search(r"Continue it with: taskweaver-lite demo --chat -p (\S+) --resume (\S+)", first.stderr)
    assert hint is not None and hint.group(1) == str(folder), first.stderr[-600:]
    again = run_cli("demo", "--chat", "-p", str(folder), "--resume", hint.group(2), stdin="2\n", timeout=180)
    assert again.returncode == 0, again.stderr
    assert "**South +18.9%** is the fastest-growing region" in again.stdout, "the resumed session goes on with the demo's model"
    assert f"--resume {hint.group(2)}" in again.stderr


def test_save_in_the_demo_chat_distils_tips_on_the_scripted_model(tmp_path: Path) -> None:
    done = run_cli("demo", "--chat", "-p", str(tmp_path / "demo"), stdin="2\n/save\n/experience\n", timeout=180)
    assert done.returncode == 0, done.stderr
    assert "HTTP 500" not in done.stderr and "scripted server" not in done.stderr, done.stderr[-800:]
    assert "Saved 1 tip" in done.stderr, done.stderr[-800:]
    tips = done.stderr.split("Saved 1 tip")[1]
    assert "Which region grew its revenue fastest" in tips, "the tip comes from what the session asked (by number)"
