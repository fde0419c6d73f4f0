"""The kernel process: how it is launched, what environment it gets, and how it is sure to end.

Launching: ipykernel on this very interpreter (never whatever a `python3` kernelspec points to),
with the in-kernel snapshot helper loaded at start. Environment: ours minus secrets. Ending: every
live executor is shut down at interpreter exit and on SIGTERM; ipykernel's parent poller ends a
kernel whose parent vanished without either (SIGKILL); and the kernel's whole process group is
killed after it, so subprocesses started by user code go too.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import KernelManager

from taskweaver_lite.kernel import display as kernel_display
from taskweaver_lite.kernel import guard as kernel_guard
from taskweaver_lite.kernel import snapshot as kernel_snapshot

SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
SECRET_PREFIXES = ("OPENAI_",)



def _load_by_path(name: str, path: str) -> str:
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


_START_UP = "; ".join(
    [
        _load_by_path(kernel_snapshot.MODULE_NAME, kernel_snapshot.__file__),
        _load_by_path(kernel_guard.MODULE_NAME, kernel_guard.__file__),
        f"__import__('sys').modules[{kernel_guard.MODULE_NAME!r}].install()",
    ]
)
# pandas' display width from TASKWEAVER_DISPLAY_WIDTH (see display.py); loaded the same way.
_SET_DISPLAY = (
    "import importlib.util as _twl_u; "
    f"_twl_p = _twl_u.spec_from_file_location('_taskweaver_display', {kernel_display.__file__!r}); "
    "_twl_m = _twl_u.module_from_spec(_twl_p); _twl_p.loader.exec_module(_twl_m); _twl_m.install(); del _twl_u, _twl_p, _twl_m"
)


def filtered_environment(environ: Mapping[str, str], *, allowed: list[str], display_width: int | None = None) -> dict[str, str]:
    """The kernel's environment: ours minus anything that looks like a secret, unless allowed by name."""
    kept = {name: value for name, value in environ.items() if name in allowed or not _looks_secret(name)}
    if display_width is not None:
        kept[kernel_display.WIDTH_VARIABLE] = str(display_width)
    # Figures must come back as images whatever backend the parent prefers (Agg would drop them).
    kept["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    return kept


def _looks_secret(name: str) -> bool:
    upper = name.upper()
    return upper.startswith(SECRET_PREFIXES) or any(marker in upper for marker in SECRET_MARKERS)


class InterpreterKernelManager(KernelManager):
    """A KernelManager that always runs ipykernel on this interpreter, whatever kernelspecs exist."""

    @property
    def kernel_spec(self) -> KernelSpec:
        argv = [
            sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
            # Sessions keep their own record; IPython's shared SQLite history only adds lock contention.
            "--HistoryManager.hist_file=:memory:",
            f"--IPKernelApp.exec_lines={_START_UP}; {_SET_DISPLAY}",
        ]  # fmt: skip
        return KernelSpec(argv=argv, display_name="taskweaver-lite", language="python")


def private_socket_dir(prefix: str = "twl-kernel-") -> Path:
    """A new private folder for a kernel's sockets (short path: socket paths are capped near 100 bytes).

    It holds our pid, so a later start can remove the folders of programs that were killed (`kill -9`)
    before they could clean up: `remove_stale_socket_dirs`.
    """
    remove_stale_socket_dirs(prefix)
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    (folder / OWNER_FILE).write_text(str(os.getpid()), encoding="ascii")
    return folder


def remove_stale_socket_dirs(prefix: str = "twl-kernel-") -> None:
    """Remove socket folders whose owning program is gone (folders without an owner file are left alone)."""
    for folder in Path(tempfile.gettempdir()).glob(prefix + "*"):
        try:
            owner = int((folder / OWNER_FILE).read_text(encoding="ascii"))
        except (OSError, ValueError):
            continue  # not ours to judge: another version's, or still being set up
        if not _alive(owner):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def kill_process_group(group: Any) -> None:
    """SIGKILL what is left of a kernel's process group (never our own group)."""
    if not isinstance(group, int) or not hasattr(os, "killpg") or group == os.getpgrp():
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is already gone
        os.killpg(group, signal.SIGKILL)


class _Closable(Protocol):
    def shutdown(self) -> None: ...


# A closed terminal (SIGHUP) ends us like `kill` (SIGTERM): kernels stop, their folders go.
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP) if hasattr(signal, "SIGHUP") else (signal.SIGTERM,)
OWNER_FILE = "owner.pid"
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
