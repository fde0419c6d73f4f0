"""Files in folders a kernel can write, handled so that no planted link is ever followed.

Code in the kernel can replace any file of its working folder with a symbolic link (to the
config, the store, a file in the user's home) at any moment, also between our check and our use.
So every operation here opens relative to a folder's descriptor with `O_NOFOLLOW`, checks what
it opened with `fstat`, and reads or writes through that same descriptor: nothing is looked up by
name twice. A file is written under a fresh name and renamed into place, so an existing link (or
hard link) is replaced, never written through. Links met on the way are reported, not followed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CHUNK = 1 << 20
# What `/reset` copies at most from the old working folder; the rest is named in the report.
COPY_MAX_ENTRIES = 10_000
COPY_MAX_DEPTH = 32


class UnsafeFileError(OSError):
    """The file is a link, a folder, a device or a pipe where a regular file was expected."""


@dataclass
class CopyReport:
    """What a folder copy did: files copied, and what it refused (links, odd files, past the bounds)."""

    copied: int = 0
    copied_bytes: int = 0
    links: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def notices(self) -> list[str]:
        """One line per kind of thing left behind, for the user."""
        lines = []
        if self.links:
            lines.append(f"Not copied, being symbolic links (never followed): {_listed(self.links)}")
        if self.skipped:
            lines.append(f"Not copied: {_listed(self.skipped)}")
        return lines


def owner_only_folder(path: Path) -> Path:
    """`path` as a folder only its owner can enter (made, or tightened if it exists)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def owner_only_file(path: Path, *, create: bool = False) -> None:
    """Make `path` readable and writable by its owner only (`create`: made empty if missing, else skipped)."""
    if create:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _CLOEXEC, 0o600))
    with contextlib.suppress(FileNotFoundError):
        os.chmod(path, 0o600)


def open_folder(path: Path) -> int:
    """A descriptor of the folder `path` itself (its last part must not be a link)."""
    return os.open(path, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC)


def open_below(folder: Path, relative: str | Path) -> tuple[int, os.stat_result]:
    """The regular file `folder/relative` opened for reading, with no link followed below `folder`.

    UnsafeFileError when a part is a link or the file is not a regular file; OSError if missing.
    """
    parts = Path(relative).parts
    if not parts or any(part in ("", ".", "..", "/") for part in parts):
        raise UnsafeFileError(f"{relative}: not a plain path inside {folder}")
    fd = open_folder(folder)
    for part in parts[:-1]:
        fd = _step(fd, part, os.O_RDONLY | _DIRECTORY)  # each step closes the folder before it
    fd = _step(fd, parts[-1], os.O_RDONLY | _NONBLOCK)  # a planted pipe must not hang us
    try:
        info = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise UnsafeFileError(f"{Path(folder) / relative} is not a regular file")
    return fd, info


def read_below(folder: Path, relative: str | Path, *, max_bytes: int | None = None) -> bytes:
    """The bytes of the regular file `folder/relative` (no link followed), checked and read through one descriptor."""
    fd, info = open_below(folder, relative)
    with os.fdopen(fd, "rb") as file:
        if max_bytes is not None and info.st_size > max_bytes:
            raise UnsafeFileError(f"{Path(folder) / relative} is {info.st_size:,} bytes, more than {max_bytes:,}")
        return file.read() if max_bytes is None else file.read(max_bytes + 1)[:max_bytes]


def read_path(path: Path, *, below: Path, max_bytes: int | None = None) -> bytes:
    """`read_below` for an absolute `path` that must lie in the folder `below` (UnsafeFileError if not)."""
    base = Path(below).resolve()
    path = Path(os.path.abspath(path))
    if not path.is_relative_to(base):
        raise UnsafeFileError(f"{path} is not inside {base}")
    return read_below(base, path.relative_to(base), max_bytes=max_bytes)


