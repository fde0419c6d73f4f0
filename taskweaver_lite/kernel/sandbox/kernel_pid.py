"""Which process is the kernel: found by its process ids, never by its name, which a cell may change.

Inside bubblewrap the kernel is two processes down from what this program launched: bubblewrap,
then the PID namespace's first process (bubblewrap again, as pid 1), then the kernel, the first
process that one starts, so pid 2 of the namespace for as long as the namespace lives (it ends
when the kernel does). bubblewrap says which process is that first one, and which namespace it
made, on a descriptor of ours (`--info-fd`): a small file in memory (`memfd`), emptied before each
start, that bubblewrap closes before anything of the sandbox runs.

A kernel that cannot be found this way (its namespace is not the one announced, bubblewrap never
said) is a lost kernel: what asked for it ends the whole sandbox rather than let it run unwatched.
Without the sandbox the launched process is the kernel itself (the limits launcher replaces itself
with it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

KERNEL_IN_NAMESPACE = 2  # pid 1 is bubblewrap's init, which starts the kernel first
ANNOUNCE_WAIT = 2.0  # seconds a just-started bubblewrap has to say what it made


class SandboxInfo:
    """bubblewrap's `--info-fd` for one kernel's starts: where it writes, and what it wrote for the running one."""

    def __init__(self) -> None:
        """A new, empty file in memory; not inherited by anything unless passed (`pass_fds`)."""
        self.fd: int | None = os.memfd_create("taskweaver-lite-sandbox-info", os.MFD_CLOEXEC)

    def rewound(self) -> int:
        """Emptied for a new start: the descriptor to pass to bubblewrap, named on its command line."""
        if self.fd is None:
            raise ValueError("the sandbox info file is closed")
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)
        return self.fd

    def announced(self) -> tuple[int, int] | None:
        """(the namespace's first process, the PID namespace's inode) as bubblewrap wrote them; None before it did."""
        if self.fd is None:
            return None
        try:
            info = json.loads(os.pread(self.fd, 65536, 0) or b"null")
            return int(info["child-pid"]), int(info["pid-namespace"])
        except (ValueError, TypeError, KeyError, OSError):
            return None

    def kernel(self, launched: int) -> int | None:
        """The kernel's process id as this machine sees it, below the bubblewrap we launched as `launched`; None: lost."""
        deadline = time.monotonic() + ANNOUNCE_WAIT
        while (announced := self.announced()) is None:
            if time.monotonic() > deadline or not alive(launched):
                return None
            time.sleep(0.02)
        first, namespace = announced
        if _parent(first) != launched:
            return None
        for child in children(first):
            if _namespace_pid(child) == KERNEL_IN_NAMESPACE and _pid_namespace(child) == namespace:
                return child
        return None

    def close(self) -> None:
        """Close the file."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def children(pid: int) -> list[int]:
    """The child processes of `pid` (Linux's /proc), [] if it is gone."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as listing:
            return [int(child) for child in listing.read().split()]
    except OSError:
        return []


def _status(pid: int, field: str) -> list[str]:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return line.split(":", 1)[1].split()
    except OSError:
        pass
    return []


def _parent(pid: int) -> int | None:
    found = _status(pid, "PPid")
    return int(found[0]) if found else None


def _namespace_pid(pid: int) -> int | None:
    """`pid`'s id in its innermost PID namespace."""
    found = _status(pid, "NSpid")
    return int(found[-1]) if found else None


def _pid_namespace(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def alive(pid: int) -> bool:
    """Whether a process of that id exists (another user's counts: it is there)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def find_kernel(launched: int, info: SandboxInfo | None) -> int | None:
    """The kernel's process: below the sandbox `info` describes, or `launched` itself without one. None: lost."""
    return launched if info is None else info.kernel(launched)


def end_sandbox(launched: int) -> None:
    """End a sandbox whose kernel is lost: bubblewrap goes, and its namespace with everything in it (`--die-with-parent`)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(launched, signal.SIGKILL)
