"""`serve` as a person starts it: its port, a busy one, the token link, the sign-in page, the access log, `--demo`."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from helpers import cli_env, make_project

from taskweaver_lite.cli.main import DEFAULT_PORT, build_parser
from taskweaver_lite.cli.serve import start_line
from taskweaver_lite.web.access_log import request_line

pytestmark = pytest.mark.cli


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def serving(*args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`taskweaver-lite serve ARGS` until its start line (returned); stopped at the end."""
    command = [sys.executable, "-m", "taskweaver_lite", "serve", *args]
    with subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env()) as proc:
        try:
            assert proc.stderr is not None
            line = ""
            deadline = time.monotonic() + 60
            while "serving" not in line and time.monotonic() < deadline and proc.poll() is None:
                line = proc.stderr.readline()
            yield proc, line
        finally:
            proc.terminate()
            proc.wait(30)


def test_the_default_port_is_not_vllms_8000() -> None:
    args = build_parser().parse_args(["serve"])
    assert args.port == DEFAULT_PORT != 8000


def test_a_busy_port_is_one_line_naming_port_and_nothing_is_said_to_be_served(tmp_path: Path) -> None:
    project = make_project(tmp_path, "http://127.0.0.1:9/v1")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "taskweaver_lite", "serve", "-p", str(project), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            env=cli_env(),
        )
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert f"port {port} on 127.0.0.1 is already in use" in done.stderr and "--port" in done.stderr
    assert "serving" not in done.stderr and "Traceback" not in done.stderr and "Errno" not in done.stderr


def test_the_start_line_is_a_link_that_signs_the_page_in_and_the_token_leaves_the_address(tmp_path: Path) -> None:
    project = make_project(tmp_path, "http://127.0.0.1:9/v1")
    port = free_port()
    log = tmp_path / "access.log"
    with serving("-p", str(project), "--port", str(port), "--token", "s3cret/+", "--log", str(log)) as (_, line):
        link = re.search(r"open (\S+)", line)
        assert link is not None, line
        assert link.group(1) == f"http://127.0.0.1:{port}/?token=s3cret%2F%2B"
        with httpx.Client(follow_redirects=True) as browser:
            bare = browser.get(f"http://127.0.0.1:{port}/")
            assert bare.status_code == 401 and bare.headers["content-type"].startswith("text/html"), "a person gets a page, not JSON"
            assert "--token" in bare.text and "TASKWEAVER_LITE_TOKEN" in bare.text and '<form method="post" action="/sign-in">' in bare.text
            page = browser.get(link.group(1), headers={"Sec-Fetch-Site": "none"})  # as a browser sends for a link opened from a terminal
            assert page.status_code == 200 and str(page.url) == f"http://127.0.0.1:{port}/", "the token is dropped from the address"
            assert 'id="chat"' in page.text
            assert browser.get(f"http://127.0.0.1:{port}/api/sessions").status_code == 200, "the page's cookie signs in the API"
        written = log.read_text(encoding="utf-8")
    assert "GET /?token=*** 303" in written, written
    assert "GET / 401" in written and "GET /api/sessions 200" in written
    assert "s3cret" not in written, "the token never reaches the log"


def test_the_access_log_line_hides_the_token_and_keeps_the_rest() -> None:
    scope = {"client": ("127.0.0.1", 5), "method": "GET", "path": "/", "query_string": b"token=abc&x=1"}
    line = request_line(scope, status=303, seconds=0.012)
    assert line.endswith("127.0.0.1 GET /?token=***&x=1 303 12ms user=- session=-")


def test_the_start_line_names_a_usable_address_for_a_wildcard_host() -> None:
    assert start_line(Path("p"), host="0.0.0.0", port=8765, token="t") == (
        "taskweaver-lite serving p at http://127.0.0.1:8765/ (listening on every address of this machine, 0.0.0.0 port 8765)"
        " (token required); open http://127.0.0.1:8765/?token=t"
    ), "a wildcard host: a usable address to open, and the line says the server listens on every address"
