"""The kernel provisioner of `taskweaver-lite gateway`: every kernel the gateway starts runs in this program's sandbox.

jupyter_client starts a kernel through the provisioner its kernelspec names
(`metadata.kernel_provisioner.provisioner_name`, looked up in the `jupyter_client.kernel_provisioners`
entry point group). `SandboxProvisioner` is jupyter_client's local one with the launch changed in
three ways, so that a gateway shared by several users keeps them apart as the local sandbox keeps
projects apart:

- the folder: the start request's `KERNEL_TASKWEAVER_SESSION` (a replica sends the session's id)
  names `<root>/taskweaver_sessions/<id>`, the kernel's working folder and the only one of the
  gateway's it sees (a start without it gets a folder named after the kernel's id). The kernel starts
  in `<root>`, where that path is all there is, so the replica's start-up code finds its folder
  at the same relative path as on any gateway;
- the sockets: IPC, in a folder of the kernel's own under `<root>/kernels`, with its connection
  file: the kernel needs no network at all, and no other kernel sees either;
- the command: the local sandbox's (`sandbox.session_sandbox`, `sandbox.kernel_command`): a uid per
  session when the gateway runs as root, its own PID namespace, no network, the syscall filter,
  a cgroup of its own (`sandbox/cgroup.py`: `execution.memory_limit` for all its processes
  together, `cpu_limit`, `max_processes`), and the project's `execution.memory_limit`, `max_processes` and `disk_limit` (kept by a
  `DiskWatch` here: past it, the kernel's child processes are ended, then the kernel, found by its
  process id as bubblewrap announces it, `sandbox/kernel_pid.py`).

Its standard streams are its own: stdin is /dev/null, stdout and stderr go to the session's log,
`<root>/logs/<session>.log` (owner-only, counted by the disk limit, removed with the session). Only
those and the syscall filter's file are handed to bubblewrap: nothing of the gateway's own (its log,
its terminal, the journal's stream) is there for a cell to reopen through `/proc/self/fd`.

`KERNEL_USERNAME` (the session's owner, sent by serve) is whose kernel it is: the gateway's kernel
manager counts each user's kernels against `gateway.max_kernels_per_user` (user_limit.py).
The environment a kernel gets is the request's `KERNEL_*` variables, `PATH` and the locale, and
`execution.allowed_env`: nothing else of the gateway's, its token least of all.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning.local_provisioner import LocalProvisioner
from tornado.web import HTTPError
from traitlets import Unicode

from taskweaver_lite.config.file import load_config
from taskweaver_lite.config.settings import Config
from taskweaver_lite.kernel.process import (
    DEBUGGER_BACK,
    LAUNCH,
    LIFELINE_START_UP,
    SOCKET_PATH_LIMIT,
    close_launch_files,
    filtered_environment,
    pass_launch_files,
)
from taskweaver_lite.kernel.sandbox import cgroup as kernel_cgroup
from taskweaver_lite.kernel.sandbox import syscall_filter
from taskweaver_lite.kernel.sandbox.bwrap import SandboxPlan, kernel_command, session_sandbox, uses_sandbox
from taskweaver_lite.kernel.sandbox.disk_limit import DiskWatch, Reached, end_the_writer
from taskweaver_lite.kernel.sandbox.kernel_pid import SandboxInfo, end_sandbox, find_kernel

NAME = "taskweaver-lite-sandbox"  # the entry point's name, in the kernelspec's metadata (serve reads it to tell our gateway from a plain one)
SESSION_VARIABLE = "KERNEL_TASKWEAVER_SESSION"
OWNER_VARIABLE = "KERNEL_USERNAME"
USER_NAME_VARIABLE = "KERNEL_TASKWEAVER_USER"  # the owner's name, for the gateway's log and metrics (KERNEL_USERNAME is an id)
SESSIONS = "taskweaver_sessions"  # as the replica's start-up code names it (remote.REMOTE_SESSIONS)
KERNELS = "kernels"
LOGS = "logs"  # <root>/logs/<session>.log: a session's kernels' stdout and stderr
SESSION_ROUTE = "/api/taskweaver-lite/sessions/"  # + a session id: DELETE ends its kernels and removes its folder (server.py)
# What a session id or a user name may be to become a folder name or a count's key.
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,99}")
_KEPT_ENVIRONMENT = ("PATH", "LANG", "LANGUAGE", "TZ")


class KernelRefused(HTTPError):
    """A kernel the gateway will not start: the start request gets 403 and this message (its `message` field)."""

    def __init__(self, message: str) -> None:
        super().__init__(403, message, reason="Kernel refused")


@functools.cache
def project_config(project_dir: str) -> Config:
    """The gateway's project config, read once per process (the gateway command read it first, so it is valid)."""
    return load_config(project_dir)


