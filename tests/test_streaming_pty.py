"""The real chat on a pseudo-terminal: the Planner's first words are on screen before its reply is complete."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
from helpers import Terminal, make_project

from taskweaver_lite.testing.scripted_server import Reply, ScriptedServer, planner_reply

pytestmark = [pytest.mark.cli, pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX")]


def test_the_planners_first_words_reach_the_terminal_before_the_reply_is_complete(tmp_path: Path) -> None:
    gate = threading.Event()
    reply = planner_reply("Streaming works on a real terminal, and the rest follows.", send_to="User")
    with ScriptedServer() as server:
        server.enqueue("planner", Reply(content=reply, chunk_chars=8, gate=gate, gate_after=reply.index("terminal") + 8))
        project = make_project(tmp_path, server.url)
        terminal = Terminal([sys.executable, "-m", "taskweaver_lite", "chat", "-p", str(project)])
        try:
            assert terminal.read_until("you>"), terminal.shown
            terminal.type("hello\r")
            assert terminal.read_until("Streaming works on a real terminal"), terminal.shown
            assert "the rest follows" not in terminal.shown
            gate.set()
            assert terminal.read_until("the rest follows"), terminal.shown
            assert terminal.read_until("you>", after="the rest follows"), terminal.shown
            terminal.type("\x04")  # Ctrl-D: leave
            assert terminal.proc.wait(30) == 0
        finally:
            gate.set()
            terminal.close()
