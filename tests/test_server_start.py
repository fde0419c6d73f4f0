"""Waiting for a server a test started: it ends when the server answers, and fails on what the server did, not on the clock.

The servers here are tiny programs: one that exits, one that burns CPU without answering, one that answers after a while.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from taskweaver_lite.testing.server_start import cpu_seconds, wait_until_answering

pytestmark = pytest.mark.cli


def started(code: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT)


def test_a_server_that_exits_fails_the_wait_at_once_with_its_status_and_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with started("import sys; print('port 1 is taken', flush=True); sys.exit(3)", log) as process:
        began = time.monotonic()
        with pytest.raises(RuntimeError) as failed:
            wait_until_answering(process, lambda: False, what="the test server", log=log, wall_limit=60)
    assert time.monotonic() - began < 30, "not after a time limit: as soon as it has ended"
    assert "the test server ended with status 3" in str(failed.value) and "port 1 is taken" in str(failed.value)


def test_a_server_stuck_working_fails_once_it_has_spent_its_cpu_however_slow_the_machine(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with started("while True: pass", log) as process:
        try:
            with pytest.raises(RuntimeError) as failed:
                wait_until_answering(process, lambda: False, what="the spinning server", log=log, cpu_limit=0.5, wall_limit=120)
            assert cpu_seconds(process.pid) > 0.5
        finally:
            process.kill()
    assert "the spinning server did not answer" in str(failed.value) and "s of its CPU" in str(failed.value)


def test_a_server_that_answers_ends_the_wait_without_error(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    ready = tmp_path / "ready"
    with started(f"import pathlib, time; time.sleep(0.3); pathlib.Path({str(ready)!r}).touch(); time.sleep(60)", log) as process:
        try:
            wait_until_answering(process, ready.exists, what="the test server", log=log)
            assert process.poll() is None
        finally:
            process.kill()
