"""Traces read back from a receiver nobody here wrote: Arize Phoenix, installed by .ci/phoenix.sh in its own venv.

A chat message (the real `chat` command, a real kernel) arrives as one trace with GenAI attributes,
a cell span naming the session, and no prompt text; an API request to `serve` that carries a
`traceparent` continues that trace. Phoenix takes the spans over OTLP/HTTP and serves them back over
its REST API. Without Phoenix the tests skip, saying how to install it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import make_project, run_cli

from taskweaver_lite.config.file import load_config
from taskweaver_lite.telemetry import otel
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply
from taskweaver_lite.testing.web_server import WebServer

pytestmark = pytest.mark.otlp

VERSION = os.environ.get("PHOENIX_VERSION", "20.26.1")
PHOENIX_PYTHON = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "taskweaver-lite" / "phoenix" / VERSION / "venv" / "bin" / "python"
START_TIMEOUT = 240  # seconds: its first start migrates a new database; 74 s on a loaded two-core machine
REQUEST = "Compute the zebra-quartz total"
CODE = "zebra_quartz_total = 41 + 1\nprint(zebra_quartz_total)"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Phoenix on free ports of 127.0.0.1, its database in a temporary folder; its base URL (OTLP/HTTP at /v1/traces)."""
    if not PHOENIX_PYTHON.exists():
        pytest.skip(f"Arize Phoenix is not installed at {PHOENIX_PYTHON}: run .ci/phoenix.sh (it installs it once, in its own venv)")
    folder = tmp_path_factory.mktemp("phoenix")
    port = free_port()
    env = {**os.environ, "PHOENIX_WORKING_DIR": str(folder), "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(port)}
    env.update(PHOENIX_GRPC_PORT=str(free_port()), PHOENIX_TELEMETRY_ENABLED="false")
    with (folder / "phoenix.log").open("w") as log:
        process = subprocess.Popen([str(PHOENIX_PYTHON), "-m", "phoenix.server.main", "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _answers(f"{url}/healthz"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"Phoenix did not start in {START_TIMEOUT} s: see {folder / 'phoenix.log'}")
            time.sleep(1)
        yield url
    finally:
        process.terminate()
        process.wait(30)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def spans_of(phoenix: str, project: str, *, until: str, timeout: float = 60) -> list[dict[str, Any]]:
    """The spans Phoenix holds for `project` once one named `until` is among them (Phoenix ingests in the background)."""
    deadline = time.monotonic() + timeout
    while True:
        answer = httpx.get(f"{phoenix}/v1/projects/{project}/spans", params={"limit": 1000}, timeout=10)
        spans: list[dict[str, Any]] = answer.json().get("data", []) if answer.status_code == 200 else []
        if any(span["name"] == until for span in spans) or time.monotonic() > deadline:
            assert any(span["name"] == until for span in spans), f"no {until!r} span reached Phoenix: {[s['name'] for s in spans]}"
            return spans
        time.sleep(1)


def check_genai_calls(spans: list[dict[str, Any]], roles: list[str]) -> None:
    calls = sorted((span for span in spans if span["name"] == "chat scripted"), key=lambda span: span["start_time"])
    assert [call["attributes"]["taskweaver.role"] for call in calls] == roles
    for call in calls:
        attributes = call["attributes"]
        assert attributes["gen_ai.operation.name"] == "chat" and attributes["gen_ai.request.model"] == "scripted"
        assert attributes["gen_ai.usage.input_tokens"] > 0 and attributes["gen_ai.usage.output_tokens"] > 0
        assert 0 <= attributes["gen_ai.usage.cache_read.input_tokens"] <= attributes["gen_ai.usage.input_tokens"]


def test_a_chat_message_reaches_phoenix_as_one_trace_with_genai_spans_and_no_prompt_text(tmp_path: Path, phoenix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with ScriptedServer() as server:
        project = make_project(tmp_path, server.url, tracing={"enabled": True, "endpoint": phoenix})
        server.enqueue("planner", planner_reply("Add the numbers."), planner_reply("The total is 42.", send_to="User"))
        server.enqueue("code_generator", code_reply(CODE))
        monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "openinference.project.name=chat-test")  # Phoenix files the spans under it
        done = run_cli("chat", "-p", str(project), stdin=REQUEST + "\n", timeout=180)
    assert done.returncode == 0 and done.stdout == "The total is 42.\n", done.stderr
    spans = spans_of(phoenix, "chat-test", until="turn")
    assert len({span["context"]["trace_id"] for span in spans}) == 1, "the message is one trace"
    (turn,) = [span for span in spans if span["name"] == "turn"]
    assert turn["parent_id"] is None and turn["attributes"]["taskweaver.round.state"] == "finished"
    check_genai_calls(spans, ["planner", "code_generator", "planner"])
    (cell,) = [span for span in spans if span["name"] == "cell"]
    assert cell["attributes"]["taskweaver.session.id"] == turn["attributes"]["taskweaver.session.id"]
    assert cell["attributes"]["taskweaver.cell.success"] is True
    sent = json.dumps(spans)
    for text in ("zebra", "quartz", "Add the numbers", "The total is 42", "You are the Planner", "41 + 1"):
        assert text not in sent, f"{text!r} reached Phoenix with tracing.content off"


def test_an_api_request_with_a_traceparent_continues_its_trace_in_phoenix(tmp_path: Path, phoenix: str) -> None:
    trace_id, parent = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    with ScriptedServer() as server:
        project = make_project(tmp_path, server.url, tracing={"enabled": True, "endpoint": phoenix, "service_name": "serve-test"})
        server.enqueue("planner", planner_reply("Add the numbers."), planner_reply("The total is 42.", send_to="User"))
        server.enqueue("code_generator", code_reply(CODE))
        config = load_config(project)
        with WebServer(config) as web, httpx.Client(base_url=web.url, timeout=60) as client:
            session_id = client.post("/api/sessions", json={}).json()["id"]
            headers = {"traceparent": f"00-{trace_id}-{parent}-01"}
            with client.stream("POST", f"/api/sessions/{session_id}/messages", json={"text": REQUEST}, headers=headers, timeout=120) as response:
                lines = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
            assert lines[-1] == {"type": "answer", "text": "The total is 42.", "round": 1}
        assert otel.tracer(config.tracing).flush()
    spans = [span for span in spans_of(phoenix, "default", until="turn") if span["context"]["trace_id"] == trace_id]
    (served,) = [span for span in spans if span["name"] == "POST /api/sessions/{id}/messages"]
    assert served["parent_id"] == parent and served["attributes"]["http.response.status_code"] == 200, "the caller's span is its parent"
    (turn,) = [span for span in spans if span["name"] == "turn"]
    assert turn["parent_id"] == served["context"]["span_id"] and turn["attributes"]["taskweaver.session.id"] == session_id
    check_genai_calls(spans, ["planner", "code_generator", "planner"])
    (cell,) = [span for span in spans if span["name"] == "cell"]
    assert cell["attributes"]["taskweaver.session.id"] == session_id
    assert REQUEST not in json.dumps(spans)
