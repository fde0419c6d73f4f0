"""The session lock: one process at a time may have a session open.

An exclusive operating-system lock, taken through `filelock` (`flock` on POSIX, `LockFileEx` on
Windows), on a small file beside the database (`<db>.locks/<id>.lock`); the holder's pid is written
beside it (`<id>.owner`) for the message another process gets. The operating system drops the lock
when the process exits in any way, even `kill -9`, so a crash never leaves a session stuck. The lock
file is opened non-inheritable, so the Jupyter kernel a session starts does not inherit (and keep) it.
"""

from __future__ import annotations

import os
from pathlib import Path

import filelock

from taskweaver_lite.errors import SessionBusyError


class SessionLock:
    """Proof that this process has a session open; released on `release()`, on exit, or when the process dies."""

    def __init__(self, path: Path, *, session_id: str) -> None:
        self.path = path
        self.session_id = session_id
        # The pid lives in its own file: Windows will not let another process read a locked file.
        self.owner_path = path.with_suffix(".owner")
        path.parent.mkdir(parents=True, exist_ok=True)
        # timeout=0: fail at once rather than wait. Not thread-local: a session may be closed by
        # another thread than the one that opened it.
        lock = filelock.FileLock(path, timeout=0, thread_local=False)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise SessionBusyError(
                f"session {session_id} is open in another taskweaver-lite process (pid {self._holder()}); close it there first, or resume a different session"
            ) from None
        self._lock: filelock.FileLock | None = lock
        self.owner_path.write_text(f"{os.getpid()}\n", encoding="ascii")

    def release(self) -> None:
        """Let other processes open the session (the owner file stays: the next holder overwrites it)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _holder(self) -> str:
        try:
            return self.owner_path.read_text(encoding="ascii", errors="replace").strip() or "unknown"
        except OSError:  # the holder has not written it yet
            return "unknown"

    def __enter__(self) -> SessionLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
