"""The Jupyter executor: one ipykernel per session, driven through jupyter-client.

`KernelExecutor` starts its kernel in a background thread the moment a session opens, runs each
cell as ONE execute request (the variable snapshot rides along in `user_expressions`), bounds what
comes back for prompts, and keeps the session going through timeouts, interrupts and kernel death.
How the kernel process is launched and made sure to end lives in `process.py`; how a cell's
output is bounded, in `output.py`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
import os
import queue
import shutil
import subprocess
import threading
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_core.utils import ensure_event_loop

from taskweaver_lite.config import ExecutionConfig
from taskweaver_lite.errors import KernelError
from taskweaver_lite.execution import ExecutionResult, OutputSink, Variable, VariableChanges
from taskweaver_lite.kernel import namespace
from taskweaver_lite.kernel.output import CellOutput, artifact_file
from taskweaver_lite.kernel.process import (
    InterpreterKernelManager,
    end_at_exit,
    filtered_environment,
    forget,
    kill_marked,
    kill_process_group,
    make_undumpable,
    on_launcher_thread,
    socket_dir,
)
from taskweaver_lite.kernel.sandbox import fallback_notice, kernel_command, plan_for, uses_sandbox
from taskweaver_lite.plugins.catalog import PluginSpec
from taskweaver_lite.uploads import copy_file

# Seconds between checks of the clock and of the kernel process while a cell runs: the bound on
# how late a timeout fires and how long a dead kernel goes unnoticed.
POLL_INTERVAL = 0.1
# An interrupted cell gets this long to unwind (SIGINT is re-sent each second) before the kernel is
# replaced; C code that never checks for signals ends up here.
INTERRUPT_GRACE = 5.0
SHUTDOWN_GRACE = 2.0
REPLY_WAIT = 5.0
DEFAULT_OUTPUT_TOKENS = 1_000


_Ending = Literal["idle", "died", "stuck"]


class KernelExecutor:
    """Runs a session's cells in its own ipykernel; implements the `Executor` protocol."""

    def __init__(
        self,
        session_dir: Path,
        *,
        config: ExecutionConfig,
        output_tokens: int = DEFAULT_OUTPUT_TOKENS,
        plugins: tuple[PluginSpec, ...] = (),
        hidden: tuple[Path, ...] = (),
    ) -> None:
        """Prepare the session folders and start the kernel in the background; returns at once.

        `output_tokens` bounds what one cell's output may take in a prompt (Config.cell_output_tokens).
        `plugins` are loaded into every kernel this executor starts (first, restarted) before its first cell.
        `hidden`: folders a sandboxed kernel must not see besides the user's home (the project's).
        A missing `bwrap` with `execution.sandbox: bubblewrap` raises ConfigError here, before anything starts.
        """
        use_sandbox = uses_sandbox(config)
        make_undumpable()
        self._mark = uuid.uuid4().hex
        self.session_dir = Path(session_dir).resolve()
        self.cwd = self.session_dir / "cwd"
        self.artifacts_dir = self.session_dir / "artifacts"
        self.outputs_dir = self.session_dir / "outputs"
        for folder in (self.cwd, self.artifacts_dir, self.outputs_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.output_tokens = output_tokens
        self._log_path = self.session_dir / "kernel.log"
        # The kernel's own stderr (warnings, a segfault's last words) goes here, not over our terminal.
        self._log = self._log_path.open("ab")
        # IPC sockets: local only, no ports; in the session folder unless its path is too long for
        # a socket name (then a short private folder in /tmp), always removed at the end.
        self._socket_dir = socket_dir(self.session_dir)
        self._manager = InterpreterKernelManager(transport="ipc", ip=str(self._socket_dir / "kernel"))
        self._manager.connection_file = str(self._socket_dir / "connection.json")
        self.sandbox = None
        if use_sandbox:
            self.sandbox = plan_for(cwd=self.cwd, socket_dir=self._socket_dir, hidden=hidden, network=config.network, tmp_bytes=config.memory_limit_bytes())
        self._manager.wrap = functools.partial(kernel_command, config=config, plan=self.sandbox)
        if self.sandbox is not None:
            self._manager.interrupt_mode = "message"
        if self.sandbox is not None and self.sandbox.run_as is not None:
            # Root's sandboxed kernel runs as nobody: it must write its sockets and the working folder.
            for folder in (self._socket_dir, self.cwd):
                os.chown(folder, self.sandbox.run_as, self.sandbox.run_as)
            self._manager.kernel_uid = self.sandbox.run_as
        self._manager.shutdown_wait_time = SHUTDOWN_GRACE
        self._client: BlockingKernelClient | None = None
        self._start_error: BaseException | None = None
        self._ready = threading.Event()
        self._run_lock = threading.Lock()
        self._running: str | None = None
        self._interrupt_requested = False
        self._closed = False
        self._namespace = namespace.VariableTracker()
        self._cell = namespace.last_cell_number(self.outputs_dir, self.artifacts_dir)
        # The plugins' source text travels in the request, so a kernel that cannot see our files loads them too.
        self._plugin_install = namespace.plugin_install_code(plugins, session_id=self.session_dir.name, cwd=self.cwd) if plugins else ""
        self.plugin_failures: tuple[str, ...] = ()  # plugins that failed to load in the current kernel, one line each
        self._unreported_failures: tuple[str, ...] = ()
        # Said with the first cell: `auto` found bubblewrap but could not build a sandbox with it here.
        fallback = fallback_notice() if config.sandbox == "auto" and not use_sandbox else None
        self._first_notices: tuple[str, ...] = (fallback,) if fallback else ()
        # Asked for with every cell, in the same request: the variables, and the working folder put back.
        self._expressions = namespace.cell_expressions(str(self.cwd))
        if plugins:  # what plugins logged and saved during the cell; no cost for sessions without plugins
            self._expressions.update(namespace.PLUGIN_REPORT_EXPRESSION)
        end_at_exit(self)
        self._starter = threading.Thread(target=self._start, name="kernel-start", daemon=True)
        self._starter.start()

    @property
    def pid(self) -> int | None:
        """The kernel's process id while it runs."""
        if self._closed or not self._manager.has_kernel:
            return None
        pid = getattr(self._manager.provisioner, "pid", None)
        return pid if isinstance(pid, int) else None

    @property
    def working_dir(self) -> Path:
        """The kernel's working folder (`<session>/cwd`)."""
        return self.cwd

    def upload(self, source: Path, *, name: str | None = None) -> str:
        """Copy a local file into the working folder; returns its name there."""
        target_name = Path(name or source.name).name  # a bare name: never outside the folder
        target = self.cwd / target_name
        if source.resolve() != target.resolve():
            copy_file(source, target)
        return target_name

    def artifact(self, name: str) -> Path:
        """The file of an artifact a cell saved (plots), by its file name; KeyError if there is none."""
        return artifact_file(self.artifacts_dir, name)

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until the kernel answers (default limit: the configured start timeout); KernelError if not."""
        if self._closed:
            raise KernelError("The Python kernel of this session was already shut down.")
        limit = self.config.kernel_start_timeout + REPLY_WAIT if timeout is None else timeout
        if not self._ready.wait(limit):
            raise KernelError(f"The Python kernel is not ready after {limit:g} s; see {self._log_path}")
        if self._start_error is not None:
            raise KernelError(f"The Python kernel could not start ({self._start_error}); see {self._log_path}")

    def run(self, code: str, *, timeout: float | None = None, on_output: OutputSink | None = None) -> ExecutionResult:
        """Run one cell and return what it did; waits for the kernel if it is still starting.

        What the cell prints also goes to `on_output` as the kernel sends it (for the screen).
        """
        self.wait_ready()
        with self._run_lock:
            if self._closed:
                raise KernelError("The Python kernel of this session was already shut down.")
            lost: tuple[str, ...] = ()
            if not self._manager.is_alive():
                # Died between cells (the OOM killer picks idle kernels too): say so on this cell.
                lost = self._namespace.names()
                self._replace_kernel(graceful=False)
            result = self._run_cell(code, self.config.timeout if timeout is None else timeout, on_output)
            if lost:
                result = dataclasses.replace(result, kernel_died=True, lost_variables=lost)
            return result

    def interrupt(self) -> None:
        """Stop the running cell, if any; the kernel and its variables stay (thread- and signal-safe)."""
        if self._running is None or self._closed:
            return
        self._interrupt_requested = True
        self._manager.interrupt_kernel()
        if threading.current_thread() is not threading.main_thread():
            close_thread_loop()

    def variables(self) -> tuple[Variable, ...]:
        """The latest snapshot of user variables (from the last cell; no kernel round trip)."""
        return self._namespace.variables

    def restart(self) -> tuple[str, ...]:
        """Replace the kernel with a fresh one; returns the names of the variables that were lost."""
        self.wait_ready()
        with self._run_lock:
            lost = self._namespace.names()
            self._replace_kernel(graceful=True)
            return lost

    def shutdown(self) -> None:
        """End the kernel and everything it started; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        forget(self)
        # A start stuck past its own timeout must not keep the kernel alive: go on and kill it.
        self._starter.join(self.config.kernel_start_timeout + REPLY_WAIT)
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
            self._log.close()
            shutil.rmtree(self._socket_dir, ignore_errors=True)

    def __enter__(self) -> KernelExecutor:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.shutdown()

    def _start(self) -> None:
        try:
            on_launcher_thread(
                lambda: self._manager.start_kernel(
                    env=filtered_environment(os.environ, allowed=self.config.allowed_env, display_width=self.config.display_width, mark=self._mark),
                    cwd=str(self.cwd),
                    stdout=subprocess.DEVNULL,
                    stderr=self._log,
                )
            )
            client = self._connect()
            if self._closed:  # shut down while we were starting
                client.stop_channels()
            else:
                self._client = client
        except Exception as exc:  # noqa: BLE001 - whatever it is, `wait_ready` reports it as a KernelError in the caller's thread
            self._start_error = exc
        finally:
            close_thread_loop()
            self._ready.set()

    def _connect(self) -> BlockingKernelClient:
        client = self._manager.client()
        client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
        try:
            client.wait_for_ready(timeout=self.config.kernel_start_timeout)
            # IPython took the streams' guard off when its start-up code ended: put it back before the first cell.
            _reply(client, client.execute("", silent=True, store_history=False, user_expressions={namespace.CWD: self._expressions[namespace.CWD]}))
            if self._plugin_install:
                self._install_plugins(client)
        except BaseException:
            client.stop_channels()  # open sockets would keep the zmq context from terminating at exit
            raise
        return client

    def _install_plugins(self, client: BlockingKernelClient) -> None:
        """Load the plugins into a new kernel; failures are kept to be reported with the next cell."""
        code = f"{self._plugin_install}{self._cell})"  # the cells run before: ctx.execution_id goes on from there
        msg_id = client.execute(code, silent=True, store_history=False, user_expressions=namespace.PLUGIN_FAILURES_EXPRESSION)
        self.plugin_failures = self._unreported_failures = namespace.plugin_failures(_reply(client, msg_id))

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

    def _run_cell(self, code: str, timeout: float, on_output: OutputSink | None) -> ExecutionResult:
        client = self._client
        if client is None:
            raise KernelError(f"The Python kernel is not connected; see {self._log_path}")
        self._cell += 1
        stem = f"cell-{self._cell:04d}"
        output = CellOutput(
            max_tokens=self.output_tokens,
            transcript_path=self.outputs_dir / f"{stem}.txt",
            artifacts_dir=self.artifacts_dir,
            stem=stem,
        )
        self._interrupt_requested = False
        started = time.monotonic()
        msg_id = client.execute(code, store_history=True, user_expressions=self._expressions, allow_stdin=False, stop_on_error=False)
        self._running = msg_id
        try:
            ending, timed_out = self._follow(client, msg_id, output, deadline=started + timeout, on_output=on_output)
        except KeyboardInterrupt:
            self._stop_after_ctrl_c(client, msg_id, output)
            raise
        finally:
            self._running = None
        interrupted = self._interrupt_requested and not timed_out
        base = dataclasses.replace(
            output.finish(code), elapsed=time.monotonic() - started, timed_out=timed_out, interrupted=interrupted
        )
        if ending != "idle":
            lost = self._namespace.names()
            self._replace_kernel(graceful=False)
            return dataclasses.replace(
                base, success=False, kernel_died=True, lost_variables=lost, changes=VariableChanges(deleted=lost)
            )
        reply = _reply(client, msg_id) or {}
        ok = reply.get("status") == "ok"
        # The kernel skips user_expressions after an error, so only then do they cost a request.
        expressions = reply if ok else self._request_expressions(client)
        changes = self._namespace.take(namespace.snapshot_rows(expressions))
        notices = base.notices + namespace.moved_notice(namespace.moved_from(expressions), str(self.cwd))
        logs, saved = namespace.plugin_reports(expressions)
        self.plugin_failures += namespace.plugins_broken(expressions)  # /plugins shows them from now on
        failures = self._first_notices + tuple(f"A plugin could not be loaded and is not available: {line}" for line in self._unreported_failures)
        self._unreported_failures = self._first_notices = ()
        return dataclasses.replace(
            base,
            success=base.success and ok,
            execution_count=reply.get("execution_count"),
            variables=self._namespace.variables,
            changes=changes,
            notices=failures + notices + logs,
            artifacts=base.artifacts + saved,
        )

    def _follow(
        self, client: BlockingKernelClient, msg_id: str, output: CellOutput, *, deadline: float, on_output: OutputSink | None = None
    ) -> tuple[_Ending, bool]:
        """Feed the cell's iopub messages to `output` until the kernel is idle, dead, or stuck."""
        timed_out = False
        interrupted_at: float | None = None
        signalled_at = 0.0
        next_check = time.monotonic() + POLL_INTERVAL
        while True:
            try:
                msg = client.get_iopub_msg(timeout=POLL_INTERVAL)
            except queue.Empty:
                msg = None
            if msg is not None and msg["parent_header"].get("msg_id") == msg_id:
                if msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
                    return "idle", timed_out
                output.add(msg["msg_type"], msg["content"])
                if on_output is not None and msg["msg_type"] == "stream":
                    on_output(str(msg["content"].get("name", "stdout")), str(msg["content"].get("text", "")))
            # Checked on a clock rather than on silence, so a cell that prints nonstop still times out.
            now = time.monotonic()
            if now < next_check:
                continue
            next_check = now + POLL_INTERVAL
            if not self._manager.is_alive():
                return "died", timed_out
            if interrupted_at is None:
                if now >= deadline and not self._interrupt_requested:
                    timed_out = True
                    self._manager.interrupt_kernel()
                if timed_out or self._interrupt_requested:
                    interrupted_at = signalled_at = now
            elif now >= interrupted_at + INTERRUPT_GRACE:
                return "stuck", timed_out
            elif now >= signalled_at + 1.0:
                # A SIGINT that lands before the kernel enters the cell is ignored; repeat it.
                signalled_at = now
                self._manager.interrupt_kernel()

    def _stop_after_ctrl_c(self, client: BlockingKernelClient, msg_id: str, output: CellOutput) -> None:
        """Ctrl-C reached us mid-cell: stop the cell, wait for the kernel to settle, keep the snapshot current."""
        self._interrupt_requested = True
        self._manager.interrupt_kernel()
        try:
            ending, _ = self._follow(client, msg_id, output, deadline=math.inf)
        finally:
            output.close()
        if ending == "idle":
            _reply(client, msg_id)
            self._namespace.take(namespace.snapshot_rows(self._request_expressions(client)))
        else:
            self._replace_kernel(graceful=False)

    def _request_expressions(self, client: BlockingKernelClient) -> dict[str, Any]:
        """The reply of an empty request that only evaluates our expressions ({} if none came)."""
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


def _reply(client: BlockingKernelClient, msg_id: str) -> dict[str, Any] | None:
    """The shell reply to `msg_id`, skipping replies to requests we gave up on."""
    deadline = time.monotonic() + REPLY_WAIT
    while (left := deadline - time.monotonic()) > 0:
        try:
            msg = client.get_shell_msg(timeout=left)
        except queue.Empty:
            return None
        if msg["parent_header"].get("msg_id") == msg_id:
            content: dict[str, Any] = msg["content"]
            return content
    return None


