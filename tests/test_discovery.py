"""Local models without configuration: servers on the usual ports found quickly, used when nothing
else is set, listed by `taskweaver-lite models`."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from helpers import make_project, run_cli

from taskweaver_lite.config.settings import Config
from taskweaver_lite.llm.discovery import KNOWN_SERVERS, LocalServer, discover, probe, use_local_server
from taskweaver_lite.testing.scripted_server import ScriptedServer, planner_reply

pytestmark = pytest.mark.cli


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_server_on_a_candidate_port_is_found_with_its_models_and_closed_ports_are_skipped() -> None:
    with ScriptedServer(model="llama3.2") as server:
        port = int(server.url.split(":")[2].split("/")[0])
        found = discover([("Nothing", free_port()), ("Ollama", port)])
    assert [(s.name, s.api_base, s.models) for s in found] == [("Ollama", f"http://127.0.0.1:{port}/v1", ("llama3.2",))]


def test_a_port_that_accepts_but_never_answers_delays_start_up_by_at_most_the_wait() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # connections are accepted by the kernel, never answered
        started = time.monotonic()
        assert discover([("Silent", silent.getsockname()[1])], wait_at_most=0.2) == []
        assert time.monotonic() - started < 0.35
        assert probe("Silent", silent.getsockname()[1], timeout=0.05) is None


@pytest.fixture
def local_server() -> Iterator[tuple[str, ScriptedServer]]:
    """A scripted server on the default port of one of the known local servers (the first that is free here)."""
    for name, port in KNOWN_SERVERS:
        if probe(name, port) is not None:
            pytest.skip(f"a real {name} answers on port {port} here")
        try:
            server = ScriptedServer(port=port).start()
        except OSError:
            continue  # taken by something that is not a model server
        try:
            yield name, server
        finally:
            server.stop()
        return
    pytest.skip("none of the known local-server ports is free")


def test_with_no_key_and_no_address_the_chat_uses_a_local_server_and_says_so(tmp_path: Path, local_server: tuple[str, ScriptedServer]) -> None:
    name, server = local_server
    project = make_project(tmp_path, server.url)
    (project / "taskweaver_config.yaml").write_text(yaml.safe_dump({"execution": {"timeout": 30}}), encoding="utf-8")
    server.enqueue("planner", planner_reply("Hello from the local model.", send_to="User"))
    done = run_cli("chat", "-p", str(project), stdin="hi\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Hello from the local model.\n"
    assert f"No API key or llm.api_base set: using {name} at {server.url} with model scripted-model." in done.stderr
    assert server.requests[-1].body["model"] == "scripted-model"


def test_models_lists_the_reachable_local_servers(local_server: tuple[str, ScriptedServer]) -> None:
    name, server = local_server
    done = run_cli("models", "--json")
    assert done.returncode == 0, done.stderr
    assert {"name": name, "api_base": server.url, "models": ["scripted-model"]} in json.loads(done.stdout)
    plain = run_cli("models")
    assert f"{name} at {server.url}: scripted-model" in plain.stdout


def test_the_default_model_gives_way_to_the_servers_but_a_named_one_must_be_served() -> None:
    servers = [LocalServer("Ollama", "http://127.0.0.1:11434/v1", ("llama3.2",)), LocalServer("vLLM", "http://127.0.0.1:8000/v1", ("qwen",))]
    written = Config.model_validate({"llm": {"model": "gpt-4o-mini"}})  # as new projects' configs say
    assert use_local_server(written, servers) is not None
    assert (written.llm.api_base, written.llm.model) == ("http://127.0.0.1:11434/v1", "llama3.2")
    named = Config.model_validate({"llm": {"model": "qwen"}})
    assert "using vLLM at http://127.0.0.1:8000/v1 with model qwen" in (use_local_server(named, servers) or "")
    assert use_local_server(Config.model_validate({"llm": {"model": "mistral"}}), servers) is None
