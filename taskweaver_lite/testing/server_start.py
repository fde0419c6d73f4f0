"""Starting a server for a test or bench: a free port for it, and the wait until it answers, by what it did rather than by the clock.

On a loaded machine a server may take minutes of wall time to start while it gets a sliver of a CPU:
a limit in seconds of wall time fails it for what the other programs did. So the wait ends when
the server answers; fails at once, with the end of its log, when its process ends; and fails when
the process has spent `cpu_limit` seconds of CPU without answering (it is stuck working), or, as a
last resort for a server stuck waiting on something, after `wall_limit` seconds.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

START_CPU = 60.0  # seconds of the server's own CPU: several times what any of ours takes to start
START_WALL = 600.0  # seconds of wall time, whatever the load: a server that waits on something that never comes
LOG_TAIL = 4000  # characters of the log quoted in an error


def free_port() -> int:
    """A TCP port nobody listens on right now, on 127.0.0.1."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_until_answering(
    process: subprocess.Popen[Any],
    answers: Callable[[], bool],
    *,
    what: str,
    log: Path,
    cpu_limit: float = START_CPU,
    wall_limit: float = START_WALL,
    pause: float = 0.1,
) -> None:
    """Until `answers()` is true (it must catch its own connection errors); RuntimeError naming `what`, quoting `log`, otherwise."""
    started = time.monotonic()
    while not answers():
        if process.poll() is not None:
            raise RuntimeError(f"{what} ended with status {process.returncode} before it answered; the end of its log ({log}):\n{_tail(log)}")
        spent, waited = cpu_seconds(process.pid), time.monotonic() - started
        if spent > cpu_limit or waited > wall_limit:
            raise RuntimeError(f"{what} did not answer in {waited:.0f} s ({spent:.1f} s of its CPU); the end of its log ({log}):\n{_tail(log)}")
        time.sleep(pause)


def cpu_seconds(pid: int) -> float:
    """The CPU time process `pid` has spent, user and system (0 where /proc does not say: the wall limit still holds)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime and stime, the 14th and 15th fields


def _tail(log: Path) -> str:
    try:
        return log.read_text(encoding="utf-8", errors="replace")[-LOG_TAIL:]
    except OSError as exc:
        return f"(unreadable: {exc})"
