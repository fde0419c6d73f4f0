"""`serve` as an operator runs it: on a project folder mounted read-only, without an optional library, its log lines stamped.

On a read-only project `serve` keeps sessions in a state folder it can write. It runs inside
bubblewrap with the project bound read-only, so the folder is read-only for root too (a chmod would
not stop root); skipped without bwrap.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers import cli_env, make_project

from taskweaver_lite.config.file import load_config
from taskweaver_lite.testing.kernel_gateway import free_port
from taskweaver_lite.testing.replicas import run_code_model
from taskweaver_lite.testing.scripted_server import ScriptedServer

BWRAP = shutil.which("bwrap")
pytestmark = pytest.mark.cli
needs_bwrap = pytest.mark.skipif(BWRAP is None, reason="bubblewrap is not installed: apt-get install bubblewrap")
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")


@pytest.fixture
def read_only_serve(tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    """`serve` on a project it cannot write: its URL, the project, and the state folder it was given through XDG_STATE_HOME."""
    with ScriptedServer() as model:
        run_code_model(model)
        project = make_project(tmp_path, model.url, execution={"sandbox": "none"})  # the kernel runs inside this test's bwrap already
        state = tmp_path / "state"
        port = free_port()
        assert BWRAP is not None
        # --die-with-parent: serve (and its kernel) end with bwrap, which is what the test stops.
        command = [BWRAP, "--die-with-parent", "--dev-bind", "/", "/", "--ro-bind", str(project), str(project)]
        command += [sys.executable, "-m", "taskweaver_lite", "serve", "-p", str(project), "--port", str(port)]
        log = tmp_path / "serve.log"
        with log.open("wb") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**cli_env(), "XDG_STATE_HOME": str(state)})
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                assert process.poll() is None and time.monotonic() < deadline, log.read_text()
                try:
                    httpx.get(url + "/healthz", timeout=2)
                    break
                except httpx.TransportError:
                    time.sleep(0.2)
            yield url, project, state
        finally:
            process.terminate()
            process.wait(30)
        written = log.read_text()
        assert "Traceback" not in written and "serving" in written, written
        unstamped = [line for line in written.splitlines() if line.strip() and not STAMP.match(line)]
        assert not unstamped, f"every line serve writes to stderr starts with its time: {unstamped}"


@needs_bwrap
def test_sessions_on_a_read_only_project_live_in_the_users_state_folder(read_only_serve: tuple[str, Path, Path]) -> None:
    url, project, state = read_only_serve
    with httpx.Client(base_url=url, timeout=90) as client:
        made = client.post("/api/sessions", json={})
        assert made.status_code == 200, f"a new session on a read-only project: {made.text}"
        session_id = made.json()["id"]
        with client.stream("POST", f"/api/sessions/{session_id}/messages", json={"text": "RUN<<print(6 * 7)>>"}) as response:
            assert response.status_code == 200
            events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
        assert events[-1]["type"] == "answer" and "42" in events[-1]["text"], events[-1]
        uploaded = client.post(f"/api/sessions/{session_id}/files", files={"file": ("numbers.csv", b"n\n1\n2\n")})
        assert uploaded.status_code == 200, uploaded.text
        assert session_id in [row["id"] for row in client.get("/api/sessions").json()]
    assert not (project / "sessions").exists() and not (project / "sessions.db").exists(), "nothing is written into the project"
    (kept,) = state.glob("taskweaver-lite/project-*")
    assert (kept / "sessions" / session_id / "cwd" / "numbers.csv").is_file() and (kept / "sessions.db").is_file()


def test_session_state_dir_names_the_folder_and_a_writable_project_keeps_its_own(tmp_path: Path) -> None:
    project = make_project(tmp_path, "http://127.0.0.1:9")
    assert load_config(project).sessions_dir == project / "sessions", "a project that can be written keeps its sessions, as before"
    given = load_config(project, ["session.state_dir=/var/lib/twl"])
    assert given.sessions_dir == Path("/var/lib/twl/sessions") and given.store_path == Path("/var/lib/twl/sessions.db")
    assert os.access(project, os.W_OK)


def test_a_gateway_without_its_client_installed_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    project = make_project(tmp_path, "http://127.0.0.1:9", execution={"kernel_gateway": {"url": "http://127.0.0.1:9"}})
    missing = tmp_path / "missing" / "websocket"
    missing.mkdir(parents=True)  # shadows the installed package: importing it fails as it does where it is not installed
    (missing / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'websocket'\", name='websocket')\n")
    env = {**cli_env(), "PYTHONPATH": str(missing.parent)}
    done = subprocess.run(
        [sys.executable, "-m", "taskweaver_lite", "serve", "-p", str(project), "--port", str(free_port())],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode != 0, "serve must not start, only to answer every session with a 500"
    assert "Traceback" not in done.stderr and done.stderr.strip().count("\n") == 0, done.stderr
    assert "execution.kernel_gateway" in done.stderr and "websocket" in done.stderr and "taskweaver-lite[team]" in done.stderr, done.stderr