def safe_name(given: str | None) -> str | None:
    """`given` when it may be a folder's name or a count's key (letters, digits, . _ - @; at most 100), else None."""
    return given if given and _SAFE_NAME.fullmatch(given) and given not in (".", "..") else None


def session_name(env: dict[str, str], *, kernel_id: str) -> str:
    """The session folder's name: `KERNEL_TASKWEAVER_SESSION` when it is a safe name, else the kernel's id."""
    given = env.get(SESSION_VARIABLE, "")
    if not given:
        return kernel_id
    if not _SAFE_NAME.fullmatch(given) or given in (".", ".."):
        raise KernelRefused(f"{SESSION_VARIABLE}={given[:40]!r} is not a session id (letters, digits, . _ - @; at most 100)")
    return given


def kernel_environment(given: dict[str, str], *, allowed: list[str]) -> dict[str, str]:
    """The kernel's environment: the request's `KERNEL_*`, `PATH`, the locale and `allowed`; nothing else of the gateway's."""
    kept = {name: value for name, value in given.items() if name.startswith(("KERNEL_", "LC_", "JPY_")) or name in _KEPT_ENVIRONMENT or name in allowed}
    return filtered_environment(kept, allowed=allowed)


class SandboxProvisioner(LocalProvisioner):
    """Starts the kernel in the sandbox of its session's folder under the gateway's root, over IPC sockets."""

    project_dir = Unicode("", config=True, help="the project whose execution.* settings shape the sandbox")
    root = Unicode("", config=True, help="the folder holding the sessions' folders (gateway.root)")

    session: str | None = None
    owner: str | None = None
    plan: SandboxPlan | None = None
    _seccomp_fd: int | None = None
    _sandbox_info: SandboxInfo | None = None
    _cgroup: kernel_cgroup.KernelCgroup | None = None
    _socket_dir: Path | None = None
    _disk: DiskWatch | None = None
    _log: int | None = None  # the session's log, open for the kernel's stdout and stderr
    _strikes = 0

    @property
    def config_of_project(self) -> Config:
        """The project's config (`execution.*`, `gateway.*`)."""
        return project_config(self.project_dir)

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Prepare the session's folder, the socket folder and the sandbox; the command comes back wrapped in it."""
        config = self.config_of_project
        km: Any = self.parent  # the KernelManager of this kernel
        given = dict(kwargs.get("env") or os.environ)
        if self.session is None:  # a restart keeps the first start's session, folder and sockets
            self.session = session_name(given, kernel_id=str(self.kernel_id))
            self.owner = safe_name(given.get(OWNER_VARIABLE))
        root = Path(self.root).resolve()
        cwd = root / SESSIONS / self.session
        cwd.mkdir(parents=True, exist_ok=True)
        socket_dir = self._sockets(root)
        km.transport, km.ip, km.cache_ports = "ipc", str(socket_dir / "kernel"), False
        km.connection_file = str(socket_dir / "connection.json")
        execution = config.execution
        if uses_sandbox(execution) and self._seccomp_fd is None and execution.syscall_filter == "default":
            self._seccomp_fd = syscall_filter.filter_file()
        if uses_sandbox(execution) and self._sandbox_info is None:
            self._sandbox_info = SandboxInfo()
        hidden = (root, config.project_dir)
        info_fd = self._sandbox_info.fd if self._sandbox_info is not None else None
        self.plan = (
            session_sandbox(
                execution, session_dir=cwd, cwd=cwd, socket_dir=socket_dir, hidden=hidden, seccomp_fd=self._seccomp_fd, start_in=root, info_fd=info_fd
            )
            if uses_sandbox(execution)
            else None
        )
        if self._cgroup is None:  # the gateway said at start, in one line, when none can be made here
            self._cgroup, _ = kernel_cgroup.for_kernel(execution)
        kwargs["env"] = kernel_environment(given, allowed=execution.allowed_env)
        kwargs["cwd"] = str(root if self.plan is None else cwd)
        launch = await super().pre_launch(**kwargs)
        if self.plan is not None and self.plan.run_as is not None:
            os.chown(km.connection_file, self.plan.run_as, self.plan.run_as)  # written by the gateway, read by the kernel's own uid
        launch["cmd"] = kernel_command(launch["cmd"], config=execution, plan=self.plan, cgroup=self._cgroup)
        return launch

    def _sockets(self, root: Path) -> Path:
        """The kernel's own folder for its IPC sockets and connection file (kept across restarts)."""
        if self._socket_dir is None:
            folder = root / KERNELS / str(self.kernel_id)
            if len(os.fsencode(folder / "kernel-65535")) > SOCKET_PATH_LIMIT:  # a deep root: a short folder of the gateway's own
                self._socket_dir = Path(tempfile.mkdtemp(prefix="twl-gateway-"))
                return self._socket_dir
            shutil.rmtree(folder, ignore_errors=True)  # a kernel of that id cannot be running: left by a killed gateway
            folder.mkdir(mode=0o700, parents=True)
            self._socket_dir = folder
        return self._socket_dir

    def log_path(self) -> Path:
        """The session's log: what its kernels write on stdout and stderr."""
        return Path(self.root).resolve() / LOGS / f"{self.session}.log"

    def _open_log(self) -> int:
        """The session's log, opened for appending (kept across restarts), the gateway's alone to read."""
        if self._log is None:
            path = self.log_path()
            path.parent.mkdir(mode=0o700, exist_ok=True)
            self._log = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        return self._log

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        """Start the sandboxed kernel with streams of its own, the syscall filter's file open in it for bubblewrap to read."""
        # The kernel ends with the gateway, however the gateway ends (its lifeline).
        pass_launch_files(kwargs, seccomp_fd=self._seccomp_fd, sandbox_info=self._sandbox_info if self.plan is not None else None)
        log = self._open_log()
        kwargs.update(stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        return await super().launch_kernel(cmd, **kwargs)

    async def post_launch(self, **kwargs: Any) -> None:
        """Watch the session's folders against `execution.disk_limit`."""
        await super().post_launch(**kwargs)
        execution = self.config_of_project.execution
        limit = execution.disk_limit_bytes()
        if limit is not None and self._disk is None and self.plan is not None:
            paths = (self.plan.cwd, self.plan.socket_dir, self.log_path())
            self._disk = DiskWatch(paths, limit=limit, on_reached=self._disk_reached, files=execution.disk_limit_files)

    def _disk_reached(self, reached: Reached, in_cell: bool) -> None:
        """Past the disk limit (on the watcher's thread): the kernel's child processes end; if it still grows, the kernel does.

        A kernel that cannot be found where bubblewrap said it is ends with its whole sandbox.
        """
        if not isinstance(self.pid, int):
            return
        kernel = find_kernel(self.pid, self._sandbox_info if self.plan is not None else None)
        if kernel is None:
            end_sandbox(self.pid)
            return
        self._strikes += 1
        if end_the_writer(kernel, strikes=self._strikes):
            self._strikes = 0  # the gateway restarts it; the replica tells the model its variables are gone

    async def cleanup(self, restart: bool = False) -> None:
        """After the kernel ended: its sockets and the filter's file go (its session folder stays for the session's next kernel)."""
        await super().cleanup(restart=restart)
        if restart:
            return
        if self._disk is not None:
            self._disk.close()
            self._disk = None
        if self._log is not None:
            os.close(self._log)
            self._log = None
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
        close_launch_files(self._seccomp_fd, self._sandbox_info)
        self._seccomp_fd, self._sandbox_info = None, None
        if self._cgroup is not None:
            self._cgroup.remove()
            self._cgroup = None


def kernels_of_session(manager: Any, session: str) -> list[str]:
    """The ids of the kernels the gateway runs for `session` (a replica's session id)."""
    found = []
    for kernel_id in manager.list_kernel_ids():
        with contextlib.suppress(KeyError):
            provisioner = manager.get_kernel(kernel_id).provisioner
            if isinstance(provisioner, SandboxProvisioner) and provisioner.session == session:
                found.append(kernel_id)
    return found


def kernelspec(*, project_dir: Path, root: Path) -> dict[str, Any]:
    """The kernel.json of the gateway's only kernelspec: ipykernel on this interpreter, started by `SandboxProvisioner`."""
    # Sessions keep their own record; IPython's shared SQLite history only adds lock contention.
    argv = [sys.executable, *LAUNCH, "-f", "{connection_file}", "--HistoryManager.hist_file=:memory:", "--InteractiveShell.automagic=False"]
    argv.append(f"--IPKernelApp.exec_lines={LIFELINE_START_UP}; {DEBUGGER_BACK}")
    return {
        "argv": argv,
        "display_name": "Python (taskweaver-lite sandbox)",
        "language": "python",
        # Inside bubblewrap a signal to the launched process would not reach the kernel: interrupts travel as messages.
        "interrupt_mode": "message",
        "metadata": {"kernel_provisioner": {"provisioner_name": NAME, "config": {"project_dir": str(project_dir), "root": str(root)}}},
    }
