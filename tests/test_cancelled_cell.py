"""Ctrl-C on a running cell keeps what it printed: stored, marked cancelled, shown by /last, /history and the exports."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from helpers import make_project, running_cli, watch_stderr

from taskweaver_lite.config.file import load_config
from taskweaver_lite.store.database import SessionStore, stored_sessions
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply

pytestmark = pytest.mark.cli

SLOW = "for step in range(3):\n    print('finished step', step, flush=True)\nimport time\ntime.sleep(60)\nprint('never printed')"


def test_ctrl_c_keeps_the_cells_output_marked_cancelled_in_last_history_the_store_and_the_export(tmp_path: Path) -> None:
    with ScriptedServer() as server:
        project = make_project(tmp_path, server.url)
        server.enqueue("planner", planner_reply("Run the three steps."))
        server.enqueue("code_generator", code_reply(SLOW))
        exported = tmp_path / "out.md"
        with running_cli("chat", "-p", str(project)) as proc:
            lines, running, reader = watch_stderr(proc, "time.sleep(60)")
            assert proc.stdin is not None
            proc.stdin.write(f"run the steps\n/last\n/history\n/export md {exported}\n")
            proc.stdin.close()
            assert running.wait(60), "".join(lines)
            time.sleep(1.5)
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
            reader.join(timeout=5)
    said = "".join(lines)
    assert proc.returncode == 0, said
    last = said[said.index("The last cell that ran") :]
    assert "The user cancelled the cell while it ran (Ctrl-C)" in last and "finished step 2" in last, "/last shows the cancelled cell"
    printed = last.split("Output:")[1].split("</data>")[0]
    assert "finished step 2" in printed and "never printed" not in printed, "the output is what it printed before Ctrl-C"
    history = said[said.index("[1] You: run the steps") :]
    assert "(failed: Cancelled by the user.)" in history and "finished step 1" in history
    text = exported.read_text(encoding="utf-8")
    assert "finished step 2" in text and "cancelled" in text.lower()
    config = load_config(project)
    store = SessionStore(config.store_path)
    try:
        stored = store.load(stored_sessions(config.store_path)[0].id)
    finally:
        store.close()
    cells = [post.execution for post in stored.rounds[0].posts if post.execution is not None]
    assert len(cells) == 1 and cells[0].cancelled and "finished step 0" in cells[0].stdout


@pytest.mark.kernel
def test_stop_in_the_page_keeps_the_cells_output_in_the_stream_and_on_reload(tmp_path: Path) -> None:
    import json
    import threading

    import httpx

    from taskweaver_lite.testing.web_server import WebServer

    with ScriptedServer() as server:
        project = make_project(tmp_path, server.url)
        server.enqueue("planner", planner_reply("Run the three steps."))
        server.enqueue("code_generator", code_reply(SLOW))
        with WebServer(load_config(project)) as web, httpx.Client(base_url=web.url, timeout=60) as client:
            session_id = client.post("/api/sessions", json={}).json()["id"]
            threading.Timer(4.0, lambda: httpx.post(f"{web.url}/api/sessions/{session_id}/stop", json={})).start()
            with client.stream("POST", f"/api/sessions/{session_id}/messages", json={"text": "run the steps"}) as stream:
                received = [json.loads(line[6:]) for line in stream.iter_lines() if line.startswith("data: ")]
            reloaded = client.get(f"/api/sessions/{session_id}").json()
    cells = [event["execution"] for event in received if event["type"] == "post" and event.get("execution")]
    assert received[-1]["type"] == "error" and len(cells) == 1
    assert cells[0]["cancelled"] and "finished step 2" in cells[0]["stdout"], "the page gets what the cell printed before Stop"
    stored = [post["execution"] for post in reloaded["rounds"][0]["posts"] if post.get("execution")]
    assert stored and stored[0]["cancelled"], "and a reloaded page shows it too"


@pytest.mark.kernel
def test_ctrl_c_the_instant_a_cell_has_been_sent_still_stops_that_cell(tmp_path: Path) -> None:
    """The race that lost Ctrl-C under load: the signal landing between sending the cell and following it."""
    from taskweaver_lite.config.settings import ExecutionConfig
    from taskweaver_lite.kernel.executor import KernelExecutor
    from taskweaver_lite.records.execution import CellCancelled

    with KernelExecutor(tmp_path / "session", config=ExecutionConfig(timeout=60, sandbox="none")) as executor:
        assert executor.run("x = 5").success
        send = executor._execute

        def send_then_ctrl_c(code: str) -> str:
            msg_id = send(code)
            signal.raise_signal(signal.SIGINT)  # Ctrl-C right after the cell left, before anything follows it
            return msg_id

        executor._execute = send_then_ctrl_c  # type: ignore[method-assign]
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt) as pressed:
            executor.run("import time\ntime.sleep(60)")
        executor._execute = send  # type: ignore[method-assign]
        assert isinstance(pressed.value, CellCancelled), "the cell was stopped, not left running with nobody following it"
        assert executor.run("print(x)").stdout.strip() == "5", "the kernel is free again and kept its variables"
        assert time.monotonic() - started < 30, "the sleeping cell was interrupted, not waited out"
