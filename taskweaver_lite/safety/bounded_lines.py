"""The JSON-RPC lines a host sends on standard input, each held only up to a limit.

`taskweaver-lite mcp` and `taskweaver-lite acp` read one JSON message per line. Their SDKs read a
whole line into memory before anything looks at it, so a single line of hundreds of megabytes (a
runaway host, a prompt-injected model pasting a file) would be held whole, and parsed. Here each
line is collected only up to `MAX_LINE_BYTES`: a longer one is dropped chunk by chunk as it
streams, never held, and answered with one JSON-RPC error (id null) naming the limit; the lines
after it are served as usual.

`BoundedLines` does the cutting over any source of byte chunks; the two servers put it in front of
their SDK's reader (mcp/server.py, acp/agent.py).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

# The longest line taken: 4 MiB. The largest message a host legitimately sends is a question or a
# prompt of at most 20,000 characters (a long question, a pasted table); JSON's escapes make that at
# most 12 bytes a character (a character outside the BMP as two \\uXXXX escapes), about 240 KB. 4 MiB
# leaves that more than 16 times over, and bounds what one line can make the server hold.
MAX_LINE_BYTES = 4 * 1024 * 1024
# Bytes asked of the source at a time (a pipe hands over at most 64 KiB at once anyway).
CHUNK_BYTES = 64 * 1024
# JSON-RPC's "Invalid Request": the line is dropped unread, so it is no request the server can answer by id.
INVALID_REQUEST = -32600


def overlong_message(limit: int = MAX_LINE_BYTES) -> str:
    """The one line a host hears about a dropped message: what happened and the limit."""
    return (
        f"a message longer than {limit:,} bytes ({limit / 1024 / 1024:g} MiB) was dropped unread: this server takes JSON-RPC "
        "lines up to that size; put large data in a file in the project and name the file"
    )


def overlong_error(limit: int = MAX_LINE_BYTES) -> bytes:
    """The JSON-RPC error (invalid request, id null) for a dropped line, as a line of the wire."""
    error = {"jsonrpc": "2.0", "id": None, "error": {"code": INVALID_REQUEST, "message": overlong_message(limit)}}
    return json.dumps(error).encode() + b"\n"


class BoundedLines:
    """Lines from `read` (a coroutine returning the next chunk of bytes, b"" at the end), each at most `limit` bytes.

    A line past the limit is dropped as it streams, only its count of bytes kept, and
    `on_overlong()` is awaited once for it, as soon as it passed the limit; `next_line()` then
    goes on with the line after it.
    """

    def __init__(self, read: Callable[[], Awaitable[bytes]], *, on_overlong: Callable[[], Awaitable[None]], limit: int = MAX_LINE_BYTES) -> None:
        self._read = read
        self._on_overlong = on_overlong
        self.limit = limit
        self._buffer = bytearray()  # the start of the next line (never more than `limit` bytes) and what came after it
        self._dropping = False  # inside a line past the limit: its bytes are thrown away until its newline
        self._ended = False
        self.dropped = 0  # lines dropped so far

    async def next_line(self) -> bytes:
        """The next line with its newline (the last one may have none), or b"" once the source ended."""
        while True:
            newline = self._buffer.find(b"\n")
            if newline >= 0:
                line = bytes(self._buffer[: newline + 1])
                del self._buffer[: newline + 1]
                if self._dropping:  # the end of a dropped line: what follows it is the next line
                    self._dropping = False
                    continue
                if len(line) - 1 > self.limit:  # it came whole within one chunk: dropped all the same
                    await self._drop(streaming=False)
                    continue
                return line
            if len(self._buffer) > self.limit:  # no newline within the limit: the line is dropped as it streams
                self._buffer.clear()
                if not self._dropping:
                    await self._drop(streaming=True)
            elif self._dropping:
                self._buffer.clear()
            if self._ended:
                rest, self._buffer = bytes(self._buffer), bytearray()
                return b"" if self._dropping else rest
            chunk = await self._read()
            if not chunk:
                self._ended = True
            self._buffer += chunk

    async def _drop(self, *, streaming: bool) -> None:
        """Count a line past the limit and say so; `streaming`: its newline is still to come, and what comes until then is thrown away."""
        self._dropping = streaming
        self.dropped += 1
        await self._on_overlong()
