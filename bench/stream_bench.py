"""Streaming: how soon a token is on the terminal, and what streaming costs a turn.

1. Token to screen: the scripted server streams a Planner reply whose message is numbered words,
   one word per chunk, 20 ms apart (a local model's pace); each word's send time (after the flush)
   is compared with the moment the terminal's file first receives it through the session and the
   `RichConsole`. Target: median < 30 ms.
2. Turn overhead: turns of one instant Planner reply with `llm.stream` true vs false, through the
   same session and a terminal console. Target: streaming / non-streaming <= 1.1.

    python bench/stream_bench.py [--words 60] [--turns 40] [--repeats 5]
"""

from __future__ import annotations

import argparse
import io
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from taskweaver_lite.cli.console import RichConsole
from taskweaver_lite.cli.demo import bundled_project
from taskweaver_lite.config.file import load_config
from taskweaver_lite.session import assembly
from taskweaver_lite.session.session import Session
from taskweaver_lite.testing.scripted_server import Reply, ScriptedServer, planner_reply

WORD = re.compile(r"w\d{4}")


class StampedScreen(io.StringIO):
    """A terminal's file that notes when each numbered word first reaches it."""

    def __init__(self) -> None:
        super().__init__()
        self.first_seen: dict[str, float] = {}

    def write(self, text: str) -> int:
        now = time.perf_counter()
        for word in WORD.findall(text):
            self.first_seen.setdefault(word, now)
        return super().write(text)


def open_session(root: Path, server: ScriptedServer | _Remote, screen: io.StringIO, *, stream: bool) -> Session:
    overrides = [f"llm.api_base={server.url}", "llm.api_key=bench", "llm.model=bench", f"llm.stream={str(stream).lower()}"]
    config = load_config(bundled_project(), overrides)
    config.project_dir = Path(tempfile.mkdtemp(prefix="stream-bench-", dir=root))  # sessions and store stay out of the checkout
    console = Console(file=screen, force_terminal=True, width=120, color_system=None)
    return assembly.open_session(config, listeners=[RichConsole(console)])


def token_to_screen(root: Path, words: int) -> list[float]:
    """Milliseconds from each word leaving the server to its first appearance on the terminal."""
    sent: dict[str, float] = {}
    message = " ".join(f"w{n:04d}" for n in range(words))
    reply = planner_reply(message, send_to="User")

    so_far: list[str] = []

    def stamp(piece: str) -> None:
        # Chunks split words: a word counts as sent when the chunk that completes it is.
        now = time.perf_counter()
        so_far.append(piece)
        for word in WORD.findall("".join(so_far)):
            sent.setdefault(word, now)

    screen = StampedScreen()
    with ScriptedServer() as server:
        server.set_default("planner", Reply(content=reply, chunk_chars=6, chunk_delay=0.02, on_sent=stamp))
        with open_session(root, server, screen, stream=True) as session:
            session.ask("count")
    return [(screen.first_seen[w] - sent[w]) * 1000 for w in sent if w in screen.first_seen]


# The server in a process of its own, as real servers are: in ours, its thread would contend for
# the GIL with the client on every chunk, a cost only the bench would pay.
SERVE = """
import sys, time
from taskweaver_lite.testing.scripted_server import ScriptedServer, planner_reply
server = ScriptedServer().start()
server.set_default("planner", planner_reply("Done: the answer is 42, with a few words of explanation.", send_to="User"))
print(server.url, flush=True)
sys.stdin.read()
"""


def turn_seconds(root: Path, turns: int, *, stream: bool) -> float:
    """Median wall time of a one-call turn with an instant model."""
    with subprocess.Popen([sys.executable, "-c", SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        server = _Remote(proc.stdout.readline().strip())
        with open_session(root, server, io.StringIO(), stream=stream) as session:
            session.ask("warm up")
            times = []
            for n in range(turns):
                started = time.perf_counter()
                session.ask(f"question {n}")
                times.append(time.perf_counter() - started)
        proc.stdin.close()
    return statistics.median(times)


class _Remote:
    """A scripted server in another process, as `open_session` needs it: its address."""

    def __init__(self, url: str) -> None:
        self.url = url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, default=60)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        latencies = token_to_screen(root, args.words)
        print(
            f"token to screen: median {statistics.median(latencies):.1f} ms, p90 {sorted(latencies)[int(len(latencies) * 0.9)]:.1f} ms "
            f"over {len(latencies)} words (target: median < 30 ms)"
        )
        # Alternating runs, since this machine's load drifts: the median of the pairs' ratios.
        pairs = [(turn_seconds(root, args.turns, stream=False), turn_seconds(root, args.turns, stream=True)) for _ in range(args.repeats)]
        ratio = statistics.median(streamed / plain for plain, streamed in pairs)
        plain, streamed = (statistics.median(p[i] for p in pairs) for i in (0, 1))
        print(
            f"turn, instant model: {streamed * 1000:.1f} ms streaming vs {plain * 1000:.1f} ms not: "
            f"{ratio:.2f}x, median of {args.repeats} alternating runs (target: <= 1.1x)"
        )


if __name__ == "__main__":
    main()
