"""Who a sandboxed kernel runs as: when the program runs as root, a user of its own per session.

Kernels of one user share everything a user owns: files, sockets, and the process count that
`RLIMIT_NPROC` limits. So root's sandboxed kernels do not all run as `nobody`: each session gets
an unprivileged uid (and gid) of its own from a range no account uses (`UID_BASE`, `UID_COUNT`
of them), picked from the session folder's path by hash, moved on past any uid that has a process
running, and kept by a resumed session (its working folder is owned by it). The session's
working folder and socket folder are given to that user; everything else the program writes is
root's and owner-only, so one project's kernel can read nothing of another's and cannot connect
to its sockets, and one session's processes never count against another's cap.

Run as an ordinary user, bubblewrap puts the kernel in a user namespace instead: it keeps the
user's uid, so the hidden folders (the home, the project) are what keep other projects out of
sight (SECURITY.md says what that leaves).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from pathlib import Path

from taskweaver_lite.kernel.sandbox import limits

# 1,000,000 uids starting far above any account's and the usual subordinate-uid ranges (100000+).
UID_BASE = 1_900_000_000
UID_COUNT = 1_000_000
_PROBES = 64


def in_range(uid: int) -> bool:
    """Whether `uid` is one of the kernels' own."""
    return UID_BASE <= uid < UID_BASE + UID_COUNT


def kernel_uid(session_dir: Path, *, cwd: Path) -> int | None:
    """The uid the session's sandboxed kernel runs as (None: not root, the kernel keeps the user's uid).

    The working folder's owner when it already is a kernel uid with nothing running (a resumed
    session keeps its files' owner); otherwise the first uid without a running process from the
    place the folder's path hashes to.
    """
    if os.geteuid() != 0:
        return None
    with contextlib.suppress(OSError):
        owner = os.stat(cwd, follow_symlinks=False).st_uid
        if in_range(owner) and limits.user_tasks(owner) == 0:
            return owner
    start = int.from_bytes(hashlib.sha256(os.fsencode(Path(session_dir).resolve())).digest()[:8], "big") % UID_COUNT
    for step in range(_PROBES):
        uid = UID_BASE + (start + step) % UID_COUNT
        if limits.user_tasks(uid) == 0:
            return uid
    raise OSError(f"no free kernel uid found after {_PROBES} tries from {UID_BASE + start}")


def hand_over(folder: Path, uid: int, *, recursive: bool = True) -> None:
    """Give `folder` (and with `recursive` everything in it) to `uid`, owner-only at the top; links are changed themselves, never followed.

    Only a folder that is not the user's already is walked, so a resumed session's costs one stat.
    """
    info = os.stat(folder, follow_symlinks=False)
    if stat.S_ISLNK(info.st_mode):
        raise OSError(f"{folder} is a link; a kernel's folder must be a real folder")
    if not recursive:
        os.chown(folder, uid, uid, follow_symlinks=False)
    elif info.st_uid != uid:
        for _root, dirs, files, root_fd in os.fwalk(folder, follow_symlinks=False):
            os.chown(root_fd, uid, uid)
            for name in (*dirs, *files):
                os.chown(name, uid, uid, dir_fd=root_fd, follow_symlinks=False)
    os.chmod(folder, 0o700, follow_symlinks=False)
