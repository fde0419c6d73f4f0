"""The kernel's sandbox and limits: the command line that starts ipykernel inside bubblewrap (`bwrap`).

With `execution.sandbox: bubblewrap` the kernel sees the machine's file system read-only, the
session's working folder as its only writable folder besides a private `/tmp`, and neither the
user's home nor the project folder (the store, the config, other sessions): both are replaced by
empty folders, with only the Python installation put back (read-only) where it lives inside them.
It runs in its own PID namespace (the program's `/proc` entries are out of sight), with no network
unless `execution.network`, and it ends with the program (`--die-with-parent`, and the kernel's
lifeline for a program killed while the sandbox was starting: lifeline.py; the namespace's init takes
every process in it along, `setsid` or not). When the program runs as root the kernel
runs as a uid of its own (identity.py), so that the process cap (`RLIMIT_NPROC`, which never
applies to root, and counts per uid) holds per session.

Inside, a syscall filter (`syscall_filter.py`, `execution.syscall_filter`) refuses new namespaces,
mounts, the keyring, `bpf` and the rest of what container runtimes refuse; as an ordinary user
bubblewrap's `--disable-userns` also keeps the sandbox's user namespace from making another.

Limits apply with or without the sandbox: `execution.memory_limit` as the address-space limit of
every process of the kernel (a cell that passes it gets a MemoryError, or the kernel dies and is
restarted, and the model is told) and, where the kernel has a cgroup of its own (cgroup.py), as
the total of all its processes, with `execution.cpu_limit`; `execution.max_processes` inside the
sandbox and in the cgroup, and `execution.disk_limit` as the largest file any of them may write
(`disk_limit.py` keeps the total). They are set by `limits.py`, which runs first and then becomes
the kernel (exec), so no shell is involved; with a cgroup, a first `limits.py` outside bubblewrap
joins it and becomes bubblewrap.

The user's `execution.mounts` are bound at their own path, read-only unless `rw`, after the hidden
folders are emptied (a hidden folder inside a mount is emptied again); the folders of another
interpreter (`execution.kernel`) are put back read-only like this program's. `sees` tells whether
a path is visible inside, in the same order.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from taskweaver_lite.config.settings import ExecutionConfig
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.kernel.sandbox import identity, limits
from taskweaver_lite.kernel.sandbox.cgroup import KernelCgroup

NOBODY = 65534
PACKAGE = "bubblewrap"
PRIVATE_TMP = Path("/tmp")


@dataclass(frozen=True)
class Mount:
    """A folder (or file) of this machine the kernel sees at its own path (`execution.mounts`)."""

    path: Path
    writable: bool = False

    def describe(self) -> str:
        """`/data (read-only)`: how prompts and /info list it."""
        return f"{self.path} ({'read-write' if self.writable else 'read-only'})"


@dataclass(frozen=True)
class SandboxPlan:
    """Where a sandboxed kernel may write, and what it must not see."""

    cwd: Path  # the session's working folder: read-write
    socket_dir: Path  # the kernel's IPC sockets and connection file: read-write
    hidden: tuple[Path, ...]  # replaced by empty folders: the user's home, the project folder
    network: bool = False
    run_as: int | None = None  # a uid to become inside (root's kernels: their own, identity.py)
    tmp_bytes: int | None = None  # the private /tmp's and /dev/shm's size (the memory limit)
    readable: tuple[Path, ...] = ()  # put back read-only where hidden: the kernel's own interpreter (execution.kernel)
    mounts: tuple[Mount, ...] = ()  # the user's folders, at their own path (execution.mounts)
    seccomp_fd: int | None = None  # a file holding the syscall filter (syscall_filter.py); None: execution.syscall_filter off
    disable_userns: bool = False  # bubblewrap's --disable-userns: as an ordinary user, no user namespace inside the sandbox's
    start_in: Path | None = None  # where the kernel starts (None: cwd); on the gateway, the sessions' folder, hidden but for the session's own
    info_fd: int | None = None  # where bubblewrap says which process is the kernel's namespace's first (kernel_pid.py)


def bwrap_path() -> str | None:
    """The `bwrap` executable on PATH, if bubblewrap is installed."""
    return shutil.which("bwrap")


def uses_sandbox(config: ExecutionConfig) -> bool:
    """Whether kernels start inside bubblewrap: `bubblewrap` always (missing bwrap is an error), `auto`
    where installed and able to build the sandbox here (`unusable_reason` says why not)."""
    if config.sandbox == "none":
        return False
    if sys.platform != "linux":
        if config.sandbox == "bubblewrap":
            raise ConfigError("execution.sandbox: bubblewrap needs Linux; set execution.sandbox: none (or auto) on this system.")
        return False
    path = bwrap_path()
    if path is not None:
        return config.sandbox == "bubblewrap" or unusable_reason(path) is None
    if config.sandbox == "bubblewrap":
        raise ConfigError(
            f"execution.sandbox is bubblewrap but `bwrap` is not installed: install the {PACKAGE} package "
            f"(Debian/Ubuntu: sudo apt-get install {PACKAGE}), or set execution.sandbox: auto or none."
        )
    return False


@functools.cache
def can_disable_userns(path: str) -> bool:
    """Whether the `bwrap` at `path` takes `--disable-userns` here (bubblewrap 0.8 and later, not setuid, not as root)."""
    if os.geteuid() == 0:
        return False  # root's kernels have no user namespace of bubblewrap's; the syscall filter refuses new ones
    trial = [path, "--ro-bind", "/", "/", "--unshare-user", "--disable-userns", "true"]
    try:
        return subprocess.run(trial, capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@functools.cache
def unusable_reason(path: str) -> str | None:
    """None when the `bwrap` at `path` can build the sandbox's namespaces here; else bwrap's own words.

    Some containers forbid the namespaces bwrap needs: `auto` then runs kernels without it rather
    than fail every kernel start. Tried once per process (a few milliseconds).
    """
    trial = [path, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    try:
        done = subprocess.run([*trial, "--unshare-net", "--die-with-parent", "true"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    return done.stderr.decode("utf-8", "replace").strip() or f"{path} exited with status {done.returncode}"


def fallback_notice() -> str | None:
    """What to tell the user when `auto` found bwrap but could not use it (None: nothing to tell)."""
    path = bwrap_path()
    reason = unusable_reason(path) if path is not None and sys.platform == "linux" else None
    if reason is None:
        return None
    return (
        f"This kernel runs without the sandbox: bubblewrap is installed but cannot build one here ({reason}). "
        "Set execution.sandbox: none to run without it knowingly, or bubblewrap to make this an error."
    )


def plan_for(
    *,
    cwd: Path,
    socket_dir: Path,
    hidden: Iterable[Path],
    network: bool,
    tmp_bytes: int | None = None,
    run_as: int | None = None,
    readable: Iterable[Path] = (),
    mounts: Iterable[Mount] = (),
    seccomp_fd: int | None = None,
    start_in: Path | None = None,
    info_fd: int | None = None,
) -> SandboxPlan:
    """The sandbox of one session's kernel: `hidden` (the project folder, the store's) and the user's home out of sight.

    `run_as`: the kernel's own uid when we are root (identity.py); root's kernels never run as root.
    `readable`: folders the kernel's interpreter reads (put back where hidden); `mounts`: the user's folders it sees.
    `seccomp_fd`: the syscall filter's file (None: `execution.syscall_filter: off`, and no `--disable-userns` either).
    """
    readable = tuple(p.resolve() for p in readable)
    mounts = tuple(Mount(m.path.resolve(), m.writable) for m in mounts)
    if run_as is None and os.geteuid() == 0:
        run_as = NOBODY
    candidates = [Path.home(), *hidden]
    if run_as is not None:
        # Private folders on the way to the writable ones (pytest's, a 0700 home): nobody could not
        # pass them, so they are replaced by passable empty ones like the hidden folders.
        reached = (cwd.resolve(), socket_dir.resolve(), *_needed(), *readable, *(m.path for m in mounts))
        candidates += [folder for path in reached for folder in path.parents if not folder.stat().st_mode & 0o001]
    resolved = tuple(dict.fromkeys(p.resolve() for p in candidates if p.exists() and p.resolve() != Path("/")))
    bwrap = bwrap_path()
    disable_userns = seccomp_fd is not None and bwrap is not None and can_disable_userns(bwrap)
    return SandboxPlan(
        cwd=cwd.resolve(), socket_dir=socket_dir.resolve(), hidden=resolved, network=network, run_as=run_as, tmp_bytes=tmp_bytes,
        readable=readable, mounts=mounts, seccomp_fd=seccomp_fd, disable_userns=disable_userns, start_in=start_in, info_fd=info_fd,
    )  # fmt: skip


def session_sandbox(
    config: ExecutionConfig,
    *,
    session_dir: Path,
    cwd: Path,
    socket_dir: Path,
    hidden: Iterable[Path],
    readable: Iterable[Path] = (),
    seccomp_fd: int | None,
    start_in: Path | None = None,
    info_fd: int | None = None,
) -> SandboxPlan:
    """The sandbox of one session's kernel, on this machine or on `taskweaver-lite gateway`, from the `execution.*` settings.

    As root, the kernel's own uid (identity.py) is picked here and given the working folder (all of
    it) and the socket folder (itself): the kernel may write there and nowhere else of ours.
    """
    plan = plan_for(
        cwd=cwd, socket_dir=socket_dir, hidden=hidden, network=config.network, tmp_bytes=config.memory_limit_bytes(),
        run_as=identity.kernel_uid(session_dir, cwd=cwd), readable=readable, mounts=[Mount(Path(m.path), writable=m.mode == "rw") for m in config.mounts],
        seccomp_fd=seccomp_fd, start_in=start_in, info_fd=info_fd,
    )  # fmt: skip
    if plan.run_as is not None:
        identity.hand_over(cwd, plan.run_as)  # on resume, files an earlier kernel of this session wrote
        identity.hand_over(socket_dir, plan.run_as, recursive=False)  # its owner file, if any, stays ours
    return plan


def kernel_command(argv: Sequence[str], *, config: ExecutionConfig, plan: SandboxPlan | None, cgroup: KernelCgroup | None = None) -> list[str]:
    """`argv` (ipykernel) behind the limits launcher and, with a plan, inside bwrap; with a cgroup, joined before either starts."""
    uid = plan.run_as if plan is not None else None
    # RLIMIT_NPROC counts every process of the user: the cap comes on top of what the user runs now
    # (nothing, for a kernel's own uid: it was picked for having no process).
    running = 0 if uid is not None and identity.in_range(uid) else limits.user_tasks(os.getuid() if uid is None else uid)
    processes = running + config.max_processes if plan is not None else None
    caps = limits.arguments(memory=config.memory_limit_bytes(), processes=processes, uid=uid, file_size=config.disk_limit_bytes())
    joins = limits.join_arguments(cgroup.join_files()) if cgroup is not None else []
    if plan is None:
        return [sys.executable, "-I", "-S", limits.__file__, *joins, *caps, "--", *argv]
    bwrap = bwrap_path()
    if bwrap is None:
        raise ConfigError(f"`bwrap` is not installed: install the {PACKAGE} package (Debian/Ubuntu: sudo apt-get install {PACKAGE}).")
    launcher = [sys.executable, "-I", "-S", limits.__file__, *caps, "--"]
    outside = [sys.executable, "-I", "-S", limits.__file__, *joins, "--"] if joins else []  # the sandbox cannot write to the cgroup's files
    return [*outside, bwrap, *bwrap_arguments(plan), *launcher, *argv]


def bwrap_arguments(plan: SandboxPlan) -> list[str]:
    """bubblewrap's options for `plan`; mounts apply in order, so later ones cover earlier ones."""
    # Private /tmp and /dev/shm hold at most the memory limit (tmpfs pages are not counted against it);
    # /run is emptied: its sockets (D-Bus, docker.sock) lead out of any sandbox.
    size = ["--size", str(plan.tmp_bytes)] if plan.tmp_bytes else []
    args = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--perms", "1777", *size, "--tmpfs", str(PRIVATE_TMP)]
    args += ["--perms", "1777", *size, "--tmpfs", "/dev/shm", "--tmpfs", "/run"]
    if plan.network and Path("/run/systemd/resolve").is_dir():  # DNS, where resolv.conf points into /run
        args += ["--ro-bind", "/run/systemd/resolve", "/run/systemd/resolve"]
    # The private /tmp and the empty /run cover whatever lived there too (a checkout and its venv in
    # /tmp, a socket folder in /run/user): put back like the hidden folders.
    covered = (PRIVATE_TMP, Path("/run"), *plan.hidden)
    for folder in sorted(plan.hidden, key=lambda p: len(p.parts)):  # outer ones first: inner ones land on them
        args += [*_open_way(folder, covered), "--perms", "0755", "--tmpfs", str(folder)]
    for keep in _put_back(covered, extra=plan.readable):
        args += [*_open_way(keep, covered), "--ro-bind", str(keep), str(keep)]
    args += _mount_arguments(plan, covered)
    for writable in (plan.cwd, plan.socket_dir):
        args += [*_open_way(writable, covered), "--bind", str(writable), str(writable)]
    args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent"]
    if plan.info_fd is not None:  # which process is the namespace's first: the kernel is found by id, never by name
        args += ["--info-fd", str(plan.info_fd)]
    if not plan.network:
        args.append("--unshare-net")
    if plan.disable_userns:  # an ordinary user's sandbox is a user namespace already: none may be made inside it
        args += ["--unshare-user", "--disable-userns"]
    if plan.seccomp_fd is not None:  # loaded last, right before the kernel starts: nothing inside runs without it
        args += ["--seccomp", str(plan.seccomp_fd)]
    args += ["--setenv", "HOME", "/tmp", "--setenv", "MPLCONFIGDIR", "/tmp/matplotlib", "--chdir", str(plan.start_in or plan.cwd)]
    # The kernel's parent inside is the namespace's init (pid 1): ipykernel would take that for its
    # parent having died. `--die-with-parent` and the kernel's lifeline (lifeline.py) end the sandbox with the program instead.
    args += ["--setenv", "JPY_PARENT_PID", "1"]
    return args


