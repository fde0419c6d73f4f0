"""A 200 MB JSON-RPC line sent to `taskweaver-lite mcp` and to `taskweaver-lite acp`: dropped as it streams, never held.

Each command is started as a host starts it, and the line is generated as it is written (the test
does not hold it either). While it streams, the server's memory is watched (psutil, and the kernel's
high-water mark): it stays within a few megabytes of what the server held before. The host hears
one JSON-RPC error with id null naming the limit, and the server answers the next request.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import psutil
import pytest
from helpers import cli_env

from taskweaver_lite.cli.init import init_project
from taskweaver_lite.safety.bounded_lines import MAX_LINE_BYTES

pytestmark = pytest.mark.cli

HUGE = 200 * 1024 * 1024  # bytes in the overlong line
PIECE = 1024 * 1024  # written a megabyte at a time
# What the server may gain over its size before the line: the limit it collects up to, and room for the rest.
GROWTH = MAX_LINE_BYTES + 48 * 1024 * 1024
WAIT = 120.0

MCP_INITIALIZE = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}


def request(number: int | None, method: str, params: dict[str, Any] | None = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method} | ({"id": number} if number is not None else {}) | ({"params": params} if params else {})
    return json.dumps(message).encode() + b"\n"


def write_huge_line(pipe: IO[bytes], number: int) -> None:
    """A request whose one string is HUGE bytes long, written as it is made."""
    pipe.write(b'{"jsonrpc": "2.0", "id": %d, "method": "tools/list", "params": {"pad": "' % number)
    piece = b"a" * PIECE
    for _ in range(HUGE // PIECE):
        pipe.write(piece)
    pipe.write(b'"}}\n')
    pipe.flush()


def peak_rss(pid: int) -> int:
    """The process's high-water mark of resident memory (Linux's VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/PID/status")


class Server:
    """A command on pipes: its answers by id, read on a thread as they come."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env())
        self.answers: queue.Queue[dict[str, Any]] = queue.Queue()
        self.stderr: list[bytes] = []
        self._readers = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr or []), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            message = json.loads(line)
            if "id" in message and "method" not in message:  # answers, not the server's own requests or notifications
                self.answers.put(message)

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def answer(self) -> dict[str, Any]:
        try:
            return self.answers.get(timeout=WAIT)
        except queue.Empty:
            raise AssertionError(f"no answer in {WAIT:.0f} s; stderr: {b''.join(self.stderr)[-2000:]!r}") from None

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for reader in self._readers:
            reader.join(timeout=10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def overlong_then_next(server: Server, first: bytes, following: bytes) -> tuple[list[dict[str, Any]], int, int]:
    """`first` answered, the huge line streamed while the server's memory is watched, then `following`: the answers, its size before and its peak."""
    server.send(first)
    assert "result" in server.answer()
    process = psutil.Process(server.proc.pid)
    before = process.memory_info().rss

    def write() -> None:
        assert server.proc.stdin is not None
        write_huge_line(server.proc.stdin, 2)
        server.send(following)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    sampled = before
    deadline = time.monotonic() + WAIT
    while writer.is_alive() and time.monotonic() < deadline:
        sampled = max(sampled, process.memory_info().rss)
        time.sleep(0.02)
    writer.join(timeout=1)
    answers = [server.answer(), server.answer()]
    peak = max(sampled, peak_rss(server.proc.pid))
    return answers, before, peak


def check(answers: list[dict[str, Any]], before: int, peak: int) -> None:
    print(f"server grew by {(peak - before) / 2**20:.1f} MiB over {before / 2**20:.0f} MiB reading a {HUGE / 2**20:.0f} MiB line")
    assert peak - before < GROWTH, f"the server grew by {(peak - before) / 2**20:.0f} MiB reading a {HUGE / 2**20:.0f} MiB line"
    errors = [a for a in answers if "error" in a]
    assert len(errors) == 1 and errors[0]["id"] is None, answers
    assert errors[0]["error"]["code"] == -32600 and f"{MAX_LINE_BYTES:,} bytes" in errors[0]["error"]["message"], errors[0]
    assert [a["id"] for a in answers if "result" in a] == [3], answers


@pytest.fixture
def project(tmp_path: Path) -> Path:
    init_project(tmp_path / "project")
    return tmp_path / "project"


def test_mcp_drops_a_200_mb_line_as_it_streams_answers_one_error_and_serves_the_next_request(project: Path) -> None:
    server = Server([sys.executable, "-m", "taskweaver_lite", "mcp", "-p", str(project)])
    try:
        initialize = request(1, "initialize", MCP_INITIALIZE) + request(None, "notifications/initialized")
        answers, before, peak = overlong_then_next(server, initialize, request(3, "tools/list"))
        check(answers, before, peak)
        tools = next(a for a in answers if "result" in a)["result"]["tools"]
        assert [t["name"] for t in tools] == ["ask", "sessions", "variables", "close_session"]
    finally:
        server.close()
    assert server.proc.returncode == 0, b"".join(server.stderr)[-2000:]


def test_acp_drops_a_200_mb_line_as_it_streams_answers_one_error_and_serves_the_next_request(project: Path) -> None:
    server = Server([sys.executable, "-m", "taskweaver_lite", "acp", "-p", str(project)])
    try:
        answers, before, peak = overlong_then_next(server, request(1, "initialize", {"protocolVersion": 1}), request(3, "initialize", {"protocolVersion": 1}))
        check(answers, before, peak)
        assert next(a for a in answers if "result" in a)["result"]["agentCapabilities"]["loadSession"] is True
    finally:
        server.close()
    assert server.proc.returncode == 0, b"".join(server.stderr)[-2000:]
