"""The disk limit (`execution.disk_limit`): what a session's kernel may keep on disk, in total.

What counts: everything in the session's working folder (files you `/load` too), the kernel's
socket folder (the only other place on disk a sandboxed kernel can write) and its log (its stderr),
each file at the larger of its length and the space it takes (a sparse file counts at its length),
every folder at its own size, a file with several links once.

How it holds, as root and as an ordinary user, with or without the sandbox, and without root's
help (no quota, no loop-mounted filesystem; a size-capped tmpfs would not keep the files):

- `RLIMIT_FSIZE`: no file any process of the kernel writes may grow past the limit (set at
  start by `limits.py`, so one huge write stops there with "File too large"). Lowering it to the
  room left before each cell would need CAP_SYS_RESOURCE over the kernel's process (root in a
  container often lacks it) or a request to the kernel per cell: the watcher does that work;
- a watcher measures the folders while the kernel lives, every few hundredths of a second
  while a cell runs (the walk's own CPU time times twenty, when it is slower) and every second
  between cells, but never later than half the time the growth seen between its last two looks
  would take to pass a limit: on a busy machine a walk waiting for a core takes long, and twenty
  times that was time enough for a cell to write 100,000 small files past a 4 MB limit. Before
  any growth is seen (a cell's first look, a quiet spell) the pause does not stretch with load
  either: it is twenty times the walk's CPU time, and its wall time (a busy machine's wait for a
  core, a slow disk) pushes the next look back a second at most, unless the room left before the
  limit is more than a writer at 64 MB/s would fill meanwhile. Growth that has just begun near a
  limit is looked at again at once, its true pace measured: it may have begun an instant before
  the look that saw it. So a writer at 16 MB/s toward 20 MB is first seen within a megabyte or
  two of the limit, on a busy machine as on an idle one. Many
  small files pass any per-file cap: the watcher sees their total. Past
  the limit it ends the kernel's child processes (a `dd`, a pool's workers: often the writers)
  and interrupts the running cell; the cell's result says the limit was reached, at what size,
  and which setting raises it, and the session goes on. Between cells, a total still growing
  after the children were ended is the kernel's own doing (a thread): the kernel is ended, and
  the next cell runs on a fresh one and says why;
- a folder the walk cannot measure (nested deeper than `MAX_DEPTH`, unreadable after its owner's
  permissions were given back) counts as past the limit: hiding files must not be a way around it.

Kernels on a Jupyter gateway write on the gateway's machine: the limit cannot be kept from here,
so the config refuses `disk_limit` beside `kernel_gateway` (as it does the other limits). Without
the sandbox (`execution.sandbox: none`) the limit holds for the working folder the same way, but
the kernel can write wherever this program's user can: there it guards against mistakes only.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from taskweaver_lite.kernel.sandbox.kernel_pid import children
from taskweaver_lite.records.execution import CellError

MAX_DEPTH = 128
FAST, SLOW = 0.02, 1.0  # seconds between measures while a cell runs, and between cells
_SLOWDOWN = 20  # the watcher spends at most a twentieth of a core walking


class Unmeasurable(Exception):
    """A folder whose size cannot be known: it counts as past the limit."""


def human(size: int) -> str:
    """`104857600` as `100.0 MB` (powers of 1024, as the setting reads them)."""
    value = float(size)
    for unit in ("B", "KB", "MB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


def used(paths: tuple[Path, ...]) -> int:
    """What `paths` (folders or files) take on disk, as the limit counts it; Unmeasurable if a folder cannot be read."""
    return measured(paths)[0]


def measured(paths: tuple[Path, ...], *, most: int | None = None) -> tuple[int, int]:
    """(bytes on disk, files and folders) of `paths` and all below them, as the limits count them; Unmeasurable if a folder cannot be read.

    With `most`, the walk stops once it has counted more than `most` entries: what it returns then is
    a lower bound of both, enough to say a files limit is passed without walking a flood to its end.
    """
    seen: set[tuple[int, int]] = set()
    total = entries = 0
    for path in paths:
        try:
            info = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            continue
        total += _size(info, seen)
        folder = _open_folder(str(path), None) if stat.S_ISDIR(info.st_mode) else None
        if folder is not None:
            size, count = _folder(folder, seen, depth=1, most=None if most is None else most - entries)
            total, entries = total + size, entries + count
            if most is not None and entries > most:
                break
    return total, entries


def _size(info: os.stat_result, seen: set[tuple[int, int]]) -> int:
    if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
        if (info.st_dev, info.st_ino) in seen:
            return 0
        seen.add((info.st_dev, info.st_ino))
    allocated = info.st_blocks * 512
    return max(info.st_size, allocated) if stat.S_ISREG(info.st_mode) else allocated


def _folder(fd: int, seen: set[tuple[int, int]], *, depth: int, most: int | None = None) -> tuple[int, int]:
    """(size, entries) of what is in the folder open at `fd` (closed here), walked by descriptor: no link is followed, no path grows too long.

    Every name counts as an entry (a file's second link too): each takes a folder's room, and an
    empty file an inode of its own.
    """
    if depth > MAX_DEPTH:
        os.close(fd)
        raise Unmeasurable(f"folders are nested more than {MAX_DEPTH} deep")
    total = count = 0
    try:
        with os.scandir(fd) as entries:
            children = []
            for entry in entries:
                count += 1
                if most is not None and count > most:
                    return total, count  # enough counted: past `most` (the descriptor is closed below)
                with contextlib.suppress(FileNotFoundError):  # removed while we walk
                    info = entry.stat(follow_symlinks=False)
                    total += _size(info, seen)
                    if stat.S_ISDIR(info.st_mode):
                        children.append(entry.name)
        for name in children:
            child = _open_folder(name, fd)
            if child is not None:
                size, below = _folder(child, seen, depth=depth + 1, most=None if most is None else most - count)
                total, count = total + size, count + below
                if most is not None and count > most:
                    break
    finally:
        os.close(fd)
    return total, count


def _open_folder(name: str, parent: int | None) -> int | None:
    """The folder `name` in `parent`, opened (None: gone, or swapped for a link or a file meanwhile).

    Its owner's permissions are given back if a cell took them away: the session's own folder.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        return os.open(name, flags, dir_fd=parent)
    except PermissionError:
        pass
    except OSError as exc:
        _unless_gone(exc)
        return None
    try:
        mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
        os.chmod(name, stat.S_IMODE(mode) | stat.S_IRWXU, dir_fd=parent)
        return os.open(name, flags, dir_fd=parent)
    except OSError as exc:
        _unless_gone(exc)
        return None


def _unless_gone(error: OSError) -> None:
    """Unmeasurable, unless the folder vanished or was swapped for a link or a file while we walked."""
    if error.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
        return
    raise Unmeasurable(f"a folder cannot be read ({os.strerror(error.errno or errno.EIO)})") from error


@dataclass(frozen=True)
class Reached:
    """The limit was passed: at what size (None: the folders could not be measured, `why` says how)."""

    size: int | None
    limit: int
    why: str = ""
    files: int | None = None  # files and folders counted
    files_limit: int | None = None  # execution.disk_limit_files

    @property
    def too_many_files(self) -> bool:
        """Whether it is the count of files and folders that is past its cap (not the bytes)."""
        return self.files is not None and self.files_limit is not None and self.files > self.files_limit and self.size is not None and self.size <= self.limit

    def message(self, what: str) -> str:
        """What the result says after `what` happened ("The cell was stopped"): the size reached, the setting, how to go on."""
        if self.too_many_files:
            return (
                f"{what} with {self.files:,} files and folders in the working folder, past execution.disk_limit_files ({self.files_limit:,}): "
                "delete files there (shutil.rmtree, os.remove) before making more, or keep many small records in one file, or raise execution.disk_limit_files"
            )
        size = human(self.size) if self.size is not None else f"an unknown size ({self.why})"
        if self.size is not None and size == human(self.limit):  # 100.0 MB past 100.0 MB: say the bytes
            size = f"{self.size:,} bytes"
        return (
            f"{what} with the working folder at {size}, past execution.disk_limit ({human(self.limit)}): "
            "delete files there (del, os.remove) before writing more, or raise execution.disk_limit"
        )


# A busy machine's wait for a core (or a slow disk) stretches the pause only while a writer at this pace could not
# fill the room left meanwhile; past that, a second at most. And growth that has just begun, and would pass a limit
# within HORIZON even at the mean pace seen since the last look, is looked at again at once: it may have begun an
# instant before this look, at many times that pace.
STRETCH_PACE = 64 * 1024 * 1024  # bytes a second
STRETCH_FILES = 10_000  # files and folders a second
HORIZON = 10.0
QUIET = 0.25  # seconds without a change before the folders count as not growing


@dataclass
class Pace:
    """How fast the folders grew between the watcher's last two looks, and when, at that pace, a limit is passed."""

    last: tuple[float, int, int] | None = None  # (monotonic time, bytes, entries) of the last look that measured
    growth: tuple[float, float] = (0.0, 0.0)  # bytes and entries per second between the last two looks
    began: bool = False  # the folders grew since the last look, and not between the two before: when it began is not known

    def note(self, now: float, size: int, count: int) -> None:
        """Keep the look made at `now`, and the pace the folders grew at since the one before.

        A look that finds nothing changed within QUIET of the one before is not kept: a writer may be
        between two writes, and the next look measures its pace over the longer time.
        """
        last = self.last
        if last is not None and (size, count) == last[1:] and now - last[0] < QUIET:
            return
        if last is not None and now > last[0]:
            was_growing = self.growth[0] > 0 or self.growth[1] > 0
            self.growth = ((size - last[1]) / (now - last[0]), (count - last[2]) / (now - last[0]))
            self.began = not was_growing and (self.growth[0] > 0 or self.growth[1] > 0)
        self.last = (now, size, count)

    def until(self, allowed: int, allowed_files: int | None) -> float:
        """Seconds until `allowed` bytes or `allowed_files` entries are passed, at the last pace (inf: not growing; 0: just
        began, and near enough that its true pace must be measured before the next look)."""
        if self.last is None:
            return math.inf
        _, size, count = self.last
        per_byte, per_entry = self.growth
        soonest = (allowed - size) / per_byte if per_byte > 0 else math.inf
        if per_entry > 0 and allowed_files is not None:
            soonest = min(soonest, (allowed_files - count) / per_entry)
        if self.began and soonest < HORIZON:
            return 0.0
        return max(soonest, 0.0)

    def room(self, allowed: int, allowed_files: int | None) -> float:
        """Seconds a writer at STRETCH_PACE (or STRETCH_FILES) would take to fill what is left before a limit (0: not measured yet)."""
        if self.last is None:
            return 0.0
        _, size, count = self.last
        room = (allowed - size) / STRETCH_PACE
        if allowed_files is not None:
            room = min(room, (allowed_files - count) / STRETCH_FILES)
        return max(room, 0.0)


def next_look(*, base: float, walked: float, cpu: float, until: float = math.inf, room: float = 0.0, near: bool = False) -> float:
    """Seconds from a look to the next: `base` (FAST in a cell, SLOW between), after a walk of `walked` seconds that took `cpu` seconds of CPU.

    The watcher spends a twentieth of a core at most: the walk's CPU time times twenty. Its wall time
    stretches the pause too (a busy machine, a slow disk) while `room` (see `Pace.room`) allows, and a
    second at most past it: twenty times a walk's wait for a core let a writer run far past the limit
    before the first look that could see it grow. Never later than half of `until` (when, at the pace
    seen, a limit is passed); `near` the files limit, at once.
    """
    if near:
        return FAST
    pause = max(base, cpu * _SLOWDOWN, min(walked * _SLOWDOWN, max(SLOW, room)))
    return min(pause, max(FAST, until / 2))


class DiskWatch:
    """Watches one kernel's folders against the limit on a thread of its own while the kernel lives.

    `on_reached(reached, in_cell)` is called (on the watcher's thread) once each time the total
    passes what is allowed: the limit, or, when a cell began past it already (the one before was
    stopped a little over), the size it began at, so a cell that only deletes is never stopped;
    between cells, again each time it grows further. `cell()` marks a running cell: measured
    often, and told what it reached.
    """

    def __init__(self, paths: tuple[Path, ...], *, limit: int, on_reached: Callable[[Reached, bool], None], files: int | None = None) -> None:
        """Start watching `paths` (the working folder first); `files`: the most files and folders (execution.disk_limit_files)."""
        self.paths = paths
        self.limit = limit
        self.files = files
        self._allowed_files = files
        self._on_reached = on_reached
        self._in_cell = False
        self._reached: Reached | None = None
        self._near = False  # the last look found past half the files limit: looked at again at once, the walk bounded
        self._pace = Pace()  # the growth between the last two looks (from any thread)
        self._allowed = limit
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="disk-limit", daemon=True)
        self._thread.start()

    def measure(self) -> Reached | int:
        """What the folders take now, or what was reached if past the limit."""
        # A files limit bounds the walk: past twice what is allowed, the count is high enough to act on.
        most = None if self._allowed_files is None else 2 * self._allowed_files
        try:
            size, count = measured(self.paths, most=most)
        except Unmeasurable as exc:
            return Reached(None, self.limit, str(exc))
        except OSError as exc:  # too many open files, an I/O error: what cannot be measured cannot be let pass
            return Reached(None, self.limit, f"the folders could not be walked ({exc.strerror or exc})")
        self._near = self.files is not None and count > self.files // 2  # bytes have RLIMIT_FSIZE besides; files only this count
        self._pace.note(time.monotonic(), size, count)
        if size > self.limit or (self.files is not None and count > self.files):
            return Reached(size, self.limit, files=count, files_limit=self.files)
        return size

    def _pause(self, walked: float, cpu: float, *, between: bool) -> float:
        """Seconds to the next look, after a walk that took `walked` seconds and `cpu` seconds of CPU (see `next_look`)."""
        base = FAST if self._in_cell or between else SLOW
        until, room = self._pace.until(self._allowed, self._allowed_files), self._pace.room(self._allowed, self._allowed_files)
        return next_look(base=base, walked=walked, cpu=cpu, until=until, room=room, near=self._near)

    def _past(self, now: Reached | int) -> Reached | None:
        """`now` if it is past what is allowed at this moment."""
        if not isinstance(now, Reached):
            return None
        if now.size is None or now.size > self._allowed:
            return now
        if now.files is not None and self._allowed_files is not None and now.files > self._allowed_files:
            return now
        return None

    def _allow(self, now: Reached) -> None:
        """From here on, what `now` holds is allowed (but never less than the limits): only growing past it is told."""
        self._allowed = max(self.limit, now.size or self.limit)
        if self.files is not None:
            self._allowed_files = max(self.files, now.files or self.files)

    def _settle(self, now: Reached | int) -> None:
        """At a cell's edge, from what the folders take `now`: what is allowed from here on (the limits, or more if already past them)."""
        if isinstance(now, Reached):
            self._allow(now)
        else:
            self._allowed, self._allowed_files = self.limit, self.files

    @contextlib.contextmanager
    def cell(self) -> Iterator[None]:
        """While the body runs a cell: measured every few hundredths of a second."""
        self._reached = None
        self._settle(self.measure())
        self._in_cell = True
        self._wake.set()
        try:
            yield
        finally:
            self._in_cell = False

    def reached_in_cell(self) -> Reached | None:
        """What the last cell reached: seen by the watcher while it ran, or measured now that it ended."""
        measured = self.measure()
        now, seen = self._past(measured), self._reached
        self._settle(measured)
        if seen is not None and now is not None and seen.size is not None and now.size is not None:
            return now if now.size > seen.size else seen  # what it came to once the cell stopped
        return seen or now

    def close(self) -> None:
        """Stop watching."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        told = False
        while not self._stop.is_set():
            began, began_cpu = time.monotonic(), time.thread_time()
            reached = self._past(self.measure())
            spent, spent_cpu = time.monotonic() - began, time.thread_time() - began_cpu
            in_cell = self._in_cell
            if reached is not None and not told:
                if in_cell:
                    self._reached = reached
                self._on_reached(reached, in_cell)
            told = reached is not None  # said once per passing: again only after going back under, or in a new cell
            between = reached is not None and not in_cell and reached.size is not None
            if between and reached is not None:
                self._allow(reached)  # between cells: told again, soon, if it grows further
                told = False
            pause = self._pause(spent, spent_cpu, between=between)
            while self._wake.wait(pause) and not self._stop.is_set():
                # A cell began: `cell()` has just measured, so the next look is one short pause away.
                self._wake.clear()
                told, pause = False, self._pause(spent, spent_cpu, between=False)


def end_children(kernel: int) -> int:
    """SIGKILL every process below the kernel (not the kernel): what may be writing for it. How many there were."""
    ended = 0
    queue = children(kernel)
    while queue:
        pid = queue.pop()
        queue += children(pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            ended += 1
    return ended


def end_the_writer(kernel: int, *, strikes: int) -> bool:
    """Past the limit between cells for the `strikes`-th time: the kernel's children end the first time; after that the
    kernel itself, which must be what writes (a thread of a cell that ended). True when the kernel was ended."""
    if strikes == 1:
        end_children(kernel)
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(kernel, signal.SIGKILL)
    return True


def disk_limit_notes(error: CellError | None, limit: int | None) -> tuple[str, ...]:
    """A note for a cell that failed with "File too large": no file may grow past the disk limit."""
    if limit is None or error is None or "File too large" not in error.value + error.traceback:
        return ()
    return (f"No file the kernel writes (in /tmp too) may grow past execution.disk_limit ({human(limit)}): raise it for larger files.",)
