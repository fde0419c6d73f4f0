"""What a client may send `serve`, and what it is told: headers on time, bodies under their caps, names it can use, answers that say nothing of the server.

A real uvicorn on 127.0.0.1 (`WebServer`), raw sockets where a client misbehaves on purpose; no
kernel starts and no model is called.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers import make_project
from uvicorn.server import ServerState

from taskweaver_lite.cli.serve import listening
from taskweaver_lite.config.file import load_config
from taskweaver_lite.store.database import SessionStore
from taskweaver_lite.testing.web_server import WebServer
from taskweaver_lite.web.access_log import request_line
from taskweaver_lite.web.app import MCP_REFUSED
from taskweaver_lite.web.connections import server_settings

pytestmark = pytest.mark.unit


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path, "http://127.0.0.1:9", session={"max_upload_bytes": 100_000}, serve={"max_request_bytes": 50_000, "header_timeout": 0.5})


@pytest.fixture
def web(project: Path) -> Iterator[WebServer]:
    with WebServer(load_config(project)) as server:
        yield server


def connect(web: WebServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", web.port), timeout=10)
    sock.settimeout(10)
    return sock


def answer_of(sock: socket.socket) -> bytes:
    """What the server sent until it closed the connection (or ten seconds passed)."""
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return received


def test_a_client_sending_its_headers_a_byte_a_second_is_disconnected_after_serve_header_timeout(web: WebServer) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * 40 + b"\r\n\r\n"
    with connect(web) as sock:
        started = time.monotonic()
        closed_after = None
        for byte in request:
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.monotonic() - started
                break
            sock.settimeout(0.2)
            try:
                if sock.recv(1024) == b"":
                    closed_after = time.monotonic() - started
                    break
            except TimeoutError:
                pass  # still open: the next byte
        assert closed_after is not None, "the connection outlived the whole trickled request"
        assert closed_after < 2.5, f"closed only after {closed_after:.1f} s (serve.header_timeout is half a second)"
    # A client that sends its headers at once, and waits between requests, is not cut off mid-request.
    with httpx.Client(base_url=web.url) as client:
        assert client.get("/healthz").status_code == 200
        time.sleep(0.6)  # longer than serve.header_timeout: an idle kept-alive connection is not a slow request
        assert client.get("/healthz").status_code == 200


def test_a_declared_body_over_serve_max_request_bytes_is_refused_before_it_is_read(web: WebServer) -> None:
    with connect(web) as sock:
        head = "POST /api/sessions/x/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 300000000\r\n\r\n"
        sock.sendall(head.encode())  # and not one byte of the body: the answer must not wait for it
        answer = answer_of(sock)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    body = answer.split(b"\r\n\r\n", 1)[1]
    assert b"serve.max_request_bytes (50,000 bytes)" in body and b"\n" not in body


@pytest.mark.parametrize(
    ("path", "kind", "setting"),
    [
        ("/api/sessions/x/messages", "application/json", b"serve.max_request_bytes"),
        ("/api/sessions/x/files", "multipart/form-data; boundary=b", b"max_upload_bytes"),
    ],
)
def test_a_chunked_body_without_a_length_is_counted_as_it_arrives_and_refused_past_its_cap(web: WebServer, path: str, kind: str, setting: bytes) -> None:
    with connect(web) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {kind}\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        opening = b'--b\r\nContent-Disposition: form-data; name="file"; filename="big.csv"\r\n\r\n' if "files" in path else b'{"text": "'
        sock.sendall(b"%x\r\n%s\r\n" % (len(opening), opening))
        chunk = b"x" * 65536
        try:
            for _ in range(4):  # 256 KiB, past both caps; the body never ends (no last chunk): only the cap can answer
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = answer_of(sock)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    assert setting in answer.split(b"\r\n\r\n", 1)[1]


@pytest.mark.parametrize("declared", [True, False], ids=["declared-length", "endless-chunked-line"])
def test_one_json_rpc_message_to_mcp_over_serve_max_request_bytes_gets_a_json_rpc_error_naming_it(web: WebServer, declared: bool) -> None:
    head = "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
    opening = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "ask", "arguments": {"question": "'
    with connect(web) as sock:
        if declared:
            sock.sendall((head + "Content-Length: 300000000\r\n\r\n").encode() + opening)
        else:
            sock.sendall((head + "Transfer-Encoding: chunked\r\n\r\n").encode() + b"%x\r\n%s\r\n" % (len(opening), opening))
            chunk = b"x" * 65536
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                for _ in range(4):  # a line that never ends: only the cap can answer
                    sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        answer = answer_of(sock)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert error["jsonrpc"] == "2.0" and error["id"] is None and error["error"]["code"] == MCP_REFUSED, error
    assert "serve.max_request_bytes (50,000 bytes)" in error["error"]["message"], error


def test_an_upload_name_too_long_for_a_file_system_is_a_400_not_a_500(web: WebServer) -> None:
    with httpx.Client(base_url=web.url) as client:
        refused = client.post("/api/sessions/x/files", files={"file": ("a" * 300 + ".csv", b"a,b\n1,2\n", "text/csv")})
    assert refused.status_code == 400 and "at most 255 bytes" in refused.json()["error"], refused.text


def test_the_access_log_escapes_control_characters_a_client_put_in_its_path() -> None:
    scope = {"client": ("127.0.0.1", 5), "method": "GET", "path": "/x\n2026-01-01T00:00:00 10.0.0.1 GET /admin 200", "query_string": b"a=%1b%5b31m"}
    line = request_line(scope, status=404, seconds=0.001)
    assert "\n" not in line and "\x1b" not in line, line
    assert "/x\\x0a2026-01-01" in line and "a=%1B%5B31m" in line, line
    sent = {**scope, "raw_path": b"/x%0A2026 forged"}
    assert " GET /x%0A2026 forged?a=" in request_line(sent, status=404, seconds=0.001), "the path as sent, still encoded"


def test_answers_name_no_path_on_the_server_and_a_404_does_not_name_the_store(project: Path, web: WebServer, capsys: pytest.CaptureFixture[str]) -> None:
    store = SessionStore(project / "sessions.db")
    token = store.add_user("ana")
    store.close()
    with httpx.Client(base_url=web.url, headers={"Authorization": f"Bearer {token}"}) as client:
        missing = client.get("/api/sessions/nope")
        assert missing.status_code == 404 and missing.json()["error"] == "No such session: GET /api/sessions lists yours.", missing.text
        exported = client.get("/api/sessions/nope/export")
        assert exported.status_code == 404 and "sessions.db" not in exported.text
        none_yet = client.get("/api/sessions/last")  # the store's own message names its file
        assert none_yet.status_code == 400 and "no stored sessions" in none_yet.json()["error"], none_yet.text
        for answer in (missing, exported, none_yet):
            assert str(project) not in answer.text and "/tmp" not in answer.text, answer.text


def test_every_connection_sends_at_once_even_on_serves_own_listening_socket(project: Path) -> None:
    """`serve` binds its own socket (protocol 0), whose connections asyncio leaves without TCP_NODELAY: each response after
    a connection's first then waited for the client's delayed ACK (40 ms), which an MCP host keeping its connection pays
    on every call."""

    async def app(scope: object, receive: object, send: object) -> None:  # never reached: the connection only opens
        raise AssertionError("no request is sent")

    settings = server_settings(app, load_config(project).serve)
    settings.load()
    made: list[asyncio.Protocol] = []

    async def scenario() -> int:
        loop = asyncio.get_running_loop()

        def protocol() -> asyncio.Protocol:
            made.append(settings.http_protocol_class(config=settings, server_state=ServerState(), app_state={}, _loop=loop))  # type: ignore[call-arg]
            return made[-1]

        with listening("127.0.0.1", 0) as sock:
            server = await loop.create_server(protocol, sock=sock)
            _, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
            while not made or getattr(made[0], "transport", None) is None:
                await asyncio.sleep(0.01)
            accepted = made[0].transport.get_extra_info("socket")  # type: ignore[attr-defined]
            option = int(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()
            server.close()
            return option

    assert asyncio.run(scenario()) == 1
