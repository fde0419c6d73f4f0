"""Confirm mode on a pseudo-terminal: each cell waits for run, edit or skip."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import Terminal, cli_env, make_project

from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply, text_reply

pytestmark = [pytest.mark.cli, pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX")]


def test_an_edited_cell_runs_as_edited_and_a_skipped_one_is_declined(tmp_path: Path) -> None:
    with ScriptedServer() as server:
        server.enqueue("planner", planner_reply("Print a greeting."), planner_reply("Greeted.", send_to="User"))
        server.enqueue("planner", planner_reply("Delete the data."), planner_reply("You declined; nothing was deleted.", send_to="User"))
        server.enqueue("code_generator", code_reply("print('model wrote this')"))
        server.enqueue("code_generator", code_reply("open('gone.txt', 'w').write('x')"), text_reply("The user declined to run the deletion."))
        project = make_project(tmp_path, server.url)
        terminal = Terminal([sys.executable, "-m", "taskweaver_lite", "chat", "-p", str(project), "--confirm"])
        try:
            assert terminal.read_until("you>"), terminal.shown
            terminal.type("greet me\r")
            assert terminal.read_until("[r]un / [e]dit / [s]kip"), terminal.shown
            assert "model wrote this" in terminal.shown, "the cell must be shown before it runs"
            terminal.type("e\r")
            assert terminal.read_until("edit"), terminal.shown
            terminal.type("\x15print('user edited')\x1b\r")  # Ctrl-U clears the line; Esc Enter accepts
            assert terminal.read_until("user edited", after="Esc Enter"), terminal.shown
            assert terminal.read_until("you>", after="Greeted."), terminal.shown
            terminal.type("delete everything\r")
            assert terminal.read_until("[r]un / [e]dit / [s]kip", after="delete everything"), terminal.shown
            terminal.type("s\r")
            assert terminal.read_until("you>", after="nothing was deleted"), terminal.shown
            terminal.type("\x04")
            assert terminal.proc.wait(30) == 0
        finally:
            terminal.close()
    planner_reports = [r.messages[-1]["content"] for r in server.requests if r.role == "planner"]
    assert "print('user edited')" in planner_reports[1] and "model wrote this" not in planner_reports[1], "the edited code is what ran and what the models see"
    assert "edited the code" in planner_reports[1]
    declined = "\n".join(m["content"] for m in [r for r in server.requests if r.role == "code_generator"][-1].messages)
    assert "declined" in declined, "a skipped cell is reported to the CodeGenerator as declined by the user"
    assert not list(project.glob("sessions/*/cwd/gone.txt")), "a skipped cell ran"


def test_confirm_mode_with_piped_input_is_an_error_that_says_why(tmp_path: Path) -> None:
    project = make_project(tmp_path, "http://127.0.0.1:9/v1")
    done = subprocess.run(
        [sys.executable, "-m", "taskweaver_lite", "chat", "-p", str(project), "--confirm"],
        input="hello\n", capture_output=True, text=True, env=cli_env(), timeout=60,
    )  # fmt: skip
    assert done.returncode != 0 and "needs a terminal" in done.stderr, done.stderr