def _open_way(path: Path, hidden: Sequence[Path]) -> list[str]:
    """Options creating the folders on the way to `path` inside a hidden one, passable by anyone.

    bwrap creates missing folders private (0700): only root could pass them.
    """
    around = [h for h in hidden if _inside(path, h) and h != path]
    if not around:
        return []
    top = max(around, key=lambda h: len(h.parts))  # the innermost: the folders below it are bwrap's to create
    args: list[str] = []
    for step in reversed(path.relative_to(top).parents[:-1]):
        args += ["--perms", "0755", "--dir", str(top / step)]
    return args


def _put_back(hidden: Iterable[Path], *, extra: Iterable[Path] = ()) -> list[Path]:
    """What the kernel needs from inside the hidden folders: Python, its packages (`extra`: another interpreter's), our in-kernel modules."""
    hidden = list(hidden)
    inside = {p for p in _needed() | set(extra) if any(_inside(p, h) for h in hidden)}
    # Never put back a folder that holds a hidden one whole (the project inside a source checkout on sys.path):
    # its Python files are what is needed, so such an entry is skipped and the package folder is kept instead.
    kept = sorted(p for p in inside if not any(_inside(h, p) for h in hidden))
    return [p for p in kept if not any(p != q and _inside(p, q) for q in kept)]


