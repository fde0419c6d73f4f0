"""The Jupyter executor: one ipykernel per session on this machine, driven through jupyter-client.

`KernelExecutor` is the local transport under `SessionKernel` (`base.py`, which holds the lifecycle:
background start, one request per cell, timeouts, interrupts, kernel death): it launches the kernel
over IPC sockets, optionally inside the bubblewrap sandbox, follows a cell on the iopub channel and
watches the process for death. How the kernel process is launched and made sure to end lives in
`process.py`; how a cell's output is bounded, in `output.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import queue
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_core.utils import ensure_event_loop

from taskweaver_lite.config.settings import ExecutionConfig, McpServerConfig
from taskweaver_lite.errors import KernelError
from taskweaver_lite.kernel import namespace
from taskweaver_lite.kernel.base import DEFAULT_OUTPUT_TOKENS, POLL_INTERVAL, REPLY_WAIT, CellEnd, CellWatch, Ending, SessionKernel, show
from taskweaver_lite.kernel.interface import OutputSink
from taskweaver_lite.kernel.interpreter import kernel_python
from taskweaver_lite.kernel.mcp.launch import REPORT_EXPRESSION, McpLaunch
from taskweaver_lite.kernel.output import CellOutput
from taskweaver_lite.kernel.process import (
    InterpreterKernelManager,
    close_launch_files,
    filtered_environment,
    kill_marked,
    kill_process_group,
    make_undumpable,
    on_launcher_thread,
    socket_dir,
)
from taskweaver_lite.kernel.sandbox import cgroup as kernel_cgroup
from taskweaver_lite.kernel.sandbox import syscall_filter
from taskweaver_lite.kernel.sandbox.bwrap import SandboxPlan, fallback_notice, kernel_command, session_sandbox, uses_sandbox
from taskweaver_lite.kernel.sandbox.disk_limit import DiskWatch, Reached, disk_limit_notes, end_children, end_the_writer, human
from taskweaver_lite.kernel.sandbox.hidden_paths import hidden_path_notes
from taskweaver_lite.kernel.sandbox.kernel_pid import SandboxInfo, end_sandbox, find_kernel
from taskweaver_lite.kernel.uploads import copy_file
from taskweaver_lite.records.execution import CellError, ExecutionResult
from taskweaver_lite.records.plugin_spec import PluginSpec

SHUTDOWN_GRACE = 2.0
# Seconds to wait for an interrupted cell's reply once the kernel is idle: sent before it said so, it is there by now
# unless the kernel dropped it (an interrupt that landed in its own code, after the cell).
INTERRUPTED_REPLY_WAIT = 0.5
# Seconds a cell past the disk limit waits for a sandboxed kernel to say it raised the interrupt, before its writers end.
INTERRUPT_CONFIRM = 1.0


class KernelExecutor(SessionKernel):
    """Runs a session's cells in its own ipykernel on this machine; implements the `Executor` protocol."""

    def __init__(
        self,
        session_dir: Path,
        *,
        config: ExecutionConfig,
        output_tokens: int = DEFAULT_OUTPUT_TOKENS,
        plugins: tuple[PluginSpec, ...] = (),
        hidden: tuple[Path, ...] = (),
        mcp_servers: Mapping[str, McpServerConfig] | None = None,
    ) -> None:
        """Prepare the session folders and start the kernel in the background; returns at once.

        `output_tokens` bounds what one cell's output may take in a prompt (Config.cell_output_tokens).
        `plugins` are loaded into every kernel this executor starts (first, restarted) before its first cell.
        `hidden`: folders a sandboxed kernel must not see besides the user's home (the project's).
        `mcp_servers` (mcp.servers) are started by every kernel this executor starts, as its children (kernel/mcp/launch.py).
        A missing `bwrap` with `execution.sandbox: bubblewrap`, or an `execution.kernel` that cannot run
        ipykernel, raises ConfigError here, before anything starts.
        """
        use_sandbox = uses_sandbox(config)
        self.python = kernel_python(config.kernel)
        # The syscall filter's file: one per executor, read again by bubblewrap at every (re)start
        # (made first: without libseccomp this is a ConfigError, before any folder is made).
        self._seccomp_fd = syscall_filter.filter_file() if use_sandbox and config.syscall_filter == "default" else None
        make_undumpable()
        super().__init__(session_dir, config=config, output_tokens=output_tokens, plugins=plugins)
        self._mark = uuid.uuid4().hex
        self._log_path = self.session_dir / "kernel.log"
        # The kernel's own stderr (warnings, a segfault's last words) goes here, not over our terminal.
        self._log = os.fdopen(os.open(self._log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab")
        # IPC sockets: local only, no ports; in the session folder unless its path is too long for
        # a socket name (then a short private folder in /tmp), always removed at the end.
        self._socket_dir = socket_dir(self.session_dir)
        # Where bubblewrap says which process is the kernel: the disk limit finds it by id, never by name.
        self._sandbox_info = SandboxInfo() if use_sandbox else None
        self.sandbox = self._sandbox_plan(config, hidden=hidden) if use_sandbox else None
        # The kernel's own cgroup (memory in total, CPU, processes), joined at every start; None: none can be made here.
        self._cgroup, no_cgroup = kernel_cgroup.for_kernel(config)
        self._oom_kills = 0
        self._manager = self._kernel_manager(config)
        self._client: BlockingKernelClient | None = None
        # The plugins' source text travels in the request, so a kernel that cannot see our files loads them too.
        self._plugin_install = namespace.plugin_install_code(plugins, session_id=self.session_dir.name, cwd=self.cwd) if plugins else ""
        self._mcp = McpLaunch(mcp_servers or {}, network=self.sandbox is None or config.network)
        self._start_wait = self._mcp.wait
        # Said with the first cell: `auto` found bubblewrap but could not build a sandbox with it here.
        fallback = fallback_notice() if config.sandbox == "auto" and not use_sandbox else None
        filter_off = syscall_filter.lost_without() if use_sandbox and config.syscall_filter == "off" else None
        self._first_notices = tuple(notice for notice in (fallback, filter_off, no_cgroup) if notice)
        # execution.disk_limit (and disk_limit_files): the working folder, the socket folder and the kernel's log, in total.
        limit = config.disk_limit_bytes()
        paths = (self.cwd, self._socket_dir, self._log_path)
        self._disk = DiskWatch(paths, limit=limit, on_reached=self._disk_reached, files=config.disk_limit_files) if limit is not None else None
        self._kernel_pids: dict[int, int] = {}  # launched process -> the kernel's own (past bubblewrap's)
        self._strikes = 0  # times the folders grew past the limit between cells since the last cell
        # Asked for with every cell, in the same request: the variables, and the working folder put back.
        self._expressions = self._cell_expressions(str(self.cwd))
        self._begin("kernel-start")

    def _sandbox_plan(self, config: ExecutionConfig, *, hidden: tuple[Path, ...]) -> SandboxPlan:
        """What the kernel's bubblewrap sandbox lets it see and do (the same as on `taskweaver-lite gateway`)."""
        return session_sandbox(
            config,
            session_dir=self.session_dir,
            cwd=self.cwd,
            socket_dir=self._socket_dir,
            hidden=hidden,
            readable=self.python.folders,
            seccomp_fd=self._seccomp_fd,
            info_fd=self._sandbox_info.fd if self._sandbox_info is not None else None,
        )

    def _kernel_manager(self, config: ExecutionConfig) -> InterpreterKernelManager:
        """The jupyter-client manager that starts this executor's kernels: local sockets, our python, the sandbox's wrap."""
        manager = InterpreterKernelManager(transport="ipc", ip=str(self._socket_dir / "kernel"))
        manager.connection_file = str(self._socket_dir / "connection.json")
        manager.python = self.python.executable
        manager.wrap = functools.partial(kernel_command, config=config, plan=self.sandbox, cgroup=self._cgroup)
        if self.sandbox is not None:
            manager.interrupt_mode = "message"
            manager.seccomp_fd = self.sandbox.seccomp_fd
            manager.sandbox_info = self._sandbox_info
        if self.sandbox is not None and self.sandbox.run_as is not None:
            # Root's sandboxed kernel runs as a user of its own (sandbox/identity.py), who must read the connection file.
            manager.kernel_uid = self.sandbox.run_as
        manager.shutdown_wait_time = SHUTDOWN_GRACE
        return manager

    @property
    def pid(self) -> int | None:
        """The kernel's process id while it runs."""
        if self._closed or not self._manager.has_kernel:
            return None
        pid = getattr(self._manager.provisioner, "pid", None)
        return pid if isinstance(pid, int) else None

    def upload(self, source: Path, *, name: str | None = None) -> str:
        """Copy a local file into the working folder; returns its name there."""
        target_name = Path(name or source.name).name  # a bare name: never outside the folder
        copy_file(source, self.cwd, target_name)  # link-safe: a link planted under that name is replaced
        return target_name

    def interrupt(self) -> None:
        """Stop the running cell, if any; the kernel and its variables stay (thread- and signal-safe)."""
        if not self._running or self._closed:
            return
        super().interrupt()
        if threading.current_thread() is not threading.main_thread():
            close_thread_loop()

    def _kernel_name(self) -> str:
        return "The Python kernel"

    def _see_also(self) -> str:
        return f"; see {self._log_path}"

    def _start_failure(self, error: BaseException) -> KernelError:
        return KernelError(f"The Python kernel could not start ({error}); see {self._log_path}")

    def _kernel_folder(self) -> str:
        return str(self.cwd)

    def _mounts(self) -> tuple[str, ...]:
        return tuple(mount.describe() for mount in self.sandbox.mounts) if self.sandbox is not None else ()

    def _python(self) -> str:
        return self.python.describe()

    def _explain(self, error: CellError | None) -> tuple[str, ...]:
        return hidden_path_notes(error, self.sandbox) + disk_limit_notes(error, self.config.disk_limit_bytes())

    def _safety(self) -> tuple[tuple[str, str], ...]:
        if self.sandbox is None:
            layers = [("Sandbox", "none: the kernel runs as this program's user, unfiltered (execution.sandbox)")]
        elif self.sandbox.seccomp_fd is None:
            layers = [("Sandbox", "bubblewrap"), ("Syscalls", "not filtered (execution.syscall_filter: off)")]
        else:
            userns = "; --disable-userns" if self.sandbox.disable_userns else ""
            layers = [("Sandbox", "bubblewrap"), ("Syscalls", f"filtered: {syscall_filter.summary()}{userns} (execution.syscall_filter)")]
        use = self.disk_use()
        if use is None:
            layers.append(("Disk", "no limit (execution.disk_limit)"))
        else:
            size, limit = use
            shown = human(size) if size is not None else "unknown (cannot be measured)"
            layers.append(("Disk", f"{shown} of {human(limit)} kept (execution.disk_limit)"))
        return tuple(layers)

    def disk_use(self) -> tuple[int | None, int] | None:
        """What the kernel keeps on disk now and `execution.disk_limit` (None: no limit; size None: unmeasurable)."""
        if self._disk is None:
            return None
        now = self._disk.measure()
        return (now.size if isinstance(now, Reached) else now), self._disk.limit

    def _cell_limits(self) -> contextlib.AbstractContextManager[object]:
        if self._cgroup is not None:
            self._oom_kills = self._cgroup.oom_kills()
        return self._disk.cell() if self._disk is not None else contextlib.nullcontext()

    def _limits_checked(self, result: ExecutionResult) -> ExecutionResult:
        self._strikes = 0  # what happens between cells from here on is judged afresh
        ended = self._cgroup.oom_kills() - self._oom_kills if self._cgroup is not None else 0
        if ended > 0:
            memory = kernel_cgroup.memory_message(self.config, ended)
            if result.kernel_died:
                result = dataclasses.replace(result, success=False, notices=(*result.notices, memory))
            else:
                result = dataclasses.replace(result, success=False, limit_reached=memory)
        reached = self._disk.reached_in_cell() if self._disk is not None else None
        if reached is None:
            return result
        message = reached.message("The cell was stopped" if result.interrupted or result.kernel_died else "The cell ended")
        if result.kernel_died:  # its own outcome comes first; the reason is said beside it
            return dataclasses.replace(result, success=False, notices=(*result.notices, message))
        return dataclasses.replace(result, success=False, limit_reached=message)

    def _disk_reached(self, reached: Reached, in_cell: bool) -> None:
        """Past the disk limit (on the watcher's thread): end what the kernel started, stop the running cell.

        Between cells: the first time its child processes are ended; if the total still grows, the
        kernel itself is writing (a thread), and it is ended: the next cell restarts it and says why.
        """
        if not in_cell and not self._ready.is_set():
            return  # still starting: its log grows as it starts, which is not a cell's thread writing (the next cell's watch begins from here)
        kernel = self._kernel_process()
        if kernel is None:
            self._lost(reached)
            return
        if in_cell:
            # The interrupt raised in the kernel before its writers end: a cell waiting on them (`subprocess.run`) ends
            # on its own once they are gone, and an interrupt that reached the kernel after that would land in its own
            # code (the cell's reply lost: 5 s waiting for it) or in the next cell (which it fails).
            self._interrupt_raised()
            end_children(kernel)
            return
        if self._strikes > 1:
            # The kernel that kept writing was ended: what its last writes add as it dies is not the doing of the kernel
            # the next cell starts in its place (under load that one was up before the watcher looked again, and ended).
            return
        self._strikes += 1
        if self._strikes > 1:  # said before the kernel ends: the next cell, finding it ended, says why
            self._first_notices += (reached.message("Between cells the kernel kept writing, so it was ended,"),)
        end_the_writer(kernel, strikes=self._strikes)

    def _interrupt_raised(self) -> None:
        """Interrupt the running cell, and return once the kernel has raised the interrupt (or INTERRUPT_CONFIRM seconds passed).

        A signal (no sandbox) is raised as it is sent. A sandboxed kernel is interrupted by a message on
        its control channel, which it handles when it reads it: it raises the signal, then replies. The
        manager sends it without reading the reply, so it is sent here on a connection of its own.
        """
        if not self._running or self._closed:
            return
        manager = self._manager
        if manager.interrupt_mode != "message":
            self.interrupt()
            return
        self._interrupt_requested = True
        socket = manager.connect_control()
        try:
            sent = manager.session.send(socket, "interrupt_request", {})
            deadline = time.monotonic() + INTERRUPT_CONFIRM
            while (left := deadline - time.monotonic()) > 0 and socket.poll(int(left * 1000) + 1):
                _, reply = manager.session.recv(socket)
                if reply is not None and reply["parent_header"].get("msg_id") == sent["header"]["msg_id"]:
                    return
        finally:
            socket.close(linger=0)

    def _lost(self, reached: Reached) -> None:
        """Past the limit with no kernel to be found where bubblewrap said it is: the whole sandbox ends, and the next cell says why."""
        launched = self.pid
        if launched is None:
            return
        end_sandbox(launched)
        self._first_notices += (reached.message("The kernel could not be told apart from its sandbox, so the sandbox was ended,"),)

    def _kernel_process(self) -> int | None:
        """The kernel's own process id as this program sees it (inside bubblewrap it is two processes down; kernel_pid.py)."""
        launched = self.pid
        if launched is None:
            return None
        if launched not in self._kernel_pids:
            found = find_kernel(launched, self._sandbox_info)
            if found is None:
                return None
            self._kernel_pids = {launched: found}
        return self._kernel_pids[launched]

    def _end(self) -> None:
        if self._client is not None:
            self._client.stop_channels()
            self._client = None
        group = getattr(self._manager.provisioner, "pgid", None)
        try:
            if self._manager.has_kernel:
                self._manager.shutdown_kernel(now=False)
        finally:
            kill_process_group(group)  # whatever the user's code spawned in the kernel's process group
            kill_marked(self._mark)  # and what left the group (setsid) but still carries the kernel's mark
            if self._disk is not None:
                self._disk.close()
            self._log.close()
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            close_launch_files(self._seccomp_fd, self._sandbox_info)
            self._seccomp_fd = None
            if self._cgroup is not None:
                self._cgroup.remove()  # what is still in it (a process that left the kernel's group) ends with it

    def _launch(self) -> None:
        try:
            on_launcher_thread(
                lambda: self._manager.start_kernel(
                    env=filtered_environment(os.environ, allowed=self.config.allowed_env, display_width=self.config.display_width, mark=self._mark),
                    cwd=str(self.cwd),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=self._log,
                )
            )
            client = self._connect()
            if self._closed:  # shut down while we were starting
                client.stop_channels()
            else:
                self._client = client
        finally:
            close_thread_loop()

    def _connect(self) -> BlockingKernelClient:
        client = self._manager.client()
        client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
        try:
            client.wait_for_ready(timeout=self.config.kernel_start_timeout)
            # IPython took the streams' guard off when its start-up code ended: put it back before the first cell;
            # the same request asks which analysis libraries this kernel can import.
            first = {namespace.CWD: self._expressions[namespace.CWD], **namespace.LIBRARIES_EXPRESSION}
            self.libraries = namespace.importable_libraries(_reply(client, client.execute("", silent=True, store_history=False, user_expressions=first)))
            if self._plugin_install:
                self._install_plugins(client)
            if self._mcp.servers or self._mcp.refused:
                self._start_mcp_servers(client)
        except BaseException:
            client.stop_channels()  # open sockets would keep the zmq context from terminating at exit
            raise
        return client

    def _install_plugins(self, client: BlockingKernelClient) -> None:
        """Load the plugins into a new kernel; failures are kept to be reported with the next cell."""
        code = f"{self._plugin_install}{self._cell})"  # the cells run before: ctx.execution_id goes on from there
        msg_id = client.execute(code, silent=True, store_history=False, user_expressions=namespace.PLUGIN_FAILURES_EXPRESSION)
        self.plugin_failures = self._unreported_failures = namespace.plugin_failures(_reply(client, msg_id))

    def _start_mcp_servers(self, client: BlockingKernelClient) -> None:
        """Have a new kernel start the MCP servers as its children; those that did not start are told with the next cell."""
        reply = None
        if self._mcp.servers:
            msg_id = client.execute(self._mcp.code(), silent=True, store_history=False, user_expressions=REPORT_EXPRESSION)
            reply = _reply(client, msg_id, wait=self._mcp.wait)
        self._take_mcp_servers(self._mcp.reported(reply))

    def _lost_since_last_cell(self) -> tuple[str, ...] | None:
        if self._manager.is_alive():
            return None
        # Died between cells (the OOM killer picks idle kernels too): say so on this cell.
        lost = self._namespace.names()
        self._replace_kernel(graceful=False)
        return lost

    def _replace_kernel(self, *, graceful: bool) -> None:
        """A fresh kernel in place of the old one; every variable the old one held is gone."""
        self._namespace.forget()
        if self._client is not None:
            self._client.stop_channels()
            self._client = None
        try:
            on_launcher_thread(lambda: self._manager.restart_kernel(now=not graceful))
            self._client = self._connect()
        except Exception as exc:
            raise KernelError(f"The Python kernel could not be restarted ({exc}); see {self._log_path}") from exc

    def _recover(self, ending: Ending) -> None:
        self._replace_kernel(graceful=False)

    def _connected(self) -> BlockingKernelClient:
        if self._client is None:
            raise KernelError(f"The Python kernel is not connected; see {self._log_path}")
        return self._client

    def _execute(self, code: str) -> str:
        client = self._connected()
        msg_id: str = client.execute(code, store_history=True, user_expressions=self._expressions, allow_stdin=False, stop_on_error=False)
        return msg_id

    def _interrupt_kernel(self) -> None:
        self._manager.interrupt_kernel()

    def _follow(self, msg_id: str, output: CellOutput, *, deadline: float, on_output: OutputSink | None = None) -> CellEnd:
        """Feed the cell's iopub messages to `output` until the kernel is idle, dead, or stuck."""
        client = self._connected()
        watch = CellWatch(deadline=deadline)
        next_check = time.monotonic() + POLL_INTERVAL
        while True:
            try:
                msg = client.get_iopub_msg(timeout=POLL_INTERVAL)
            except queue.Empty:
                msg = None
            if msg is not None and msg["parent_header"].get("msg_id") == msg_id:
                if msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
                    # The reply goes out before the kernel says it is idle, unless an interrupt landed after the cell, in the
                    # kernel's own code: ipykernel then drops it. After an interrupt it is waited for briefly (the snapshot is
                    # asked for again without it).
                    interrupted = watch.interrupted_at is not None or self._interrupt_requested
                    return CellEnd("idle", watch.timed_out, reply=_reply(client, msg_id, wait=INTERRUPTED_REPLY_WAIT if interrupted else REPLY_WAIT))
                show(msg, output, on_output)
            # Checked on a clock rather than on silence, so a cell that prints nonstop still times out.
            now = time.monotonic()
            if now < next_check:
                continue
            next_check = now + POLL_INTERVAL
            if not self._manager.is_alive():
                return CellEnd("died", watch.timed_out)
            if self._keep_interrupting(watch, now):
                return CellEnd("stuck", watch.timed_out)

    def _request_expressions(self) -> dict[str, Any]:
        client = self._connected()
        msg_id = client.execute("", silent=True, store_history=False, user_expressions=self._expressions, allow_stdin=False, stop_on_error=False)
        return _reply(client, msg_id) or {}


def close_thread_loop() -> None:
    """Close the event loop jupyter-client's blocking calls opened for this (non-main) thread.

    jupyter_core keeps one loop per thread and never closes it, so each thread that started or
    interrupted a kernel would leave the loop's two sockets for the garbage collector.
    """
    loop = ensure_event_loop()
    if not loop.is_running():
        loop.close()
        asyncio.set_event_loop(None)


def _reply(client: BlockingKernelClient, msg_id: str, *, wait: float = REPLY_WAIT) -> dict[str, Any] | None:
    """The shell reply to `msg_id` within `wait` seconds, skipping replies to requests we gave up on."""
    deadline = time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        try:
            msg = client.get_shell_msg(timeout=left)
        except queue.Empty:
            return None
        if msg["parent_header"].get("msg_id") == msg_id:
            content: dict[str, Any] = msg["content"]
            return content
    return None
