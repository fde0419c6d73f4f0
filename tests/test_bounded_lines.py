"""`BoundedLines`: lines up to the limit pass whole, a longer one is dropped however it is cut into chunks, and the lines after it go on."""

from __future__ import annotations

import asyncio
import json

import pytest

from taskweaver_lite.safety.bounded_lines import INVALID_REQUEST, BoundedLines, overlong_error

pytestmark = pytest.mark.unit


def lines_of(data: bytes, *, limit: int, chunk: int) -> tuple[list[bytes], int]:
    """Every line `BoundedLines` gives for `data` read `chunk` bytes at a time, and how many times it said one was dropped."""
    pieces = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    said = 0

    async def read() -> bytes:
        return pieces.pop(0) if pieces else b""

    async def overlong() -> None:
        nonlocal said
        said += 1

    async def collect() -> list[bytes]:
        bounded = BoundedLines(read, on_overlong=overlong, limit=limit)
        got = []
        while line := await bounded.next_line():
            got.append(line)
        assert bounded.dropped == said
        return got

    return asyncio.run(collect()), said


@pytest.mark.parametrize("chunk", [1, 3, 7, 10, 64])
def test_a_line_over_the_limit_is_dropped_and_said_once_however_the_input_is_cut(chunk: int) -> None:
    data = b"short\n" + b"x" * 10 + b"\n" + b"y" * 11 + b"\n" + b"z" * 40 + b"\nlast\n" + b"tail"
    lines, said = lines_of(data, limit=10, chunk=chunk)
    assert lines == [b"short\n", b"x" * 10 + b"\n", b"last\n", b"tail"]
    assert said == 2


def test_an_overlong_line_the_input_ends_in_is_dropped_and_ends_the_lines() -> None:
    lines, said = lines_of(b"ok\n" + b"q" * 100, limit=10, chunk=8)
    assert (lines, said) == ([b"ok\n"], 1)


def test_the_error_is_one_json_rpc_line_with_id_null_naming_the_limit() -> None:
    line = overlong_error(4 * 1024 * 1024)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    error = json.loads(line)
    assert error["id"] is None and error["error"]["code"] == INVALID_REQUEST
    assert "4,194,304 bytes (4 MiB)" in error["error"]["message"]