def _mount_arguments(plan: SandboxPlan, covered: Sequence[Path]) -> list[str]:
    """The user's mounts at their own path, read-only unless writable; a hidden folder inside one stays hidden.

    Mounting the home folder must not show the project in it (its config holds the API key).
    """
    args: list[str] = []
    for mount in plan.mounts:
        args += [*_open_way(mount.path, covered), "--bind" if mount.writable else "--ro-bind", str(mount.path), str(mount.path)]
    inside = _rehidden(plan)
    for folder in sorted(inside, key=lambda p: len(p.parts)):
        args += ["--perms", "0755", "--tmpfs", str(folder)]
    for keep in _put_back(inside, extra=plan.readable):
        args += [*_open_way(keep, inside), "--ro-bind", str(keep), str(keep)]
    return args


def sees(path: Path, plan: SandboxPlan) -> bool:
    """Whether a kernel in `plan` sees `path` (absolute, as this machine names it), following the order of bwrap's mounts."""
    if _inside(path, plan.cwd) or _inside(path, plan.socket_dir):
        return True
    rehidden = _rehidden(plan)
    if any(_inside(path, h) for h in rehidden):
        return any(_inside(path, keep) for keep in _put_back(rehidden, extra=plan.readable))
    if any(_inside(path, m.path) for m in plan.mounts):
        return True
    covered = (PRIVATE_TMP, Path("/run"), *plan.hidden)
    if not any(_inside(path, h) for h in covered):
        return True
    return any(_inside(path, keep) for keep in _put_back(covered, extra=plan.readable))


def _rehidden(plan: SandboxPlan) -> list[Path]:
    """Hidden folders inside a mount (the project inside a mounted home): hidden again over the mount."""
    return [h for h in plan.hidden if any(_inside(h, m.path) and h != m.path for m in plan.mounts)]


def _needed() -> set[Path]:
    """Folders the kernel reads: the interpreter and its packages, our in-kernel modules."""
    needed = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix), Path(limits.__file__).parents[2]}
    needed |= {Path(entry) for entry in sys.path if entry and Path(entry).is_dir()}
    return {p.resolve() for p in needed}


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents
