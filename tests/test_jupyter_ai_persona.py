"""`@TaskWeaver` in JupyterLab's chat: a real JupyterLab 4 with Jupyter AI 3 and the persona, driven from headless Chromium.

JupyterLab runs from the venv `.ci/jupyter-ai.sh` makes (build/jupyter-ai/venv, or TASKWEAVER_LITE_JUPYTER_VENV),
where the `jupyter` extra installed this checkout; Jupyter AI finds the persona through its entry point and
`jupyter-ai-acp-client` starts `taskweaver-lite acp` for the chat. The project is TASKWEAVER_LITE_PROJECT's,
on the scripted model. One question typed in the chat is answered there, with the cell's code and output.
Skipped where that venv or Chromium is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chromium import NEEDS_CHROMIUM, chromium
from helpers import REPO, cli_env, make_project

from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, last_user_text, planner_reply
from taskweaver_lite.testing.server_start import free_port, wait_until_answering

VENV = Path(os.environ.get("TASKWEAVER_LITE_JUPYTER_VENV") or REPO / "build" / "jupyter-ai" / "venv")
JUPYTER = VENV / "bin" / "jupyter"
pytestmark = [
    pytest.mark.jupyter,
    NEEDS_CHROMIUM,
    pytest.mark.skipif(not JUPYTER.exists(), reason=f"JupyterLab with Jupyter AI is not installed at {VENV}: run .ci/jupyter-ai.sh"),
]
START = 120  # seconds: of JupyterLab's CPU to start; of wall time for the page and the agent on a loaded machine
ANSWER = 240  # seconds the persona may take: its agent starts, then a kernel, then the turn
TOKEN = "jupyter-ai-test-token"


def planner(messages: list[dict[str, Any]]) -> str:
    if "Execution result" in last_user_text(messages) or "The code" in last_user_text(messages):
        return planner_reply("The total is 600 (sales.csv, three rows).", send_to="User")
    return planner_reply("Sum the amount column of sales.csv in the user's folder and print it.")


def coder(folder: Path) -> str:
    return code_reply(f"import pandas as pd\nsales = pd.read_csv({str(folder / 'sales.csv')!r})\nprint('TOTAL', sales['amount'].sum())")


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[str, Path, ScriptedServer, Path]]:
    """JupyterLab on a free port, its root a folder with the analyst's sales.csv; yields its address, the project and the model."""
    root = tmp_path / "work"
    root.mkdir()
    (root / "sales.csv").write_text("region,amount\nnorth,100\nsouth,200\neast,300\n", encoding="utf-8")
    with ScriptedServer() as server:
        server.set_default("planner", planner)
        server.set_default("code_generator", coder(root))
        project = make_project(tmp_path, server.url)
        port = free_port()
        env = {**cli_env(), "TASKWEAVER_LITE_PROJECT": str(project), "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config")}
        env["JUPYTER_DATA_DIR"] = str(tmp_path / "jupyter-data")
        command = [str(JUPYTER), "lab", "--no-browser", f"--port={port}", f"--ServerApp.token={TOKEN}", f"--ServerApp.root_dir={root}", "--allow-root"]
        with (tmp_path / "lab.log").open("w") as log:
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_answering(process, lambda: _status(url), what="JupyterLab", log=tmp_path / "lab.log", cpu_limit=START)
            yield url, project, server, tmp_path / "lab.log"
        finally:
            os.killpg(process.pid, 15)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)
                process.wait()


def _status(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=5) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def wait_for(check: Any, seconds: float, why: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, why
        time.sleep(0.5)


@pytest.fixture
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


def test_a_question_in_jupyterlabs_chat_is_answered_with_the_cells_output(lab: tuple[str, Path, ScriptedServer, Path], browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    url, project, server, log = lab
    created = urllib.request.Request(
        f"{url}/api/contents/analysis.chat?token={TOKEN}",
        data=json.dumps({"type": "file", "format": "text", "content": ""}).encode(),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(created, timeout=30) as reply:
        assert reply.status == 201
    browser.get(f"{url}/lab/tree/analysis.chat?token={TOKEN}")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, ".jp-chat-input-container textarea, textarea"), START, "the chat's input never showed")
    # Jupyter AI starts the selected persona's agent when the chat opens; a message sent before the chat's
    # personas are set up is not routed to any, so the question waits for the agent's session.
    ready = "Initialized new ACP client session for 'TaskWeaverPersona'"
    wait_for(lambda: ready in log.read_text(encoding="utf-8", errors="replace"), START, f"the persona's agent did not start: see {log}")
    box = browser.find_elements(By.CSS_SELECTOR, "textarea")[0]
    box.click()
    box.send_keys("@TaskWeaver what is the total of the amount column in sales.csv?")
    box.send_keys(Keys.ENTER)
    try:
        wait_for(lambda: "The total is 600" in browser.find_element(By.TAG_NAME, "body").text, ANSWER, "no answer in the chat")
    finally:
        browser.save_screenshot(str(tmp_path / "chat.png"))
    [cell] = browser.find_elements(By.CSS_SELECTOR, "details summary")  # the cell, folded as the chat folds tool calls
    assert "Sum the amount column of sales.csv" in cell.text
    cell.click()
    wait_for(lambda: "TOTAL 600" in browser.find_element(By.TAG_NAME, "body").text, 10, "the cell's output is not in the chat")
    browser.save_screenshot(str(tmp_path / "chat.png"))
    command = [sys.executable, "-m", "taskweaver_lite", "sessions", "-p", str(project), "--json"]
    sessions = subprocess.run(command, capture_output=True, text=True, env=cli_env())
    [row] = json.loads(sessions.stdout)
    assert row["rounds"] == 1
    asked = next(last_user_text(r.messages) for r in server.requests if r.role == "planner")
    assert "@TaskWeaver what is the total of the amount column in sales.csv?" in asked, asked
    assert "is readable by the code at that path, read-only" in asked and "notebook MCP tools" not in asked  # the chat's folder is lent
