"""The kernel process: how it is launched, what environment it gets, and how it is sure to end.

Launching: ipykernel on this very interpreter, or the one `execution.kernel` names (never whatever a
`python3` kernelspec points to unless named),
with the in-kernel helpers (snapshot, guard, plugin runtime) loaded at start. Environment: ours minus secrets. Ending: every
live executor is shut down at interpreter exit and on SIGTERM; the kernel's lifeline (lifeline.py)
ends a kernel whose program vanished without either (SIGKILL), in the sandbox or not; and the
kernel's whole process group is killed after it, so subprocesses started by user code go too.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, TypeVar

from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import KernelManager

from taskweaver_lite.kernel import display as kernel_display
from taskweaver_lite.kernel import lifeline, plugin_runtime
from taskweaver_lite.kernel import snapshot as kernel_snapshot
from taskweaver_lite.kernel.sandbox import guard as kernel_guard
from taskweaver_lite.kernel.sandbox import syscall_filter
from taskweaver_lite.kernel.sandbox.kernel_pid import SandboxInfo, alive

SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
SECRET_PREFIXES = ("OPENAI_",)
OWNER_FILE = "owner.pid"
SOCKET_PREFIX = "twl-kernel-"
SOCKET_FOLDER = "kernel"
# Unix socket paths are capped at 107 bytes on Linux and 103 on macOS; keep clear of both.
SOCKET_PATH_LIMIT = 100


def load_by_path(name: str, path: str) -> str:
    """Kernel start-up code that loads one of our in-kernel modules.

    Loaded by path, so the kernel never imports taskweaver_lite (and the agent's dependencies);
    registered in sys.modules, so `%reset` in a cell cannot remove it.
    """
    return (
        "import importlib.util as _twl_u, sys as _twl_s; "
        f"_twl_p = _twl_u.spec_from_file_location({name!r}, {path!r}); "
        "_twl_m = _twl_u.module_from_spec(_twl_p); _twl_p.loader.exec_module(_twl_m); "
        "_twl_s.modules[_twl_p.name] = _twl_m; del _twl_u, _twl_s, _twl_p, _twl_m"
    )


# ipykernel's launcher, named as the argument after this code (so `ps` shows it), run without the debugger: ipykernel
# imports debugpy (pydevd) at every start wherever it is installed (it depends on it), 0.08 s of CPU of a 0.28 s start,
# for a debugger nothing attaches to here. ipykernel finds it missing and starts without one; DEBUGGER_BACK, in the
# start-up code, lets a cell that imports it get it. A kernel's command line: [python, *LAUNCH, "-f", ...].
LAUNCHER = "import runpy, sys; sys.modules['debugpy'] = None; runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"
LAUNCH = ("-c", LAUNCHER, "ipykernel_launcher")
DEBUGGER_BACK = "_twl_s = __import__('sys'); _twl_s.modules.get('debugpy', 0) is None and _twl_s.modules.pop('debugpy'); del _twl_s"
# The kernel ends when this program does, however it ends (lifeline.py): its watch starts first.
LIFELINE_START_UP = f"{load_by_path(lifeline.MODULE_NAME, lifeline.__file__)}; __import__('sys').modules[{lifeline.MODULE_NAME!r}].watch()"
_START_UP = "; ".join(
    [
        LIFELINE_START_UP,
        load_by_path(kernel_snapshot.MODULE_NAME, kernel_snapshot.__file__),
        load_by_path(kernel_guard.MODULE_NAME, kernel_guard.__file__),
        f"__import__('sys').modules[{kernel_guard.MODULE_NAME!r}].install()",
        # Plugin files import `taskweaver.plugin` / `taskweaver_lite.plugin`: both are this module in the kernel.
        load_by_path(plugin_runtime.MODULE_NAME, plugin_runtime.__file__),
        f"__import__('sys').modules[{plugin_runtime.MODULE_NAME!r}].register_shims()",
        DEBUGGER_BACK,
    ]
)
# pandas' display width from TASKWEAVER_DISPLAY_WIDTH (see display.py); loaded the same way.
_SET_DISPLAY = (
    "import importlib.util as _twl_u; "
    f"_twl_p = _twl_u.spec_from_file_location('_taskweaver_display', {kernel_display.__file__!r}); "
    "_twl_m = _twl_u.module_from_spec(_twl_p); _twl_p.loader.exec_module(_twl_m); _twl_m.install(); del _twl_u, _twl_p, _twl_m"
)


def filtered_environment(environ: Mapping[str, str], *, allowed: list[str], display_width: int | None = None, mark: str | None = None) -> dict[str, str]:
    """The kernel's environment: ours minus anything that looks like a secret, unless allowed by name.

    `mark` tags the kernel and its descendants (`kill_marked` ends them all at shutdown).
    """
    kept = {name: value for name, value in environ.items() if name in allowed or not _looks_secret(name)}
    if display_width is not None:
        kept[kernel_display.WIDTH_VARIABLE] = str(display_width)
    # Figures must come back as images whatever backend the parent prefers (Agg would drop them).
    kept["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    if mark is not None:
        kept[KERNEL_MARK] = mark
    return kept


def _looks_secret(name: str) -> bool:
    upper = name.upper()
    return upper.startswith(SECRET_PREFIXES) or any(marker in upper for marker in SECRET_MARKERS)


class InterpreterKernelManager(KernelManager):
    """A KernelManager that runs ipykernel on the interpreter it is given, whatever kernelspecs say.

    `python` is this program's interpreter unless `execution.kernel` names another (interpreter.py);
    `wrap` puts the command behind the limits launcher and the sandbox (sandbox/bwrap.py); `kernel_uid`
    is the user a sandboxed kernel runs as, who must be able to read the connection file.
    """

    python: str = sys.executable
    wrap: Callable[[list[str]], list[str]] | None = None
    kernel_uid: int | None = None
    interrupt_mode = "signal"
    seccomp_fd: int | None = None  # the syscall filter's file, named on bwrap's command line (`--seccomp FD`)
    sandbox_info: SandboxInfo | None = None  # where bwrap says which process is the kernel (`--info-fd FD`)

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
        pass_launch_files(kw, seccomp_fd=self.seccomp_fd, sandbox_info=self.sandbox_info)
        await super()._async_launch_kernel(kernel_cmd, **kw)

    def write_connection_file(self, **kwargs: Any) -> None:
        super().write_connection_file(**kwargs)
        if self.kernel_uid is not None:
            os.chown(self.connection_file, self.kernel_uid, self.kernel_uid)

    @property
    def kernel_spec(self) -> KernelSpec:
        # jupyter-client reads this many times per start and on every interrupt: built once per setting.
        key = (id(self.wrap), self.interrupt_mode)
        cached = self.__dict__.get("_twl_spec")
        if cached is None or cached[0] != key:
            cached = self.__dict__["_twl_spec"] = (key, self._build_spec())
        spec: KernelSpec = cached[1]
        return spec

    def _build_spec(self) -> KernelSpec:
        argv = [
            self.python, *LAUNCH, "-f", "{connection_file}",
            # Sessions keep their own record; IPython's shared SQLite history only adds lock contention.
            "--HistoryManager.hist_file=:memory:",
            # `ls -la` would run the shell through automagic, and it parses as Python (`ls - la`).
            "--InteractiveShell.automagic=False",
            f"--IPKernelApp.exec_lines={_START_UP}; {_SET_DISPLAY}",
        ]  # fmt: skip
        if self.wrap is None:
            return KernelSpec(argv=argv, display_name="taskweaver-lite", language="python")
        # A sandboxed kernel is in its own session inside bwrap: a signal to bwrap's process group
        # would not reach it, so interrupts travel as messages on the control channel.
        return KernelSpec(argv=self.wrap(argv), display_name="taskweaver-lite", language="python", interrupt_mode=self.interrupt_mode)


def pass_launch_files(launch: dict[str, Any], *, seccomp_fd: int | None, sandbox_info: SandboxInfo | None) -> None:
    """What every start and restart of a kernel keeps open in it (`launch`: Popen's keyword arguments), here and on a gateway.

    The syscall filter's file, read by bubblewrap from its start; bubblewrap's info file, emptied for what it says about
    this start; and the kernel's lifeline to this program (lifeline.py).
    """
    fds = [syscall_filter.rewound(seccomp_fd)] if seccomp_fd is not None else []
    if sandbox_info is not None:
        fds.append(sandbox_info.rewound())
    if fds:
        launch["pass_fds"] = (*launch.get("pass_fds", ()), *fds)
    lifeline.attach(launch)


def close_launch_files(seccomp_fd: int | None, sandbox_info: SandboxInfo | None) -> None:
    """Close what `pass_launch_files` kept for the kernel's starts, once no start is to come (the caller forgets them)."""
    if seccomp_fd is not None:
        os.close(seccomp_fd)
    if sandbox_info is not None:
        sandbox_info.close()


def socket_dir(session_dir: Path, *, prefix: str = SOCKET_PREFIX) -> Path:
    """A new folder for a kernel's connection file and IPC sockets, holding our pid.

    It is `<session>/kernel` when that path leaves room for a socket name within the ~100 bytes a
    Unix socket path may have; otherwise (a deep project folder) a private folder in the system's
    temporary folder. Either way a later start removes the folders of programs that were killed
    (`kill -9`) before they could clean up: `remove_stale_socket_dirs`.
    """
    remove_stale_socket_dirs(session_dir.parent, prefix=prefix)
    folder = session_dir / SOCKET_FOLDER
    if len(os.fsencode(folder / "kernel-65535")) <= SOCKET_PATH_LIMIT:
        # Left by a killed run of this same session: nobody else holds it (the session lock).
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(mode=0o700, parents=True)
    else:
        folder = Path(tempfile.mkdtemp(prefix=prefix))
    (folder / OWNER_FILE).write_text(str(os.getpid()), encoding="ascii")
    return folder


def remove_stale_socket_dirs(sessions_dir: Path | None = None, *, prefix: str = SOCKET_PREFIX) -> None:
    """Remove socket folders whose owning program is gone: in the temporary folder, and in `sessions_dir`'s sessions.

    Folders without an owner file are left alone: another version's, or still being set up.
    """
    candidates = list(Path(tempfile.gettempdir()).glob(prefix + "*"))
    if sessions_dir is not None and sessions_dir.is_dir():
        candidates += sessions_dir.glob(f"*/{SOCKET_FOLDER}")
    for folder in candidates:
        try:
            owner = int((folder / OWNER_FILE).read_text(encoding="ascii"))
        except (OSError, ValueError):
            continue
        if not alive(owner):
            shutil.rmtree(folder, ignore_errors=True)


KERNEL_MARK = "TASKWEAVER_LITE_KERNEL"  # in the environment of a kernel and of everything it starts


def kill_marked(mark: str) -> int:
    """SIGKILL every process of ours whose environment carries `KERNEL_MARK=mark`; how many there were.

    What a kernel started in a new session (`setsid`, a daemon) has left its process group but
    still carries the kernel's environment. A process that replaced its environment on purpose is
    out of reach here: the sandbox's PID namespace ends those too.
    """
    needle = f"{KERNEL_MARK}={mark}".encode() + b"\0"
    killed = 0
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if needle not in (entry / "environ").read_bytes() or int(entry.name) == os.getpid():
                continue
            os.kill(int(entry.name), signal.SIGKILL)
            killed += 1
        except (OSError, ValueError):
            continue  # another user's, or gone meanwhile
    return killed


def make_undumpable() -> None:
    """Linux: keep this program's memory, environment and command line out of its kernels' reach.

    A non-dumpable process's /proc entries (mem, environ, cmdline) belong to root and cannot be
    traced by processes of the same user. Root's kernels could still read them: the sandbox is
    what stops those.
    """
    if sys.platform != "linux":
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


PR_SET_DUMPABLE = 4


def kill_process_group(group: Any) -> None:
    """SIGKILL what is left of a kernel's process group (never our own group)."""
    if not isinstance(group, int) or not hasattr(os, "killpg") or group == os.getpgrp():
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is already gone
        os.killpg(group, signal.SIGKILL)


# bwrap's --die-with-parent (PR_SET_PDEATHSIG) fires when the *thread* that started the sandbox
# ends, not the program: kernels are started and restarted on this one lasting thread.
_LAUNCHER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kernel-launcher")
_T = TypeVar("_T")


def on_launcher_thread(call: Callable[[], _T]) -> _T:
    """Run `call` (a kernel start or restart) on the thread that outlives every kernel it starts."""
    if threading.current_thread().name.startswith("kernel-launcher"):
        return call()
    return _LAUNCHER.submit(call).result()


class _Closable(Protocol):
    def shutdown(self) -> None: ...


# A closed terminal (SIGHUP) ends us like `kill` (SIGTERM): kernels stop, their folders go.
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP) if hasattr(signal, "SIGHUP") else (signal.SIGTERM,)
_LIVE: weakref.WeakSet[_Closable] = weakref.WeakSet()
_HOOKS: dict[str, Any] = {}


def end_at_exit(owner: _Closable) -> None:
    """Shut `owner` down at interpreter exit and on SIGTERM or SIGHUP, unless it was shut down before."""
    _LIVE.add(owner)
    if "atexit" not in _HOOKS:
        _HOOKS["atexit"] = atexit.register(_shutdown_all)
    # Signal handlers can only be set from the main thread; until one is, the kernel's parent
    # poller still ends the kernel within a second or two of our death.
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in ENDING_SIGNALS:
        key = f"previous_{signum}"
        if key not in _HOOKS:
            previous = signal.getsignal(signum)
            if previous is not signal.SIG_IGN:
                _HOOKS[key] = previous
                signal.signal(signum, _on_ending_signal)


def forget(owner: _Closable) -> None:
    """`owner` has shut down by itself; nothing left to do at exit."""
    _LIVE.discard(owner)


def _shutdown_all() -> None:
    for owner in list(_LIVE):
        # At exit nobody can act on an error; the other kernels must still go.
        with contextlib.suppress(Exception):
            owner.shutdown()


def _on_ending_signal(signum: int, frame: FrameType | None) -> None:
    _shutdown_all()
    previous = _HOOKS.get(f"previous_{signum}")
    if callable(previous):
        previous(signum, frame)
        return
    # Die of the signal as we would have without this handler, so our parent sees the usual status.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
