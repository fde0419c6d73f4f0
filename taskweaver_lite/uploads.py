"""Files a user loads into a session (`/load`): which ones are accepted, and a copy that keeps holes.

Only regular data files are copied: a folder, a device, a pipe, or a file of the kernel's view of
the system (`/proc/self/environ` holds our environment, API key included) is refused with the
reason. Files above `session.max_upload_bytes` are refused too, naming the setting; a sparse file
is copied sparse, so a mostly empty 1 GiB file never turns into 1 GiB on disk.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from taskweaver_lite.errors import TaskWeaverError

# Pseudo file systems: their "files" are views of processes and devices, never user data.
SYSTEM_ROOTS = (Path("/proc"), Path("/sys"), Path("/dev"))
_CHUNK = 1 << 20


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


def copy_file(source: Path, target: Path) -> None:
    """Copy `source` to `target` with its metadata; a sparse file stays sparse (its holes are not written)."""
    info = source.stat()
    if info.st_blocks * 512 >= info.st_size or not hasattr(os, "SEEK_DATA"):
        shutil.copy2(source, target)
        return
    with source.open("rb") as src, target.open("wb") as dst:
        for start, end in _data_extents(src.fileno(), info.st_size):
            src.seek(start)
            dst.seek(start)
            while start < end and (chunk := src.read(min(_CHUNK, end - start))):
                dst.write(chunk)
                start += len(chunk)
        dst.truncate(info.st_size)  # a hole at the end still counts towards the size
    shutil.copystat(source, target)


def _data_extents(fd: int, size: int) -> list[tuple[int, int]]:
    """The (start, end) ranges of a file that hold data, as the file system reports them."""
    extents: list[tuple[int, int]] = []
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError:  # ENXIO: only a hole is left
            break
        offset = os.lseek(fd, start, os.SEEK_HOLE)
        extents.append((start, offset))
    return extents


def _size(n: int) -> str:
    value = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "bytes" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{n} bytes"
