"""What keeps one cell from spoiling the next, as run inside the kernel.

This file runs in the ipykernel process, not in ours: `process.py` loads it by path at kernel
start (as `_taskweaver_guard`, so `%reset` cannot remove it) and calls `install()`; `after_cell`
is asked for with every cell's snapshot. Like `snapshot.py` it must stay standalone.

- Messages: a lone surrogate in printed text, an error or a display makes jupyter-client's JSON
  packer refuse the message, so a cell's output vanished while it reported success; such messages
  are sent with the surrogate escaped instead.
- Output streams: a thread's prints land in whichever cell runs when they are flushed, so writes
  from any thread but the main one are labelled as background output. IPython swaps the streams'
  `write` around each cell (to record output) and puts back what it found, so the label is
  (re)attached after each cell, when nothing else holds the streams.
- The working folder: a cell that changed folder (`os.chdir('/')`) would break every later relative
  path while the Planner still lists the session's files; it is put back after each cell.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

MODULE_NAME = "_taskweaver_guard"
BACKGROUND_LABEL = "[background thread] "


def install() -> None:
    """Make the kernel's messages survive lone surrogates and label background output (at kernel start)."""
    session = getattr(getattr(_shell(), "kernel", None), "session", None)
    if session is not None and not getattr(session, "_taskweaver_guarded", False):
        session.pack = _surrogate_safe(session.pack)
        session._taskweaver_guarded = True
    guard_streams()


def guard_streams() -> None:
    """Label writes from background threads on stdout and stderr (idempotent)."""
    for stream in (sys.stdout, sys.stderr):
        if not getattr(stream.write, "_taskweaver_guarded", False):
            stream.write = _guarded(stream.write)  # type: ignore[method-assign]


def after_cell(home: str) -> str:
    """Put the streams' guard and the working folder back; returns the folder the cell left ('' if home)."""
    guard_streams()
    return restore_cwd(home)


def _shell() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _surrogate_safe(pack: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    def pack_escaping_surrogates(obj: Any) -> bytes:
        try:
            return pack(obj)
        except UnicodeEncodeError:  # a lone surrogate: JSON's \\uXXXX escape carries it as valid ASCII
            from jupyter_client.jsonutil import json_default

            return json.dumps(obj, default=json_default, ensure_ascii=True, allow_nan=False).encode("ascii")

    return pack_escaping_surrogates


def _guarded(write: Callable[[str], Any]) -> Callable[[Any], Any]:
    lines = threading.local()  # per thread: whether its next write starts a line

    def guarded_write(text: Any) -> Any:
        if isinstance(text, str) and threading.current_thread() is not threading.main_thread():
            text = _labelled(text, lines)
        return write(text)

    guarded_write._taskweaver_guarded = True  # type: ignore[attr-defined]
    return guarded_write


def _labelled(text: str, lines: threading.local) -> str:
    at_start = getattr(lines, "at_start", True)
    parts = []
    for line in text.splitlines(keepends=True):
        if at_start:
            parts.append(BACKGROUND_LABEL)
        parts.append(line)
        at_start = line.endswith("\n")
    lines.at_start = at_start
    return "".join(parts)


def restore_cwd(home: str) -> str:
    """Go back to `home` if a cell left the kernel in another folder; returns that folder ('' if none)."""
    try:
        here = os.getcwd()
    except OSError:  # the folder was deleted under the kernel
        here = "(a folder that no longer exists)"
    if here == home:
        return ""
    os.chdir(home)
    return here