def write_from(source_fd: int, folder: Path, name: str, *, sparse_size: int | None = None) -> None:
    """Copy the open file `source_fd` to `folder/name`: written under a fresh name, then renamed over whatever was there.

    The new file belongs to the folder's owner (a kernel's own user); `sparse_size` keeps holes.
    """
    if Path(name).name != name or name in (".", ".."):
        raise UnsafeFileError(f"{name!r} is not a bare file name")
    dir_fd = open_folder(folder)
    try:
        owner, source = os.fstat(dir_fd), os.fstat(source_fd)
        temporary = f".{name}.{secrets.token_hex(6)}.partial"  # unguessable: the kernel cannot take the name first
        out = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600, dir_fd=dir_fd)
        try:
            _copy_data(source_fd, out, sparse_size)
            _give_to(out, owner)
            os.utime(out, ns=(source.st_atime_ns, source.st_mtime_ns))
        except BaseException:
            os.close(out)
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=dir_fd)
            raise
        os.close(out)
        os.replace(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def copy_folder(source: Path, target: Path, *, max_entries: int = COPY_MAX_ENTRIES, max_bytes: int | None = None) -> CopyReport:
    """Copy the regular files and folders of `source` into `target`, following no link, within the bounds.

    Links are listed in the report, as are devices, pipes and what lies past `max_entries` entries,
    `max_bytes` in all or `COPY_MAX_DEPTH` folders deep.
    """
    report = CopyReport()
    source_fd, target_fd = open_folder(source), open_folder(target)
    try:
        _copy_entries(source_fd, target_fd, "", report, _Budget(max_entries, max_bytes), depth=0)
    finally:
        os.close(source_fd)
        os.close(target_fd)
    return report


@dataclass
class _Budget:
    entries: int
    bytes: int | None


def _copy_entries(source_fd: int, target_fd: int, prefix: str, report: CopyReport, budget: _Budget, *, depth: int) -> None:
    for name in sorted(os.listdir(source_fd)):
        shown = prefix + name
        if budget.entries <= 0:
            report.skipped.append(f"{shown} and what follows (more than {COPY_MAX_ENTRIES:,} entries)")
            return
        budget.entries -= 1
        info = os.stat(name, dir_fd=source_fd, follow_symlinks=False)
        if stat.S_ISLNK(info.st_mode):
            report.links.append(shown)
        elif stat.S_ISDIR(info.st_mode):
            _copy_subfolder(source_fd, target_fd, name, report, budget, depth=depth)
        elif not stat.S_ISREG(info.st_mode):
            report.skipped.append(f"{shown} (not a regular file)")
        elif budget.bytes is not None and info.st_size > budget.bytes:
            report.skipped.append(f"{shown} ({info.st_size:,} bytes: past the size bound)")
        else:
            _copy_one(source_fd, target_fd, name, report, budget)


def _copy_subfolder(source_fd: int, target_fd: int, name: str, report: CopyReport, budget: _Budget, *, depth: int) -> None:
    if depth + 1 >= COPY_MAX_DEPTH:
        report.skipped.append(f"{name} (more than {COPY_MAX_DEPTH} folders deep)")
        return
    inner_source = _step(os.dup(source_fd), name, os.O_RDONLY | _DIRECTORY)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=target_fd)
        inner_target = _step(os.dup(target_fd), name, os.O_RDONLY | _DIRECTORY)
        try:
            _give_to(inner_target, os.fstat(target_fd))
            _copy_entries(inner_source, inner_target, f"{name}/", report, budget, depth=depth + 1)
        finally:
            os.close(inner_target)
    finally:
        os.close(inner_source)


def _copy_one(source_fd: int, target_fd: int, name: str, report: CopyReport, budget: _Budget) -> None:
    try:
        fd = _step(os.dup(source_fd), name, os.O_RDONLY | _NONBLOCK)
    except UnsafeFileError:
        report.links.append(name)  # swapped for a link since it was listed
        return
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            report.skipped.append(f"{name} (not a regular file)")
            return
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600, dir_fd=target_fd)
        try:
            _copy_data(fd, out, info.st_size if info.st_blocks * 512 < info.st_size else None)
            _give_to(out, os.fstat(target_fd))
            os.utime(out, ns=(info.st_atime_ns, info.st_mtime_ns))
        finally:
            os.close(out)
    finally:
        os.close(fd)
    report.copied += 1
    report.copied_bytes += info.st_size
    if budget.bytes is not None:
        budget.bytes -= info.st_size


def links_in(folder: Path) -> list[str]:
    """The symbolic links directly in `folder`, by name (what the kernel made; reported, never followed)."""
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        return sorted(entry.name for entry in entries if entry.is_symlink())
    return []


def _step(fd: int, part: str, flags: int) -> int:
    """Open `part` relative to the folder `fd` (closed here) with no link followed."""
    try:
        return os.open(part, flags | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (40, 20):  # ELOOP: a link; ENOTDIR: a link or file where a folder should be
            raise UnsafeFileError(exc.errno, f"{part} is a link or not a folder; not followed") from None
        raise
    finally:
        os.close(fd)


def _give_to(fd: int, owner: os.stat_result) -> None:
    """Root copies files to a kernel's folder for that kernel's user; others cannot change owners (and need not)."""
    if os.geteuid() == 0 and (owner.st_uid, owner.st_gid) != (0, 0):
        os.fchown(fd, owner.st_uid, owner.st_gid)


def _copy_data(source: int, target: int, sparse_size: int | None) -> None:
    """Copy from descriptor to descriptor; with `sparse_size`, only the data ranges (holes stay holes)."""
    if sparse_size is None or not hasattr(os, "SEEK_DATA"):
        while chunk := os.read(source, _CHUNK):
            os.write(target, chunk)
        return
    for start, end in _data_extents(source, sparse_size):
        os.lseek(source, start, os.SEEK_SET)
        os.lseek(target, start, os.SEEK_SET)
        while start < end and (chunk := os.read(source, min(_CHUNK, end - start))):
            os.write(target, chunk)
            start += len(chunk)
    os.ftruncate(target, sparse_size)  # a hole at the end still counts towards the size


def _data_extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """The (start, end) ranges of a file that hold data, as the file system reports them."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError:  # ENXIO: only a hole is left
            return
        offset = os.lseek(fd, start, os.SEEK_HOLE)
        yield start, offset


def _listed(names: list[str], limit: int = 10) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
