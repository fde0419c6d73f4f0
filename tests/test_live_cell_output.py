"""A running cell's output on a terminal: each line as it is printed, the elapsed time ticking, a
print loop kept to a few lines on screen; pipes still get only the final answer."""

from __future__ import annotations

import io
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import make_project
from rich.console import Console

from taskweaver_lite.cli.console import RichConsole
from taskweaver_lite.cli.live import CELL_LINES
from taskweaver_lite.config.file import load_config
from taskweaver_lite.session.assembly import open_session
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply

pytestmark = pytest.mark.kernel

# The first line, then nothing until the test has seen it on the screen (or 30 s have passed): a first line held back
# until the cell's end is never seen before the last one. The rest takes most of a second: the clock ticks meanwhile.
# (`'tick', 0`: the code shown on the screen never reads as its output.)
TICKS = (
    "import os, time\nprint('tick', 0, flush=True)\nfor _ in range(600):\n    if os.path.exists('go'):\n        break\n    time.sleep(0.05)\n"
    "print('tick', 1, flush=True)\ntime.sleep(0.8)\nprint('tick', 2, flush=True)"
)


def snapshots(screen: io.StringIO, stop: threading.Event, on_screen: Callable[[str], None]) -> tuple[list[tuple[float, str]], threading.Thread]:
    """The screen every 20 ms until `stop`, and once more then, taken on a thread while the session runs on the test's; each is shown to `on_screen`.

    The last one holds the lines that came after the thread's previous look (under load the cell's last line can
    come and the session end between two looks)."""
    taken: list[tuple[float, str]] = []

    def take() -> None:
        while not stop.is_set():
            taken.append((time.monotonic(), screen.getvalue()))
            on_screen(taken[-1][1])
            time.sleep(0.02)
        taken.append((time.monotonic(), screen.getvalue()))

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    return taken, thread


def run_cell(tmp_path: Path, server: ScriptedServer, code: str) -> tuple[io.StringIO, list[tuple[float, str]]]:
    server.enqueue("planner", planner_reply("Run it."), planner_reply("Done.", send_to="User"))
    server.enqueue("code_generator", code_reply(code))
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100, highlight=False, color_system=None)
    stop = threading.Event()
    with open_session(load_config(make_project(tmp_path, server.url)), listeners=[RichConsole(console)]) as session:
        go = session.working_dir / "go"

        def on_screen(text: str) -> None:
            if "tick 0" in text and not go.exists():
                go.touch()  # TICKS goes on once its first line was seen

        taken, taking = snapshots(screen, stop, on_screen)
        try:
            session.ask("run the cell")
        finally:
            stop.set()
            taking.join(10)
    return screen, taken


def test_a_cell_printing_a_line_shows_it_before_the_cell_ends(tmp_path: Path, server: ScriptedServer) -> None:
    screen, taken = run_cell(tmp_path, server, TICKS)
    first = next((at, text) for at, text in taken if "tick 0" in text)
    assert "tick 2" not in first[1], "the first line waited for the cell to end"
    ends = next(at for at, text in taken if "tick 2" in text)
    assert ends - first[0] > 0.7, "the lines came as the cell printed them, the last most of a second after the first"
    # The elapsed time ticks while the cell runs: several different readings of it.
    readings = set(re.findall(r"Running code… (\d+\.\d) s", screen.getvalue()))
    assert len(readings) >= 5, readings
    assert "Done." in screen.getvalue()


def test_a_print_loop_cannot_flood_the_screen(tmp_path: Path, server: ScriptedServer) -> None:
    screen, _ = run_cell(tmp_path, server, "for i in range(200_000):\n    print('line', i)")
    shown = screen.getvalue()
    frames = shown.split("… (earlier output above)")  # each refresh of the live view starts with this marker
    assert len(frames) > 2, "the live view never cut the loop's output"
    widest = max(len(re.findall(r"line \d+", frame)) for frame in frames[1:-1])
    assert widest <= CELL_LINES, f"a refresh of the live view showed {widest} of the loop's lines"
    # What the screen should hold: the refreshes (each ~12 short lines) and the result panel, whose
    # output is cut to a few hundred lines; 200,000 printed lines (2.3 M characters) must not reach it.
    final = len(re.findall(r"line \d+", frames[-1]))
    assert final <= 600, f"the result panel showed {final:,} of the 200,000 printed lines"
    cap = 60_000 + 400 * len(frames)
    assert len(shown) <= cap, f"{len(shown):,} characters reached the terminal for {len(frames) - 1} refreshes (at most {cap:,})"
    assert "line 199999" in shown
