"""Files a user loads into a session (`/load`): which ones are accepted, and a copy that keeps holes.

Only regular data files are copied: a folder, a device, a pipe, or a file of the kernel's view of
the system (`/proc/self/environ` holds our environment, API key included) is refused with the
reason. Files above `session.max_upload_bytes` are refused too, naming the setting; a sparse file
is copied sparse, so a mostly empty 1 GiB file never turns into 1 GiB on disk. The copy lands in a
folder the kernel writes, so it goes in link-safe (`workfiles.write_from`): a link the kernel
planted under the same name is replaced, never written through.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from taskweaver_lite.errors import TaskWeaverError
from taskweaver_lite.safety.workfiles import write_from

# Pseudo file systems: their "files" are views of processes and devices, never user data.
SYSTEM_ROOTS = (Path("/proc"), Path("/sys"), Path("/dev"))


class UploadError(TaskWeaverError):
    """A file the user asked to load cannot be loaded; the message says why and what to do."""


def check_upload(source: Path, *, max_bytes: int) -> Path:
    """The resolved path of `source` if /load may copy it; UploadError naming the reason if not."""
    try:
        resolved = source.resolve(strict=True)
        info = resolved.stat()
    except FileNotFoundError:
        raise UploadError(f"{source}: no such file") from None
    except OSError as exc:
        raise UploadError(f"{source}: cannot be read ({exc.strerror or exc})") from None
    if stat.S_ISDIR(info.st_mode):
        raise UploadError(f"{source} is a folder; /load copies one file at a time: load each file you need")
    if any(resolved.is_relative_to(root) for root in SYSTEM_ROOTS) or not stat.S_ISREG(info.st_mode):
        raise UploadError(f"{source} is not a regular data file ({resolved}); /load only copies regular files")
    if info.st_size > max_bytes:
        raise UploadError(
            f"{source} is {_size(info.st_size)}, more than session.max_upload_bytes ({_size(max_bytes)}); not loaded. "
            "Raise the limit (--set session.max_upload_bytes=N) or read the file in place from code"
        )
    return resolved


def copy_file(source: Path, folder: Path, name: str) -> None:
    """Copy `source` into `folder` as `name`, link-safe: a link or file already there is replaced, never written through.

    The source is opened once and checked through that descriptor (a regular file still); a
    sparse file stays sparse. Copying a file onto itself does nothing.
    """
    fd = os.open(source, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UploadError(f"{source} is not a regular data file; /load only copies regular files")
        if _same_file(info, folder, name):
            return
        write_from(fd, folder, name, sparse_size=info.st_size if info.st_blocks * 512 < info.st_size else None)
    finally:
        os.close(fd)


def _same_file(info: os.stat_result, folder: Path, name: str) -> bool:
    try:
        there = (folder / name).lstat()
    except OSError:
        return False
    return stat.S_ISREG(there.st_mode) and (there.st_dev, there.st_ino) == (info.st_dev, info.st_ino)


def _size(n: int) -> str:
    value = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "bytes" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{n} bytes"
