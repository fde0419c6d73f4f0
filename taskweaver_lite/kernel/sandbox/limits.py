"""Run a command under the kernel's limits: `python limits.py [--join FILE]... [--memory B] [--processes N] [--file-size B] [--uid U] -- command...`.

Joins the kernel's cgroup first (`--join`: a `cgroup.procs` file of cgroup.py's, one per
controller on cgroup v1), so that everything the command starts is in it: run outside
bubblewrap for that, since the sandbox cannot write there.

Sets the address-space limit (bytes), the largest file any process may write (`RLIMIT_FSIZE`,
the disk limit: the program lowers the soft limit to the room left before each cell) and the
process limit (`RLIMIT_NPROC`, counted per user:
the caller passes what this user runs already plus the cap), becomes `--uid` if given (root's
sandboxed kernels run as a uid of their own), then replaces itself with the command. Run by path, on the
kernel's interpreter, so it imports nothing of ours.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Sequence


def arguments(*, memory: int | None, processes: int | None, uid: int | None, file_size: int | None = None) -> list[str]:
    """This launcher's options for the given limits (None: no limit, same user)."""
    args: list[str] = []
    for flag, value in (("--memory", memory), ("--processes", processes), ("--file-size", file_size), ("--uid", uid)):
        if value is not None:
            args += [flag, str(value)]
    return args


def user_tasks(uid: int) -> int:
    """Processes and threads this user runs now, as RLIMIT_NPROC counts them."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", encoding="ascii", errors="replace") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except OSError:
            continue  # gone meanwhile
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            count += int(fields.get("Threads", "1").strip())
    return count


def join_arguments(files: Sequence[str]) -> list[str]:
    """This launcher's options to join the cgroup whose `cgroup.procs` files are `files`."""
    return [arg for file in files for arg in ("--join", file)]


def main(argv: Sequence[str]) -> None:
    """Apply the limits in `argv` and exec the command after `--`."""
    split = list(argv).index("--")
    options, command = list(argv[:split]), list(argv[split + 1 :])
    pairs = list(zip(options[::2], options[1::2], strict=True))
    for flag, file in pairs:
        if flag == "--join":
            with open(file, "w", encoding="ascii") as procs:
                procs.write(str(os.getpid()))
    values = {flag: int(value) for flag, value in pairs if flag != "--join"}
    if "--memory" in values:
        resource.setrlimit(resource.RLIMIT_AS, (values["--memory"], values["--memory"]))
    if "--file-size" in values:
        resource.setrlimit(resource.RLIMIT_FSIZE, (values["--file-size"], values["--file-size"]))
    if "--uid" in values:
        os.setgroups([])
        os.setgid(values["--uid"])
        os.setuid(values["--uid"])
    if "--processes" in values:
        resource.setrlimit(resource.RLIMIT_NPROC, (values["--processes"], values["--processes"]))
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
