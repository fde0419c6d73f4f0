"""A kernel's own cgroup: its memory counted over all its processes, its share of the CPU, its processes.

Each kernel gets a cgroup of its own, `taskweaver-lite-<pid>-<random>` beside this program's (in
it, on cgroup v2), which the limits launcher (limits.py) joins before bubblewrap starts: every process of the kernel, its
`/tmp` and `/dev/shm` pages included, is counted in it from its first instruction, and none can
leave it (moving a process needs write access to the cgroup folders, which the sandbox never has).

- `execution.memory_limit` is the kernel's total: past it the kernel's largest process is ended by
  the kernel's out-of-memory killer (a cell's worker, usually, not the kernel), and the cell says
  so, naming the setting. Swap is not a way around it.
- `execution.cpu_limit` (cores) caps its CPU time. Without it the kernel is still one group to the
  scheduler: one kernel's many busy processes get one kernel's share, not one share each. Kernels'
  groups sit directly in this program's cgroup, not in a group of their own: together they never
  get less than their number of shares.
- `execution.max_processes` caps its processes and threads (beside the per-uid `RLIMIT_NPROC`).

Where a cgroup can be made: as root, on cgroup v1 (a hierarchy per controller, as on many container
hosts) or v2; as an ordinary user, in a delegated v2 subtree (systemd's `Delegate=yes`), where this
program moves itself into a leaf of that subtree first (v2 allows no process in a cgroup that
hands controllers down). Elsewhere `NoCgroup` says why, in one line, and the limits are the
per-process ones alone. `execution.cgroup: off` turns it off.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from taskweaver_lite.config.settings import ExecutionConfig
from taskweaver_lite.kernel.sandbox.disk_limit import human
from taskweaver_lite.kernel.sandbox.kernel_pid import alive

ROOT = Path("/sys/fs/cgroup")
PREFIX = "taskweaver-lite-"  # a kernel's cgroup, beside this program's own: taskweaver-lite-<our pid>-<random>
PROGRAM_LEAF = "taskweaver-lite-program"  # v2, as an ordinary user: where this program moves to hand controllers down
PERIOD = 100_000  # microseconds of the CPU quota's period
_KERNEL_NAME = re.compile(r"taskweaver-lite-(\d+)-[0-9a-f]+")


class NoCgroup(Exception):
    """No cgroup can be made here; `str()` says why, in words for the admin."""


@dataclass(frozen=True)
class Caps:
    """What a kernel's cgroup caps (None: no cap for that one)."""

    memory: int | None = None  # bytes, all the kernel's processes together
    cpu: float | None = None  # cores
    processes: int | None = None  # processes and threads


@dataclass
class KernelCgroup:
    """One kernel's cgroup: a folder per controller (v1) or one folder (v2)."""

    folders: tuple[Path, ...]
    version: int

    def join_files(self) -> list[str]:
        """The files a process writes its id to, to join the cgroup (the launcher's `--join`)."""
        return [str(folder / "cgroup.procs") for folder in self.folders]

    def memory_folder(self) -> Path | None:
        """The folder holding the memory controller's files."""
        for folder in self.folders:
            if (folder / ("memory.max" if self.version == 2 else "memory.limit_in_bytes")).exists():
                return folder
        return None

    def oom_kills(self) -> int:
        """How many processes of the kernel its memory limit has ended so far."""
        folder = self.memory_folder()
        if folder is None:
            return 0
        counters = folder / ("memory.events" if self.version == 2 else "memory.oom_control")
        with contextlib.suppress(OSError, ValueError):
            for line in counters.read_text(encoding="ascii").splitlines():
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
        return 0

    def processes(self) -> list[int]:
        """The processes in the cgroup now."""
        found: set[int] = set()
        for folder in self.folders:
            with contextlib.suppress(OSError, ValueError):
                found |= {int(pid) for pid in (folder / "cgroup.procs").read_text(encoding="ascii").split()}
        return sorted(found)

    def remove(self, *, wait: float = 5.0) -> None:
        """End whatever is left in the cgroup and remove its folders (each try waits for ended processes to go)."""
        deadline = time.monotonic() + wait
        for folder in self.folders:
            while True:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        break
                for pid in self.processes():
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.05)


