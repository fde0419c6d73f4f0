"""The chat as a terminal shows it (a pseudo-terminal read through pyte, a terminal emulator):
no spinner left over the code, and a resumed session's banner and DataFrame width are the effective ones."""

from __future__ import annotations

import fcntl
import re
import struct
import sys
import termios
from pathlib import Path

import pyte
import pytest
from helpers import Terminal, make_project, run_cli

from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply

pytestmark = [pytest.mark.cli, pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX")]
SPINNER = re.compile("[\u2800-\u28ff]")  # rich's "dots" spinner frames


def screen_of(shown: str) -> list[str]:
    """The lines a 100 x 40 terminal shows after receiving `shown` (history scrolled off included)."""
    screen = pyte.HistoryScreen(100, 40, history=400)
    # Terminals ignore the APC queries they do not know (the kitty graphics probe); pyte would print them.
    pyte.Stream(screen).feed(re.sub("\x1b_.*?\x1b\\\\", "", shown, flags=re.S))
    earlier = ["".join(char.data for char in line.values()) for line in screen.history.top]
    return [line.rstrip() for line in earlier + screen.display]


def chat_on_terminal(*args: str) -> Terminal:
    terminal = Terminal([sys.executable, "-m", "taskweaver_lite", "chat", *args])
    # A real terminal's size: 40 rows of 100 columns, 8 x 16 pixel cells (images are scaled by it).
    fcntl.ioctl(terminal.master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 800, 640))
    return terminal


def test_the_first_request_leaves_no_spinner_on_screen(tmp_path: Path) -> None:
    with ScriptedServer() as server:
        project = make_project(tmp_path, server.url)
        server.enqueue("planner", planner_reply("Print one."), planner_reply("Done.", send_to="User"))
        server.enqueue("code_generator", code_reply("print(1)"))
        terminal = chat_on_terminal("-p", str(project))
        try:
            assert terminal.read_until("you>"), terminal.shown
            terminal.type("print one\r")
            assert terminal.read_until("you>", after="Done."), terminal.shown
            lines = screen_of(terminal.shown)
            terminal.type("\x04")
            assert terminal.proc.wait(30) == 0
        finally:
            terminal.close()
    assert "print(1)" in lines, "the code sits on a line of its own"
    assert not [line for line in lines if SPINNER.search(line)], "\n".join(lines)


def test_resume_names_the_model_it_runs_with_and_fits_dataframes_to_the_terminal(tmp_path: Path) -> None:
    with ScriptedServer() as server:
        project = make_project(tmp_path, server.url)
        server.enqueue("planner", planner_reply("Hi.", send_to="User"))
        first = run_cli("chat", "-p", str(project), "--set", "llm.model=model-b", stdin="hi\n")
        assert first.returncode == 0, first.stderr
        server.enqueue("planner", planner_reply("Show the width."), planner_reply("Shown.", send_to="User"))
        server.enqueue("code_generator", code_reply("import pandas as pd\nprint('width', pd.get_option('display.width'))"))
        terminal = chat_on_terminal("-p", str(project), "--resume", "last")
        try:
            assert terminal.read_until("you>"), terminal.shown
            terminal.type("width?\r")
            assert terminal.read_until("you>", after="Shown."), terminal.shown
            lines = screen_of(terminal.shown)
            terminal.type("\x04")
            assert terminal.proc.wait(30) == 0
        finally:
            terminal.close()
    banner = next(line for line in lines if line.startswith("taskweaver-lite session"))
    assert "model model-b" in banner, banner
    assert any("width 100" in line for line in lines), "the kernel prints as wide as the terminal (COLUMNS=100)"
    assert [r.body["model"] for r in server.requests if r.role == "planner"][-1] == "model-b"


PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.savefig('trend.png')\nplt.show()"


def _plot_session(tmp_path: Path, server: ScriptedServer, *, answers_sixel: bool) -> str:
    project = make_project(tmp_path, server.url)
    server.enqueue("planner", planner_reply("Plot it."), planner_reply("Plotted.", send_to="User"))
    server.enqueue("code_generator", code_reply(PLOT))
    terminal = chat_on_terminal("-p", str(project))
    try:
        if answers_sixel:  # a terminal that speaks sixel answers the Device Attributes query with a 4
            assert terminal.read_until("\x1b[c"), terminal.shown
            terminal.type("\x1b[?62;4;22c")
        assert terminal.read_until("you>"), terminal.shown
        terminal.type("plot it\r")
        assert terminal.read_until("you>", after="Plotted."), terminal.shown
        terminal.type("\x04")
        assert terminal.proc.wait(30) == 0
        return terminal.shown
    finally:
        terminal.close()


def test_a_plot_is_drawn_inline_on_a_terminal_that_speaks_sixel(tmp_path: Path) -> None:
    with ScriptedServer() as server:
        shown = _plot_session(tmp_path, server, answers_sixel=True)
    assert re.search(r"\x1bP[0-9;]*q", shown), "a sixel image was sent to the terminal"
    assert "/open 1 shows it in your viewer" in shown


def test_elsewhere_a_plot_is_named_with_the_open_command(tmp_path: Path) -> None:
    with ScriptedServer() as server:
        shown = _plot_session(tmp_path, server, answers_sixel=False)
    assert not re.search(r"\x1bP[0-9;]*q", shown), "no image data for a terminal that cannot draw it"
    lines = screen_of(shown)
    assert any(re.search(r"\[1\] .*\.png: /open 1 shows it in your viewer", line) for line in lines), "\n".join(lines)
