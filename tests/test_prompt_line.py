"""The chat's input line on a real terminal: a 200,000-character line, pasted or typed out key by
key, stays bounded in memory and is refused with one line; Ctrl-C just after a request ends does
not leave the chat."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import Terminal
from prompt_toolkit.key_binding import KeyPress
from prompt_toolkit.keys import Keys

from taskweaver_lite.cli.prompt_line import LATE_CTRL_C, MAX_LINE_CHARS, TYPED_PASTE, too_long, typed_pastes

pytestmark = pytest.mark.cli

LONG = 200_000


def demo_chat(tmp_path: Path) -> Terminal:
    """`demo --chat` on a terminal, waiting at its first prompt."""
    term = Terminal([sys.executable, "-m", "taskweaver_lite", "demo", "--chat", "-p", str(tmp_path / "demo")])
    assert term.read_until("you>", 120), term.shown[-2000:]
    return term


def rss_mb(pid: int) -> int:
    """The process's resident memory, in MB (0 once it has ended)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    return 0


def peak_while(pid: int, done: threading.Event) -> list[int]:
    """Sample `pid`'s memory every 50 ms in a thread until `done`; the samples so far."""
    samples: list[int] = []

    def sample() -> None:
        while not done.is_set():
            samples.append(rss_mb(pid))
            time.sleep(0.05)

    threading.Thread(target=sample, daemon=True).start()
    return samples


@pytest.mark.timeout(400)  # the chat starts a kernel; on a loaded machine that alone takes a minute
@pytest.mark.parametrize("how", ["typed", "pasted"])
def test_a_200000_character_line_stays_bounded_and_is_refused_with_one_line(tmp_path: Path, how: str) -> None:
    term = demo_chat(tmp_path)
    try:
        before = rss_mb(term.proc.pid)
        done = threading.Event()
        samples = peak_while(term.proc.pid, done)
        text = "abcdefghij" * (LONG // 10)
        writer = threading.Thread(target=term.type, args=(text if how == "typed" else f"\x1b[200~{text}\x1b[201~",), daemon=True)
        writer.start()  # the terminal's input queue is small: the program must read while we write
        while writer.is_alive():
            term.read_until("never shown", 0.2)
        term.type("\r")
        said = too_long(LONG).split(";")[0]  # the terminal wraps the rest of the line
        refused = term.read_until(said, 120)
        done.set()
        assert refused, term.shown[-1500:]
        assert max(samples) - before < 100, f"memory grew from {before} MB to {max(samples)} MB"  # 11 GB before the bound
        term.type("hello\r")
        assert term.read_until("I can answer these requests", 120, after=said), "the chat goes on"
    finally:
        term.close()


@pytest.mark.timeout(400)
def test_ctrl_c_just_after_a_request_ends_does_not_leave_the_chat(tmp_path: Path) -> None:
    term = demo_chat(tmp_path)
    try:
        term.type("hello\r")
        assert term.read_until("you>", 120, after="I can answer these requests")
        term.type("\x03")  # meant for the request that just ended
        assert term.read_until(LATE_CTRL_C, 10), term.shown[-800:]
        assert term.read_until("you>", 30, after=LATE_CTRL_C) and term.proc.poll() is None, "the chat is still there"
        term.type("\x03")  # a second one leaves
        term.proc.wait(120)
    finally:
        term.close()


@pytest.mark.unit
def test_a_run_of_plain_characters_in_one_read_becomes_one_paste_and_typing_stays_keys() -> None:
    keys = [KeyPress(c, c) for c in "x" * TYPED_PASTE] + [KeyPress(Keys.ControlM, "\r"), KeyPress("a", "a")]
    coalesced = typed_pastes(keys)
    assert [k.key for k in coalesced] == [Keys.BracketedPaste, Keys.ControlM, "a"]
    assert coalesced[0].data == "x" * TYPED_PASTE
    assert typed_pastes([KeyPress("a", "a"), KeyPress("b", "b")]) == [KeyPress("a", "a"), KeyPress("b", "b")]
    assert too_long(MAX_LINE_CHARS + 1).startswith(f"That line has {MAX_LINE_CHARS + 1:,} characters")
