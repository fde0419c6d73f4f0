"""The sandboxed kernel's syscall filter: what its code may not ask of the Linux kernel (seccomp).

A sandboxed kernel runs under a seccomp filter that bubblewrap loads (`--seccomp FD`) just
before it starts the kernel, so the kernel and everything it starts carry it and none can take
it off. The filter refuses what container runtimes' default profiles refuse (Docker's, Podman's,
Flatpak's) and nothing data analysis uses:

- new namespaces: `unshare` and `clone` with any namespace flag, `setns`; a new user namespace
  is the usual first step of a kernel exploit (as an ordinary user bubblewrap's
  `--disable-userns` also says no, where bubblewrap has it); `clone3` gets ENOSYS, since its
  flags sit in memory a filter cannot read, and the C library then falls back on `clone`;
- mounts: `mount`, `umount2`, `pivot_root`, `chroot` and the new mount API (`fsopen`...);
- the kernel keyring (`keyctl`, `add_key`, `request_key`), `bpf`, `perf_event_open`,
  `userfaultfd`, `io_uring`;
- `ptrace` and the calls that read or write another process's memory: the PID namespace
  already hides every process outside the kernel's tree, and nothing analysis does traces;
- module and kexec loading, `reboot`, `swapon`/`swapoff`, setting the clocks, accounting,
  quotas, the kernel log, port I/O, handle-based opens (`open_by_handle_at`), typing into a
  terminal (`ioctl` TIOCSTI);
- `personality` except the values Docker allows (a query, PER_LINUX, PER_LINUX32, UNAME26):
  no turning address randomisation off;
- every 32-bit entry point (i386 `int 0x80`, x32): ENOSYS, as on a kernel built without them.

Refused calls fail with EPERM (ENOSYS where noted) instead of killing the process, so a library
that probes gets an error it handles. The filter is compiled by libseccomp (through `pyseccomp`,
a thin ctypes binding) once per program and handed to each kernel start as a memory file.
`execution.syscall_filter: off` leaves it out (and `--disable-userns` with it).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from taskweaver_lite.errors import ConfigError

if TYPE_CHECKING:
    import pyseccomp

# Namespace flags of clone(2) and unshare(2) (linux/sched.h). CLONE_NEWTIME shares its bit with
# clone's exit-signal byte, so it is checked for unshare only.
_NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
CLONE_NEWTIME = 0x00000080
# personality(2) values Docker's default profile allows: PER_LINUX, PER_LINUX32, UNAME26, both, and the query.
ALLOWED_PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
_PERSONALITY_BITS = 0x20008
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
_BINARY_TREE = 2  # libseccomp's SCMP_FLTATR_CTL_OPTIMIZE level


@dataclass(frozen=True)
class Refusal:
    """Calls refused for one reason: how /info and the docs name them, and the calls themselves."""

    what: str
    calls: tuple[str, ...]
    error: int = errno.EPERM


# Refused whatever their arguments. The argument-dependent ones (namespace flags, personality,
# ioctl) are added by `_argument_rules` and listed in `REFUSED` for the reader.
_PLAIN = (
    Refusal("joining namespaces", ("setns",)),
    Refusal(
        "mounts",
        ("mount", "umount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr"),
    ),
    Refusal("the kernel keyring", ("keyctl", "add_key", "request_key")),
    Refusal("bpf", ("bpf",)),
    Refusal("perf_event_open", ("perf_event_open",)),
    Refusal("userfaultfd", ("userfaultfd",)),
    Refusal("io_uring", ("io_uring_setup", "io_uring_enter", "io_uring_register")),
    Refusal("tracing other processes", ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "move_pages", "migrate_pages")),
    Refusal("kernel modules", ("init_module", "finit_module", "delete_module", "create_module", "query_module", "get_kernel_syms")),
    Refusal("kexec and reboot", ("kexec_load", "kexec_file_load", "reboot")),
    Refusal("swap", ("swapon", "swapoff")),
    Refusal("setting the clocks", ("settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "stime")),
    Refusal(
        "other administration",
        ("acct", "quotactl", "quotactl_fd", "syslog", "iopl", "ioperm", "open_by_handle_at", "lookup_dcookie", "nfsservctl", "uselib", "ustat", "sysfs"),
    ),
    Refusal(
        "obsolete calls",
        ("_sysctl", "vhangup"),
    ),
)
_NEW_NAMESPACES = Refusal("new namespaces", ("unshare (namespace flags)", "clone (namespace flags)", "clone3 (ENOSYS: the C library falls back on clone)"))
_OTHER_ARGUMENTS = Refusal("by argument", ("personality (except Docker's values)", "ioctl TIOCSTI and TIOCLINUX"))
_OTHER_ARCHITECTURES = Refusal("32-bit entry points", ("every i386 and x32 call (ENOSYS)",), error=errno.ENOSYS)
REFUSED = (_NEW_NAMESPACES, *_PLAIN, _OTHER_ARGUMENTS, _OTHER_ARCHITECTURES)


def summary() -> str:
    """One line naming what the filter refuses (for /info)."""
    named = [r.what for r in REFUSED if r.what not in ("by argument", "other administration", "obsolete calls", "32-bit entry points")]
    return "refuses " + ", ".join(named) + ", personality changes, terminal injection, administration calls (acct, syslog, iopl...); 32-bit calls get ENOSYS"


def lost_without() -> str:
    """The line said when `execution.syscall_filter: off`: what the user gives up."""
    return (
        "execution.syscall_filter is off: code in the sandbox may create user namespaces, mount in them, and reach "
        "the kernel keyring, bpf, perf_event_open, ptrace and every other system call the sandbox's user may make; "
        "a Linux kernel bug reachable that way is reachable from a cell."
    )


@functools.cache
def compiled() -> bytes:
    """The filter as a BPF program (the bytes bubblewrap reads), compiled once per program by libseccomp."""
    try:
        import pyseccomp  # loads libseccomp.so.2: only where the sandbox is used (Linux)
    except (ImportError, RuntimeError, OSError) as exc:
        raise ConfigError(
            f"The sandbox's syscall filter needs libseccomp and pyseccomp ({exc}): install libseccomp2 (Debian/Ubuntu: "
            "sudo apt-get install libseccomp2) and reinstall taskweaver-lite, or set execution.syscall_filter: off."
        ) from exc

    rules = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    # Calls from another architecture than this one (i386's int 0x80, x32) fail as if absent.
    rules.set_attr(pyseccomp.Attr.ACT_BADARCH, pyseccomp.ERRNO(errno.ENOSYS))
    with contextlib.suppress(OSError):  # libseccomp 2.5+: the calls sorted in a tree, not one long chain every call walks
        rules.set_attr(pyseccomp.Attr.CTL_OPTIMIZE, _BINARY_TREE)
    for refusal in _PLAIN:
        for call in refusal.calls:
            _add(rules, pyseccomp.ERRNO(refusal.error), call)
    _argument_rules(rules)
    fd = os.memfd_create("taskweaver-lite-seccomp", os.MFD_CLOEXEC)
    try:
        with os.fdopen(fd, "wb", closefd=False) as sink:
            rules.export_bpf(sink)
        os.lseek(fd, 0, os.SEEK_SET)
        return _read_all(fd)
    finally:
        os.close(fd)


def _argument_rules(rules: pyseccomp.SyscallFilter) -> None:
    """The rules that look at arguments: namespace flags, clone3, personality, terminal ioctls."""
    import pyseccomp

    deny = pyseccomp.ERRNO(errno.EPERM)
    for flag in _NAMESPACE_FLAGS.values():
        _add(rules, deny, "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, flag, flag))
        _add(rules, deny, "unshare", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, flag, flag))
    _add(rules, deny, "unshare", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, CLONE_NEWTIME, CLONE_NEWTIME))
    _add(rules, pyseccomp.ERRNO(errno.ENOSYS), "clone3")
    for mask, value in personality_masks():
        _add(rules, deny, "personality", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, mask, value))
    for request in (TIOCSTI, TIOCLINUX):
        # The request is an int: compare its low 32 bits only, whatever the caller left above them.
        _add(rules, deny, "ioctl", pyseccomp.Arg(1, pyseccomp.MASKED_EQ, 0xFFFFFFFF, request))


def personality_masks() -> list[tuple[int, int]]:
    """(mask, value) pairs, any of which matching refuses `personality`: exactly the values outside `ALLOWED_PERSONALITIES`.

    A value is refused when it has a bit outside PER_LINUX32|UNAME26 set and is not the query
    (all 32 bits set), that is: some such bit is set and some bit is clear. libseccomp compares
    one argument once per rule, so that is said as single masked comparisons: walking the
    other bits in order, then bit 3, bit 17 and round again, a value with one of them set and
    a clear bit somewhere has a set bit right before a clear one on that walk.
    """
    others = [1 << bit for bit in range(32) if not (1 << bit) & _PERSONALITY_BITS]
    pairs = [(before | after, before) for before, after in itertools.pairwise(others)]
    walk = [others[-1], 0x8, 0x20000, others[0]]  # ... the last other bit, PER_LINUX32, UNAME26, back to the first
    for end in range(1, len(walk)):
        set_bits = functools.reduce(int.__or__, walk[:end])
        pairs.append((set_bits | walk[end], set_bits))
    return pairs


def _add(rules: pyseccomp.SyscallFilter, action: int, call: str, *args: pyseccomp.Arg) -> None:
    """One rule; a call newer than the installed libseccomp (`unknown_calls`) is left out."""
    if call not in unknown_calls():
        rules.add_rule(action, call, *args)


@functools.cache
def unknown_calls() -> tuple[str, ...]:
    """Refused calls the installed libseccomp does not know by name, so the filter cannot refuse them (none with 2.5.4).

    A call this architecture lacks (`stime` on x86-64) is known: libseccomp leaves its rule out itself.
    """
    import pyseccomp

    arch = pyseccomp.system_arch()
    calls = [call for refusal in _PLAIN for call in refusal.calls] + ["clone", "clone3", "unshare", "personality", "ioctl"]
    return tuple(call for call in calls if pyseccomp.resolve_syscall(arch, call) == _UNKNOWN)


_UNKNOWN = -1  # libseccomp's __NR_SCMP_ERROR: a name it does not know


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def filter_file() -> int:
    """A new memory file holding the filter, for bubblewrap's `--seccomp FD` (rewind it before each start: `rewound`)."""
    fd = os.memfd_create("taskweaver-lite-seccomp", os.MFD_CLOEXEC)
    os.write(fd, compiled())
    return rewound(fd)


def rewound(fd: int) -> int:
    """`fd` read from the start again: bubblewrap reads the filter to its end at every kernel start."""
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def names(refusals: Iterable[Refusal] = REFUSED) -> list[str]:
    """`group: call, call` lines, for SECURITY.md and tests."""
    return [f"{refusal.what}: {', '.join(refusal.calls)}" for refusal in refusals]
