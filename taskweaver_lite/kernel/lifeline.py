"""The kernel's lifeline: a pipe from the program that started it, so the kernel ends when that program does, however it ended.

The program makes one pipe and keeps its writing end (close-on-exec: no other program it starts
holds it); each kernel it starts gets the reading end (`attach`), and a thread in the kernel
(`watch`, loaded at kernel start like the guard) waits on it. Nothing is ever written: the read
returns only when the last writing end closes, which is when the program is gone, by exit, signal
or SIGKILL. The kernel then kills its process group, and in the sandbox its end ends the PID
namespace with everything in it.

bubblewrap's `--die-with-parent` alone leaves a gap: each bubblewrap process asks for it only
after its own set-up (the outer one after making the namespace, the namespace's first one after
the mounts), so a program killed while a kernel was starting left that sandbox running, parented
to pid 1. The lifeline has no such gap: a kernel started after the program died finds the pipe
closed at once.

Like `guard.py`, the kernel side runs in the ipykernel process, loaded by path: this file must stay
standalone (the standard library only).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

MODULE_NAME = "_taskweaver_lifeline"
VARIABLE = "TASKWEAVER_LITE_LIFELINE"  # the reading end's descriptor number, in the kernel's environment
_pipe: tuple[int, int] | None = None
_lock = threading.Lock()
watched: int | None = None  # in the kernel: the descriptor its watch waits on (the one it holds of the program's)


def reading_end() -> int:
    """This program's lifeline for its kernels: made at the first call, its writing end held until the program ends."""
    global _pipe
    with _lock:
        if _pipe is None:
            _pipe = os.pipe2(os.O_CLOEXEC)
        return _pipe[0]


def attach(launch: dict[str, Any]) -> None:
    """Give the kernel a launch's keyword arguments start (`subprocess.Popen`'s) the lifeline: its descriptor kept open, named in its environment."""
    fd = reading_end()
    launch["pass_fds"] = (*launch.get("pass_fds", ()), fd)
    launch["env"] = {**(launch.get("env") or os.environ), VARIABLE: str(fd)}


def watch() -> None:
    """In the kernel: end the kernel and its process group once the program that started it is gone (no lifeline: nothing to watch)."""
    named = os.environ.pop(VARIABLE, "")
    if not named.isdigit():
        return
    fd = int(named)
    try:
        os.set_inheritable(fd, False)  # the kernel's own children need not hold it
    except OSError:
        return  # not open here: a kernel started some other way
    global watched
    watched = fd
    threading.Thread(target=_wait, args=(fd,), name="taskweaver-lifeline", daemon=True).start()


def _wait(fd: int) -> None:
    try:
        while os.read(fd, 1):  # nothing is written: a read returns only at the end
            pass
    except OSError:
        return  # the descriptor was closed under us (a cell did it): the sandbox's own ending still holds
    os.kill(0, signal.SIGKILL)  # pid 0: every process of the kernel's group (its leader may be outside the sandbox's namespace)
