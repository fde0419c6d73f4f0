"""The MCP SDK's stdio transport with its input read through `BoundedLines`: no line past the limit is held.

The SDK reads standard input a whole line at a time; this hands it the lines instead, each held
only up to safety/bounded_lines.py's MAX_LINE_BYTES. A longer one is dropped as it streams and
answered with one JSON-RPC error (id null) naming the limit, and the server goes on with the next
line. As the SDK does for the descriptors it reads itself, standard input is pointed at the null
device while the server runs (a child reading it sees its end rather than the host's messages) and
given back after.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import AsyncIterator
from typing import Any, cast

import anyio
import mcp_types as types
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage

from taskweaver_lite.safety.bounded_lines import CHUNK_BYTES, INVALID_REQUEST, MAX_LINE_BYTES, BoundedLines, overlong_message


class _TextLines:
    """`BoundedLines` as the SDK reads its input: an async iterator of text lines."""

    def __init__(self, lines: BoundedLines) -> None:
        self._lines = lines

    def __aiter__(self) -> _TextLines:
        return self

    async def __anext__(self) -> str:
        line = await self._lines.next_line()
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")


@contextlib.asynccontextmanager
async def bounded_stdio_server(limit: int = MAX_LINE_BYTES) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's `stdio_server()` streams, its input lines at most `limit` bytes each."""
    wire = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    replies: list[Any] = []  # the write stream, once the SDK made it
    ready = anyio.Event()

    async def read() -> bytes:
        # abandon_on_cancel: a read waiting for the host must not hold up the server's end.
        return await anyio.to_thread.run_sync(os.read, wire, CHUNK_BYTES, abandon_on_cancel=True)

    async def overlong() -> None:
        print(f"taskweaver-lite: {overlong_message(limit)}", file=sys.stderr, flush=True)
        await ready.wait()
        error = types.JSONRPCError(jsonrpc="2.0", id=None, error=types.ErrorData(code=INVALID_REQUEST, message=overlong_message(limit)))
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            await replies[0].send(SessionMessage(error))

    lines = BoundedLines(read, on_overlong=overlong, limit=limit)
    try:
        async with stdio_server(stdin=cast(Any, _TextLines(lines))) as (read_stream, write_stream):
            replies.append(write_stream)
            ready.set()
            yield read_stream, write_stream
    finally:
        # Standard input given back; `wire` stays open: a read abandoned on it must not find its number reused.
        with contextlib.suppress(OSError):
            os.dup2(wire, 0)
