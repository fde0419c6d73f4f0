"""The session lock: one process at a time may have a session open.

An exclusive `flock` on a small file beside the database (`<db>.locks/<id>.lock`, holding the
owner's pid for the message). The operating system drops the lock when the process exits in any
way, even `kill -9`, so a crash never leaves a session stuck. Python opens files close-on-exec, so
the Jupyter kernel a session starts does not inherit (and keep) the lock.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from taskweaver_lite.errors import SessionBusyError


class SessionLock:
    """Proof that this process has a session open; released on `release()`, on exit, or when the process dies."""

    def __init__(self, path: Path, *, session_id: str) -> None:
        self.path = path
        self.session_id = session_id
        path.parent.mkdir(parents=True, exist_ok=True)
        # Opened without truncating: the holder's pid must stay readable until we own the lock.
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(self._fd, 32).decode("ascii", "replace").strip() or "unknown"
            os.close(self._fd)
            self._fd = None
            raise SessionBusyError(
                f"session {session_id} is open in another taskweaver-lite process (pid {holder}); "
                "close it there first, or resume a different session"
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        """Let other processes open the session (the file stays: deleting it would race a new locker)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> SessionLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
