"""What a terminal shows while replies stream: the Planner's words and the code before the reply is
complete, reasoning dimmed or hidden, never the raw JSON; a cut stream leaves the right answer."""

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

from taskweaver_lite.cli.console import PlainConsole, RichConsole
from taskweaver_lite.config.file import load_config
from taskweaver_lite.session import assembly
from taskweaver_lite.session.session import Session
from taskweaver_lite.testing.scripted_server import Reply, ScriptedServer, code_reply, planner_reply

pytestmark = pytest.mark.kernel


def terminal(*, styled: bool = False) -> tuple[Console, io.StringIO]:
    """A 100-column terminal written to a string; `styled`: with the escape codes of colours and dim text."""
    screen = io.StringIO()
    return Console(file=screen, force_terminal=True, width=100, highlight=False, color_system="standard" if styled else None), screen


def styles_of(screen: str, text: str) -> set[str]:
    """The SGR codes (1 bold, 2 dim, 3 italic...) in force where `text` is written on `screen`."""
    found: set[str] = set()
    for match in re.finditer(r"\x1b\[([0-9;]*)m([^\x1b]*)", screen):
        if text in match[2]:
            found |= set(match[1].split(";"))
    return found


def wait_for(check: Callable[[], bool], seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return False


class Watcher:
    """Watches the screen while the server holds the rest of a reply, then lets the server go on.

    The session runs on the test's own thread (the kernel client wants it); this one looks.
    """

    def __init__(self, screen: io.StringIO, gate: threading.Event, *wanted: str) -> None:
        self.screen = screen
        self.gate = gate
        self.wanted = wanted
        self.seen: str | None = None  # the screen when every wanted text was on it
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        try:
            if wait_for(lambda: all(text in self.screen.getvalue() for text in self.wanted)):
                time.sleep(0.05)  # a refresh or two more: nothing past the gate may have come meanwhile
                self.seen = self.screen.getvalue()
        finally:
            self.gate.set()


def open_session(tmp_path: Path, server: ScriptedServer, renderer: RichConsole | PlainConsole, **llm: object) -> Session:
    return assembly.open_session(load_config(make_project(tmp_path, server.url, llm=llm)), listeners=[renderer])


def test_the_planners_first_words_are_on_screen_before_its_reply_is_complete(tmp_path: Path, server: ScriptedServer) -> None:
    gate = threading.Event()
    reply = planner_reply("The first words arrive early, the rest later.", send_to="User", current_plan_step="1. answer")
    server.enqueue("planner", Reply(content=reply, chunk_chars=8, gate=gate, gate_after=reply.index("early") + 5))
    console, screen = terminal()
    with open_session(tmp_path, server, RichConsole(console)) as session:
        watcher = Watcher(screen, gate, "The first words arrive early")
        rnd = session.ask("hello")
    assert watcher.seen is not None, screen.getvalue()
    assert "Planner [1. answer]: The first words" in watcher.seen and "the rest later" not in watcher.seen
    assert rnd.state == "finished"
    shown = screen.getvalue()
    assert "the rest later." in shown and "init_plan" not in shown and '"response"' not in shown


def test_the_code_appears_while_it_is_written_and_runs_once_complete(tmp_path: Path, server: ScriptedServer) -> None:
    gate = threading.Event()
    code = "total = 6 * 7\nprint('the total is', total)"
    written = code_reply(code)
    server.enqueue("planner", planner_reply("Compute the total"), planner_reply("It is 42.", send_to="User"))
    server.enqueue("code_generator", Reply(content=written, chunk_chars=6, gate=gate, gate_after=written.index("print") + 5))
    console, screen = terminal()
    with open_session(tmp_path, server, RichConsole(console)) as session:
        watcher = Watcher(screen, gate, "total = 6 * 7")
        session.ask("what is six times seven?")
    assert watcher.seen is not None, screen.getvalue()
    assert "the total is 42" not in watcher.seen
    assert "the total is 42" in screen.getvalue() and "It is 42." in screen.getvalue()


@pytest.mark.parametrize("shown", [True, False])
def test_reasoning_is_shown_dimmed_or_hidden_and_never_taken_for_the_reply(tmp_path: Path, server: ScriptedServer, shown: bool) -> None:
    gate = threading.Event()
    reply = planner_reply("Plain answer.", send_to="User")
    thinking = '<think>Should I say {"message": "wrong"}? No.</think>'
    server.enqueue("planner", Reply(content=thinking + reply, reasoning="weighing options", gate=gate, gate_after=len(thinking) + 10))
    console, screen = terminal(styled=True)
    with open_session(tmp_path, server, RichConsole(console, show_reasoning=shown)) as session:
        watcher = Watcher(screen, gate, "weighing options" if shown else "Planner is thinking")
        rnd = session.ask("hi")
    assert watcher.seen is not None, screen.getvalue()
    time.sleep(0.01)
    assert ("weighing options" in screen.getvalue()) is shown
    if shown:
        assert "2" in styles_of(screen.getvalue(), "weighing options"), "the reasoning is not dimmed (no SGR 2 where it is written)"
    assert ("Should I say" in screen.getvalue()) is shown
    assert rnd.posts[-1].message == "Plain answer."


def test_a_stream_cut_mid_json_is_asked_again_and_only_the_full_answer_stands(tmp_path: Path, server: ScriptedServer) -> None:
    reply = planner_reply("The complete answer.", send_to="User")
    server.enqueue("planner", Reply(content=reply, cut_after=reply.index("complete") + 3), Reply(content=reply))
    console, screen = terminal()
    with open_session(tmp_path, server, RichConsole(console), max_retries=1) as session:
        rnd = session.ask("hi")
    assert rnd.state == "finished" and rnd.posts[-1].message == "The complete answer."
    assert len(server.requests) == 2 and "The complete answer." in screen.getvalue()


def test_piped_output_holds_only_the_final_answer_while_replies_stream(tmp_path: Path, server: ScriptedServer) -> None:
    server.enqueue("planner", Reply(content=planner_reply("Only this.", send_to="User"), chunk_chars=3, reasoning="hidden thoughts"))
    out, err = io.StringIO(), io.StringIO()
    with open_session(tmp_path, server, PlainConsole(out=out, err=err)) as session:
        session.ask("hi")
    assert out.getvalue() == "Only this.\n"
    assert "hidden thoughts" not in err.getvalue()


def test_with_stream_off_the_session_works_as_before(tmp_path: Path, server: ScriptedServer) -> None:
    server.enqueue("planner", planner_reply("Unstreamed.", send_to="User"))
    console, screen = terminal()
    with open_session(tmp_path, server, RichConsole(console), stream=False) as session:
        assert session.ask("hi").posts[-1].message == "Unstreamed."
    assert "stream" not in server.requests[0].body and "Unstreamed." in screen.getvalue()


def test_control_sequences_in_a_streamed_reply_or_a_cells_output_never_reach_the_terminal(tmp_path: Path, server: ScriptedServer) -> None:
    gate = threading.Event()
    reply = planner_reply("Clear\x1b[2J screen\x1b]0;title\x07 now, then wait.", send_to="User")
    server.enqueue("planner", Reply(content=reply, gate=gate, gate_after=reply.index("wait")))
    console, screen = terminal()
    with open_session(tmp_path, server, RichConsole(console)) as session:
        watcher = Watcher(screen, gate, "screen")
        session.ask("hi")
    assert watcher.seen is not None and "now, then" in watcher.seen
    assert "\x1b[2J" not in screen.getvalue() and "\x1b]0;" not in screen.getvalue()
