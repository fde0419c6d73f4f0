"""What a client may send and how slowly: uvicorn with the peer as the socket gives it, a deadline for headers, a cap on bodies.

- No proxy-header rewrite: uvicorn's default replaces the request's client address with the one an
  `X-Forwarded-For` header names when the connection comes from 127.0.0.1, so any local process (a
  kernel among them) could pass for a trusted proxy. Here the ASGI scope's `client` is always the
  TCP peer; `auth.py` believes forwarded headers only from `serve.trusted_proxies` itself.
- A deadline for each request's headers (`serve.header_timeout`): uvicorn times a connection only
  between requests, and resets that timer on every byte, so a client sending its headers a byte a
  second (slowloris) would hold a connection for ever. Here the clock starts when the connection
  opens, and again when a response ends; the connection is closed unless a request's headers have
  all arrived by then.
- A cap on each request's body (`BodyLimit`): a file upload may carry `session.max_upload_bytes`
  (and its multipart envelope), any other request `serve.max_request_bytes`. A larger declared
  Content-Length is refused before a byte of the body is read; a body without one (chunked) is
  counted as it arrives and refused once it passes the cap. Either way: 413 and one line, and
  nothing past the cap is read into memory or onto disk. On `/mcp` the line comes as a JSON-RPC
  error, which an MCP client shows (one JSON-RPC message is one body there: the cap bounds it).
- Each write goes out at once (TCP_NODELAY): a kept-alive connection's responses do not wait for
  the client's delayed ACK.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from typing import Any

import uvicorn
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from taskweaver_lite.config.settings import Config, ServeConfig

UPLOAD_PATH = re.compile(r"^/api/sessions/[^/]+/files$")
MULTIPART_ENVELOPE = 64 * 1024  # what a multipart upload carries besides its file: boundaries, part headers


def server_settings(app: Any, serve: ServeConfig, **options: Any) -> uvicorn.Config:
    """uvicorn's settings for `app`: the TCP peer as the client, request headers due within `serve.header_timeout`; `options` go to uvicorn."""
    timeout = serve.header_timeout

    class Protocol(HeaderDeadline):
        header_timeout = timeout

    return uvicorn.Config(app, http=Protocol, proxy_headers=False, server_header=False, **options)


class HeaderDeadline(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, closing a connection whose next request's headers take longer than `header_timeout`."""

    header_timeout = 10.0
    _deadline: asyncio.TimerHandle | None = None
    _waiting_since: object = None  # the request cycle that was current when the clock started

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        _no_delay(transport)
        super().connection_made(transport)
        self._start_clock()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._start_clock()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def _start_clock(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._waiting_since = self.cycle
        self._deadline = self.loop.call_later(self.header_timeout, self._too_slow)

    def _too_slow(self) -> None:
        """No request's headers came in time (a request still being answered is not waiting for any): close."""
        self._deadline = None
        answering = self.cycle is not None and not self.cycle.response_complete
        if self.cycle is self._waiting_since and not answering and not self.transport.is_closing():
            self.transport.close()


def _no_delay(transport: asyncio.Transport) -> None:
    """Send each write at once (TCP_NODELAY), whatever socket the server listens on.

    asyncio sets it only on sockets made for TCP by name; `serve` binds its own (socket.socket(), protocol
    0), and an accepted connection inherits that. Without it a response written in pieces (headers, then
    body) waits for the client's delayed ACK, 40 ms on Linux, on every request after a connection's first.
    """
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _TooLarge(Exception):
    """A body passed its cap while the application read it."""


class BodyLimit:
    """ASGI middleware: 413 for a body past its cap (see the module docstring), declared or counted as it arrives."""

    def __init__(self, app: ASGIApp, config: Config, *, jsonrpc: tuple[str, int] | None = None) -> None:
        """`jsonrpc`: (path, error code) of the endpoint whose refusals are JSON-RPC errors (`/mcp`)."""
        self._app = app
        self._limits = (config.session.max_upload_bytes + MULTIPART_ENVELOPE, config.serve.max_request_bytes)
        self._jsonrpc = jsonrpc

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        upload = UPLOAD_PATH.match(scope.get("path", "")) is not None
        limit = self._limits[0] if upload else self._limits[1]
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await self._too_large(scope, limit, upload=upload)(scope, receive, send)
            return
        received = 0
        started = False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:
                raise _TooLarge
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self._app(scope, counted, watched)
        except _TooLarge:
            if started:
                raise
            await self._too_large(scope, limit, upload=upload)(scope, receive, send)

    def _too_large(self, scope: Scope, limit: int, *, upload: bool) -> JSONResponse:
        """413 and one line naming the setting: a JSON-RPC error on the JSON-RPC endpoint, else `{"error": line}`."""
        setting = f"session.max_upload_bytes ({limit - MULTIPART_ENVELOPE:,} bytes)" if upload else f"serve.max_request_bytes ({limit:,} bytes)"
        what = "The file is" if upload else "The request's body is"
        line = f"{what} larger than {setting} allows: nothing was done."
        if self._jsonrpc is not None and scope.get("path") == self._jsonrpc[0]:
            body: dict[str, Any] = {"jsonrpc": "2.0", "id": None, "error": {"code": self._jsonrpc[1], "message": line}}
        else:
            body = {"error": line}
        return JSONResponse(body, status_code=413, headers={"Connection": "close"})


def _content_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", []):
        if key == b"content-length":
            return int(value) if value.isdigit() else None
    return None
