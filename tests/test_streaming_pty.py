"""The real chat on a pseudo-terminal: the Planner's first words are on screen before its reply is complete."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import cli_env, make_project

from taskweaver_lite.testing.scripted_server import Reply, ScriptedServer, planner_reply

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX")


class Terminal:
    """A pseudo-terminal the program runs on; `read_until` collects what it shows."""

    def __init__(self, args: list[str]) -> None:
        self.master, slave = pty.openpty()
        env = {**cli_env(), "TERM": "xterm", "COLUMNS": "100", "LINES": "40"}
        self.proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
        os.close(slave)
        self.shown = ""

    def read_until(self, text: str, seconds: float = 30, *, after: str = "") -> bool:
        """Read until `text` is on screen (after the first `after`, when given)."""
        deadline = time.monotonic() + seconds

        def seen() -> bool:
            start = self.shown.find(after)
            return start >= 0 and text in self.shown[start + len(after) :]

        while not seen() and time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if ready:
                try:
                    self.shown += os.read(self.master, 65536).decode("utf-8", "replace")
                except OSError:
                    break
        return seen()

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        os.close(self.master)


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