def _write(path: Path, value: str) -> None:
    with open(path, "w", encoding="ascii") as file:
        file.write(value)


def _new_folder(group: Path, folder: Path) -> None:
    if not group.is_dir():
        raise FileNotFoundError(2, "this program's cgroup is not there", str(group))
    folder.mkdir()


def _move_here(leaf: Path) -> None:
    """Move this program into the cgroup `leaf` (made if missing)."""
    leaf.mkdir(exist_ok=True)
    _write(leaf / "cgroup.procs", str(os.getpid()))


def own_cgroups(text: str | None = None) -> dict[str, str]:
    """This process's cgroup in each hierarchy, from /proc/self/cgroup: {"memory": "/a/b", ..., "": "/c"} ("" is v2's)."""
    if text is None:
        try:
            text = Path("/proc/self/cgroup").read_text(encoding="utf-8")
        except OSError:
            return {}
    found: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            found[controller] = parts[2]
    return found


def _new_name() -> str:
    return f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}"


def _remove_stale(group: Path) -> None:
    """Empty kernel cgroups left by a program that was killed before it could remove them."""
    with contextlib.suppress(OSError):
        for folder in group.iterdir():
            match = _KERNEL_NAME.fullmatch(folder.name)
            if match and folder.is_dir() and not alive(int(match.group(1))):
                with contextlib.suppress(OSError):
                    folder.rmdir()


def make(caps: Caps, *, root: Path = ROOT, own: dict[str, str] | None = None) -> KernelCgroup:
    """A new cgroup for one kernel with `caps` set; NoCgroup (why, in one line) where none can be made here."""
    own = own_cgroups() if own is None else own
    if (root / "cgroup.controllers").exists() and "" in own:
        return _make_v2(caps, root=root, own=own[""])
    if (root / "memory" / "cgroup.procs").exists():
        return _make_v1(caps, root=root, own=own)
    raise NoCgroup(f"{root} has neither cgroup v2 with controllers nor cgroup v1's memory hierarchy")


@contextlib.contextmanager
def _or_none(undo: list[Path], what: str) -> Iterator[None]:
    """Run the body; if it fails, remove the folders made so far (`undo`) and say what could not be done."""
    try:
        yield
    except OSError as exc:
        for folder in reversed(undo):
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise NoCgroup(f"{what} ({exc.strerror or exc})") from None


def _make_v1(caps: Caps, *, root: Path, own: dict[str, str]) -> KernelCgroup:
    name = _new_name()
    folders: list[Path] = []
    settings: dict[str, list[tuple[str, str]]] = {
        "memory": [("memory.limit_in_bytes", str(caps.memory))] if caps.memory is not None else [],
        "cpu": [("cpu.cfs_period_us", str(PERIOD)), ("cpu.cfs_quota_us", str(int(caps.cpu * PERIOD)) if caps.cpu else "-1")],
        "pids": [("pids.max", str(caps.processes) if caps.processes is not None else "max")],
    }
    for controller, values in settings.items():
        hierarchy = root / controller
        if not (hierarchy / "cgroup.procs").exists():
            for folder in reversed(folders):
                with contextlib.suppress(OSError):
                    folder.rmdir()
            raise NoCgroup(f"cgroup v1 has no {controller} hierarchy at {hierarchy}")
        group = hierarchy / own.get(controller, "/").lstrip("/")
        folder = group / name
        with _or_none(folders, f"no cgroup can be made in {group}"):
            _new_folder(group, folder)
        folders.append(folder)
        _remove_stale(group)
        for file, value in values:
            with _or_none(folders, f"{folder / file} cannot be set"):
                _write(folder / file, value)
        if controller == "memory" and caps.memory is not None and (folder / "memory.memsw.limit_in_bytes").exists():
            with contextlib.suppress(OSError):  # swap accounting may be off: then swap is not counted, nor needed to be
                _write(folder / "memory.memsw.limit_in_bytes", str(caps.memory))
    return KernelCgroup(folders=tuple(folders), version=1)


_V2_CONTROLLERS = ("memory", "cpu", "pids")


def _hand_down(folder: Path) -> None:
    """Let `folder`'s children have the memory, cpu and pids controllers."""
    wanted = " ".join(f"+{name}" for name in _V2_CONTROLLERS)
    have = set((folder / "cgroup.subtree_control").read_text(encoding="ascii").split())
    if not set(_V2_CONTROLLERS) <= have:
        _write(folder / "cgroup.subtree_control", wanted)


def _make_v2(caps: Caps, *, root: Path, own: str) -> KernelCgroup:
    mine = root / own.lstrip("/")
    available = set((root / "cgroup.controllers").read_text(encoding="ascii").split())
    missing = [name for name in _V2_CONTROLLERS if name not in available]
    if missing:
        raise NoCgroup(f"cgroup v2 here has no {', '.join(missing)} controller")
    try:
        _hand_down(mine)
    except OSError as exc:
        if exc.errno != errno.EBUSY or mine == root:
            raise NoCgroup(f"{mine} cannot hand controllers to a cgroup of ours ({exc.strerror}): run as root, or in a delegated cgroup") from None
        # v2 lets no cgroup that holds processes hand controllers down: this program moves into a leaf of its own first.
        leaf = mine / PROGRAM_LEAF
        with _or_none([], f"{mine} is not delegated to this user"):
            _move_here(leaf)
        try:
            _hand_down(mine)
        except OSError as again:
            raise NoCgroup(f"{mine} holds other processes, so it cannot hand controllers down ({again.strerror})") from None
    folder = mine / _new_name()
    _remove_stale(mine)
    with _or_none([], f"no cgroup can be made in {mine}"):
        folder.mkdir()
    values = [
        ("memory.max", str(caps.memory) if caps.memory is not None else "max"),
        ("cpu.max", f"{int(caps.cpu * PERIOD) if caps.cpu else 'max'} {PERIOD}"),
        ("pids.max", str(caps.processes) if caps.processes is not None else "max"),
    ]
    for file, value in values:
        with _or_none([folder], f"{folder / file} cannot be set"):
            _write(folder / file, value)
    if caps.memory is not None and (folder / "memory.swap.max").exists():
        with contextlib.suppress(OSError):
            _write(folder / "memory.swap.max", "0")  # the limit is memory: swap is not a way past it
    return KernelCgroup(folders=(folder,), version=2)


def probe(caps: Caps, *, root: Path = ROOT) -> str | None:
    """Why no kernel cgroup can be made here (one line), or None when one can (made and removed at once)."""
    try:
        made = make(caps, root=root)
    except NoCgroup as exc:
        return str(exc)
    made.remove()
    return None


def unavailable_notice(reason: str) -> str:
    """The one line said when kernels run without a cgroup of their own."""
    return (
        f"Kernels run without a cgroup of their own here ({reason}): execution.memory_limit holds per process, not for all of a "
        "kernel's processes together, and execution.cpu_limit is not kept. Run as root or in a delegated cgroup v2 subtree, "
        "or set execution.cgroup: off to run without one knowingly."
    )


def caps_for(config: ExecutionConfig) -> Caps:
    """What `execution.*` asks a kernel's cgroup to cap."""
    return Caps(memory=config.memory_limit_bytes(), cpu=config.cpu_limit, processes=config.max_processes)


def for_kernel(config: ExecutionConfig) -> tuple[KernelCgroup | None, str | None]:
    """A new kernel's cgroup as `execution.cgroup` asks, or (None, the one line saying why there is none)."""
    if config.cgroup == "off":
        return None, None
    try:
        return make(caps_for(config)), None
    except NoCgroup as exc:
        return None, unavailable_notice(str(exc))


def memory_message(config: ExecutionConfig, ended: int) -> str:
    """What a cell's result says when the kernel's memory limit ended `ended` of its processes."""
    limit = config.memory_limit_bytes()
    shown = human(limit) if limit is not None else "the machine's memory"
    which = "its largest process was ended" if ended == 1 else f"{ended} of its processes were ended, the largest first"
    return (
        f"The kernel's processes together passed execution.memory_limit ({shown}): {which}. "
        "Use less memory at once (fewer worker processes, the data in pieces), or raise execution.memory_limit"
    )
