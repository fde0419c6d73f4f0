"""The remote executor: a session's kernel on a Jupyter Kernel Gateway or Enterprise Gateway.

`GatewayExecutor` implements the `Executor` protocol like `KernelExecutor` does locally: one execute
request per cell with the variable snapshot in `user_expressions`, timeouts that interrupt, a dead
kernel noticed (the gateway restarts it and says "restarting") with the lost variables named,
output bounded by `CellOutput` (images land in the local session folder). What differs: the
in-kernel helpers are sent as source at start, `/load` streams the file through the kernel in
base64 chunks (a gateway has no file API), and a dropped WebSocket is reopened once per cell.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from taskweaver_lite.config import ExecutionConfig, KernelGatewayConfig
from taskweaver_lite.errors import GatewayConnectionLost, GatewayError, KernelError
from taskweaver_lite.execution import ExecutionError, ExecutionResult, OutputSink, Variable, VariableChanges
from taskweaver_lite.kernel import namespace, remote_code
from taskweaver_lite.kernel.executor import DEFAULT_OUTPUT_TOKENS, INTERRUPT_GRACE, POLL_INTERVAL, REPLY_WAIT
from taskweaver_lite.kernel.gateway import GatewayKernel
from taskweaver_lite.kernel.output import CellOutput, artifact_file
from taskweaver_lite.kernel.process import end_at_exit, forget
from taskweaver_lite.plugins.catalog import PluginSpec
from taskweaver_lite.uploads import UploadError

# Raw bytes per upload request (base64 makes it a third bigger on the wire); requests in flight at once.
UPLOAD_CHUNK = 1024 * 1024
UPLOAD_WINDOW = 4
# Where sessions' folders go, relative to the folder the gateway starts kernels in.
REMOTE_SESSIONS = "taskweaver_sessions"
# What the gateway says when a kernel died ("restarting", "dead" if it gave up) and what a new one
# says when it boots ("starting"): any of them means the variables are gone.
_STATES_OF_DEATH = ("restarting", "dead", "starting")
# Seconds between asking the gateway how a silent cell's kernel is, should its "restarting" message
# have gone astray: two answers in a row that are not "busy" mean the kernel is no longer in our cell.
LIVENESS_CHECK = 2.0
_HOME = "home"
# Seconds to wait for a new kernel's output channel to answer before asking again.
IOPUB_PROBE = 0.2

_Ending = Literal["idle", "died", "stuck", "lost"]


@dataclass
class _Watch:
    """Where one running cell stands: its reply, when it went idle, whether it timed out, its interrupts."""

    msg_id: str
    deadline: float
    next_check: float
    reply: dict[str, Any] | None = None
    idle_at: float | None = None
    replied_at: float | None = None
    timed_out: bool = False
    interrupted_at: float | None = None
    signalled_at: float = 0.0
    quiet: int = 0
    on_output: OutputSink | None = None  # what the cell prints, also sent here as it comes (for the screen)

    def take(self, msg: dict[str, Any], output: CellOutput) -> None:
        """Route one message: ours go to `output` (output), the reply, or the idle clock; others are ignored."""
        if msg.get("parent_header", {}).get("msg_id") != self.msg_id:
            return
        if msg.get("channel") == "shell":
            self.reply = msg["content"]
        elif msg["msg_type"] == "status":
            if msg["content"].get("execution_state") == "idle" and self.idle_at is None:
                self.idle_at = time.monotonic()
        else:
            output.add(msg["msg_type"], msg["content"])
            if self.on_output is not None and msg["msg_type"] == "stream":
                self.on_output(str(msg["content"].get("name", "stdout")), str(msg["content"].get("text", "")))

    def done(self, now: float) -> bool:
        """Idle and replied; or one of the two and the other overdue (its channel dropped it)."""
        if self.idle_at is not None:
            return self.reply is not None or now > self.idle_at + REPLY_WAIT
        if self.reply is not None:
            self.replied_at = self.replied_at or now
            return now > self.replied_at + REPLY_WAIT
        return False


class GatewayExecutor:
    """Runs a session's cells in a kernel that a Jupyter gateway hosts; implements the `Executor` protocol."""

    def __init__(
        self,
        session_dir: Path,
        *,
        config: ExecutionConfig,
        gateway: KernelGatewayConfig,
        output_tokens: int = DEFAULT_OUTPUT_TOKENS,
        plugins: tuple[PluginSpec, ...] = (),
    ) -> None:
        """Prepare the local folders and start the remote kernel in the background; returns at once."""
        self.session_dir = Path(session_dir).resolve()
        self.cwd = self.session_dir / "cwd"
        self.artifacts_dir = self.session_dir / "artifacts"
        self.outputs_dir = self.session_dir / "outputs"
        for folder in (self.cwd, self.artifacts_dir, self.outputs_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.output_tokens = output_tokens
        self.kernel = GatewayKernel(gateway)
        self.home = f"{REMOTE_SESSIONS}/{self.session_dir.name}"  # made absolute by the kernel at start
        self._plugins = plugins
        self.plugin_failures: tuple[str, ...] = ()  # plugins that failed to load in the current kernel, one line each
        self._unreported_failures: tuple[str, ...] = ()
        self._expressions = self._cell_expressions(self.home)
        self._namespace = namespace.VariableTracker()
        self._cell = namespace.last_cell_number(self.outputs_dir, self.artifacts_dir)
        self._start_error: BaseException | None = None
        self._ready = threading.Event()
        self._run_lock = threading.Lock()
        self._running = False
        self._interrupt_requested = False
        self._closed = False
        end_at_exit(self)
        self._starter = threading.Thread(target=self._start, name="gateway-kernel-start", daemon=True)
        self._starter.start()

    @property
    def working_dir(self) -> Path:
        """The local session folder's `cwd` (the kernel's own folder is `home`, on the gateway's machine)."""
        return self.cwd

    def artifact(self, name: str) -> Path:
        """The local file of an image a cell displayed, by its file name; KeyError if there is none."""
        return artifact_file(self.artifacts_dir, name)

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until the remote kernel answers; KernelError (a GatewayError naming the URL) if not."""
        if self._closed:
            raise KernelError("The Python kernel of this session was already shut down.")
        limit = self.config.kernel_start_timeout + REPLY_WAIT if timeout is None else timeout
        if not self._ready.wait(limit):
            raise KernelError(f"The kernel on the gateway {self.kernel.url} is not ready after {limit:g} s.")
        if isinstance(self._start_error, KernelError):
            raise self._start_error
        if self._start_error is not None:
            raise KernelError(f"The kernel on the gateway {self.kernel.url} could not start ({self._start_error}).")

    def run(self, code: str, *, timeout: float | None = None, on_output: OutputSink | None = None) -> ExecutionResult:
        """Run one cell and return what it did (its prints also go to `on_output` as they come); waits for the kernel to start."""
        self.wait_ready()
        with self._run_lock:
            self._check_open()
            lost = self._replaced_since_last_cell()
            result = self._run_cell(code, self.config.timeout if timeout is None else timeout, on_output)
            if lost:
                result = dataclasses.replace(result, kernel_died=True, lost_variables=lost)
            return result

    def interrupt(self) -> None:
        """Stop the running cell through the gateway's REST API; the kernel and its variables stay."""
        if not self._running or self._closed:
            return
        self._interrupt_requested = True
        self.kernel.interrupt()

    def variables(self) -> tuple[Variable, ...]:
        """The latest snapshot of user variables (from the last cell; no kernel round trip)."""
        return self._namespace.variables

    def restart(self) -> tuple[str, ...]:
        """Restart the remote kernel; returns the names of the variables that were lost."""
        self.wait_ready()
        with self._run_lock:
            self._check_open()
            lost = self._namespace.forget()
            self._restart_kernel()
            return lost

    def upload(self, source: Path, *, name: str | None = None) -> str:
        """Stream a local file into the kernel's working folder in base64 chunks; returns its name there."""
        target = Path(name or source.name).name  # a bare name: never outside the folder
        self.wait_ready()
        with self._run_lock:
            self._check_open()
            try:
                self._stream(source, target)
            except GatewayError as exc:
                raise UploadError(f"{source} could not be uploaded to the kernel on the gateway: {exc}") from exc
        return target

    def shutdown(self) -> None:
        """Shut the kernel down on the gateway and close the connection; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        forget(self)
        self._starter.join(self.config.kernel_start_timeout + REPLY_WAIT)
        self.kernel.shutdown()

    def __enter__(self) -> GatewayExecutor:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.shutdown()

    def _check_open(self) -> None:
        if self._closed:
            raise KernelError("The Python kernel of this session was already shut down.")

    def _start(self) -> None:
        try:
            self.kernel.start(env=dict(self.kernel.config.env))
            self.kernel.connect()
            self._initialize()
        except Exception as exc:  # noqa: BLE001 - whatever it is, `wait_ready` reports it in the caller's thread
            self._start_error = exc
        finally:
            self._ready.set()

    def _initialize(self) -> None:
        """Load our helpers into a fresh kernel and move it into the session's folder there."""
        deadline = time.monotonic() + self.config.kernel_start_timeout
        self._await_iopub(deadline)
        start_up = remote_code.start_up(self.home, self.config.display_width, plugins=bool(self._plugins))
        msg_id = self.kernel.execute(start_up, user_expressions={_HOME: remote_code.HOME_EXPRESSION}, silent=True)
        reply = self._reply(msg_id, deadline)
        if reply is None or reply.get("status") != "ok":
            problem = (reply or {}).get("evalue") or "no answer"
            raise GatewayError(f"The kernel on the gateway {self.kernel.url} did not take our start-up code ({problem}).")
        home = _text_value(reply, _HOME)
        if home:
            self.home = home
            self._expressions = self._cell_expressions(home)
        if self._plugins:  # their source travels in the request: the gateway's machine needs none of our files
            code = namespace.plugin_install_code(self._plugins, session_id=self.session_dir.name, cwd=Path(self.home)) + f"{self._cell})"
            installed = self._reply(self.kernel.execute(code, user_expressions=namespace.PLUGIN_FAILURES_EXPRESSION, silent=True), deadline)
            self.plugin_failures = self._unreported_failures = namespace.plugin_failures(installed)

    def _cell_expressions(self, home: str) -> dict[str, str]:
        expressions = namespace.cell_expressions(home)
        if self._plugins:
            expressions.update(namespace.PLUGIN_REPORT_EXPRESSION)
        return expressions

    def _await_iopub(self, deadline: float) -> None:
        """Ask for kernel_info until its status messages come back: output flows again.

        A new kernel's output channel (ZMQ pub/sub, relayed by the gateway) drops what it publishes
        before the gateway's subscription is live: a cell sent too early would run with its output,
        and its "idle", lost.
        """
        while time.monotonic() < deadline:
            msg_id = self.kernel.send("shell", "kernel_info_request", {})
            answered = time.monotonic() + IOPUB_PROBE
            while (left := answered - time.monotonic()) > 0:
                msg = self.kernel.receive(left)
                if msg is not None and msg.get("channel") == "iopub" and msg.get("parent_header", {}).get("msg_id") == msg_id:
                    return
        raise GatewayError(f"The kernel on the gateway {self.kernel.url} did not answer within {self.config.kernel_start_timeout:g} s.")

    def _restart_kernel(self) -> None:
        self._namespace.forget()
        try:
            self.kernel.restart()
            self._initialize()
        except GatewayError as exc:
            raise KernelError(f"The kernel on the gateway could not be restarted: {exc}") from exc

    def _after_death(self) -> None:
        """The gateway restarted a kernel that died: reconnect if need be and load our helpers again."""
        self._namespace.forget()
        try:
            if not self.kernel.connected:
                self.kernel.connect()
            self._initialize()
        except GatewayError:
            self._restart_kernel()  # the gateway's own restart failed ("dead"): ask for one

    def _replaced_since_last_cell(self) -> tuple[str, ...]:
        """Names lost if the kernel died between cells (the gateway said "restarting"); reconnects a dropped socket."""
        died = False
        try:
            if not self.kernel.connected:
                self.kernel.connect()
            while self.kernel.waiting() and (msg := self.kernel.receive(REPLY_WAIT)) is not None:
                died = died or _death(msg)
        except GatewayConnectionLost:
            self.kernel.connect()
        if not died:
            return ()
        lost = self._namespace.names()
        self._after_death()
        return lost

    def _run_cell(self, code: str, timeout: float, on_output: OutputSink | None = None) -> ExecutionResult:
        self._cell += 1
        stem = f"cell-{self._cell:04d}"
        output = CellOutput(
            max_tokens=self.output_tokens, transcript_path=self.outputs_dir / f"{stem}.txt", artifacts_dir=self.artifacts_dir, stem=stem
        )
        self._interrupt_requested = False
        started = time.monotonic()
        msg_id = self.kernel.execute(code, user_expressions=self._expressions)
        self._running = True
        try:
            ending, watch = self._follow(msg_id, output, deadline=started + timeout, on_output=on_output)
        except KeyboardInterrupt:
            self._stop_after_ctrl_c(msg_id, output)
            raise
        finally:
            self._running = False
        interrupted = self._interrupt_requested and not watch.timed_out
        base = dataclasses.replace(output.finish(code), elapsed=time.monotonic() - started, timed_out=watch.timed_out, interrupted=interrupted)
        if ending == "lost":
            return dataclasses.replace(base, success=False, error=_connection_lost(self.kernel.url))
        if ending != "idle":
            lost = self._namespace.names()
            self._after_death() if ending == "died" else self._restart_kernel()
            return dataclasses.replace(base, success=False, kernel_died=True, lost_variables=lost, changes=VariableChanges(deleted=lost))
        return self._finish(base, watch.reply or {})

    def _finish(self, base: ExecutionResult, reply: dict[str, Any]) -> ExecutionResult:
        ok = reply.get("status") == "ok"
        # The kernel skips user_expressions after an error, so only then do they cost a request.
        expressions = reply if ok else (self._reply(self.kernel.execute("", user_expressions=self._expressions, silent=True)) or {})
        changes = self._namespace.take(namespace.snapshot_rows(expressions))
        notices = base.notices + namespace.moved_notice(namespace.moved_from(expressions), self.home)
        logs, saved = namespace.plugin_reports(expressions)
        self.plugin_failures += namespace.plugins_broken(expressions)  # /plugins shows them from now on
        failures = tuple(f"A plugin could not be loaded and is not available: {line}" for line in self._unreported_failures)
        self._unreported_failures = ()
        # A plugin's artifacts stay on the gateway's machine, in the kernel's folder there.
        remote = tuple(f"A plugin saved {path} on the gateway's machine" for path in saved)
        return dataclasses.replace(
            base,
            success=base.success and ok,
            execution_count=reply.get("execution_count"),
            variables=self._namespace.variables,
            changes=changes,
            notices=failures + notices + logs + remote,
        )

    def _follow(self, msg_id: str, output: CellOutput, *, deadline: float, on_output: OutputSink | None = None) -> tuple[_Ending, _Watch]:
        """Feed the cell's output to `output` until the kernel is idle (and has replied), dies, is stuck, or is unreachable."""
        watch = _Watch(msg_id=msg_id, deadline=deadline, next_check=time.monotonic() + LIVENESS_CHECK, on_output=on_output)
        reconnected = False
        while True:
            try:
                msg = self.kernel.receive(POLL_INTERVAL)
            except GatewayConnectionLost:
                if reconnected or not self._reconnect():
                    return "lost", watch
                reconnected, msg = True, None
            if msg is not None and _death(msg):
                return "died", watch
            if msg is not None:
                watch.take(msg, output)
            now = time.monotonic()
            if watch.done(now):
                return "idle", watch
            if self._kernel_left(watch, now):
                return "died", watch
            if self._keep_interrupting(watch, now):
                return "stuck", watch

    def _kernel_left(self, watch: _Watch, now: float) -> bool:
        """Every LIVENESS_CHECK seconds of a silent cell: has the gateway said twice that the kernel is not busy with it?"""
        if watch.idle_at is not None or now < watch.next_check:
            return False
        watch.next_check = now + LIVENESS_CHECK
        watch.quiet = watch.quiet + 1 if self.kernel.state() not in ("busy", "") else 0
        return watch.quiet >= 2

    def _keep_interrupting(self, watch: _Watch, now: float) -> bool:
        """Interrupt at the deadline or when asked, again each second; True once the grace has run out (stuck)."""
        if watch.interrupted_at is None:
            if now >= watch.deadline and not self._interrupt_requested:
                watch.timed_out = True
                self.kernel.interrupt()
            if watch.timed_out or self._interrupt_requested:
                watch.interrupted_at = watch.signalled_at = now
            return False
        if now >= watch.interrupted_at + INTERRUPT_GRACE:
            return True
        if now >= watch.signalled_at + 1.0:
            # An interrupt that lands before the kernel enters the cell is ignored; repeat it.
            watch.signalled_at = now
            self.kernel.interrupt()
        return False

    def _reconnect(self) -> bool:
        """Reopen a dropped socket (the gateway hands over what it buffered meanwhile); False if that fails."""
        try:
            self.kernel.connect()
        except GatewayError:
            return False
        return self.kernel.exists()

    def _stop_after_ctrl_c(self, msg_id: str, output: CellOutput) -> None:
        """Ctrl-C reached us mid-cell: stop the cell, wait for the kernel to settle, keep the snapshot current."""
        self._interrupt_requested = True
        self.kernel.interrupt()
        try:
            ending, _ = self._follow(msg_id, output, deadline=math.inf)
        finally:
            output.close()
        if ending == "idle":
            self._namespace.take(namespace.snapshot_rows(self._reply(self.kernel.execute("", user_expressions=self._expressions, silent=True)) or {}))
        elif ending != "lost":
            self._restart_kernel()

    def _reply(self, msg_id: str, deadline: float | None = None) -> dict[str, Any] | None:
        """The shell reply to `msg_id` (None if none came by `deadline`, default REPLY_WAIT from now)."""
        deadline = time.monotonic() + REPLY_WAIT if deadline is None else deadline
        while (left := deadline - time.monotonic()) > 0:
            msg = self.kernel.receive(min(left, 1.0))
            if msg is None:
                continue
            if _death(msg, booting=False):  # a kernel we just (re)started says "starting": not news
                raise GatewayError(f"The kernel on the gateway {self.kernel.url} died while answering.")
            if msg.get("channel") == "shell" and msg.get("parent_header", {}).get("msg_id") == msg_id:
                content: dict[str, Any] = msg["content"]
                return content
        return None

    def _stream(self, source: Path, target: str) -> None:
        """Write `source` to `<home>/<target>` through the kernel, a few chunks in flight at a time.

        Each chunk rides in `user_expressions` of an empty request: evaluated as one expression, it
        skips IPython's cell transforms, which cost ~0.3 s per megabyte of code.
        """
        partial = f"{target}.part"
        pending = [self.kernel.execute(remote_code.upload_open(partial), user_expressions={}, silent=True)]
        with source.open("rb") as data:
            while chunk := data.read(UPLOAD_CHUNK):
                pending.append(self.kernel.execute("", user_expressions={remote_code.WRITE: remote_code.upload_write(chunk)}, silent=True))
                if len(pending) > UPLOAD_WINDOW:
                    self._confirm(pending.pop(0), target)
        pending.append(self.kernel.execute(remote_code.upload_finish(partial, target), user_expressions={}, silent=True))
        for msg_id in pending:
            self._confirm(msg_id, target)

    def _confirm(self, msg_id: str, target: str) -> None:
        """The kernel's reply to one upload request, checked: GatewayError if it did not write."""
        reply = self._reply(msg_id, time.monotonic() + self.kernel.config.connect_timeout)
        if reply is None:
            raise GatewayError(f"the kernel did not confirm a part of {target} in time")
        written = (reply.get("user_expressions") or {}).get(remote_code.WRITE) or reply
        if written.get("status") != "ok":
            raise GatewayError(f"the kernel could not write {target} ({written.get('ename')}: {written.get('evalue')})")


def _death(msg: dict[str, Any], *, booting: bool = True) -> bool:
    """The kernel died: the gateway is restarting it, or gave up ("dead"), or (`booting`) a new one says "starting"."""
    states = _STATES_OF_DEATH if booting else _STATES_OF_DEATH[:2]
    return msg.get("msg_type") == "status" and msg.get("content", {}).get("execution_state") in states


def _connection_lost(url: str) -> ExecutionError:
    return ExecutionError(
        name="GatewayConnectionLost",
        value=(
            f"The connection to the kernel gateway {url} dropped during this cell and could not be restored, so its "
            "outcome is unknown; the session goes on and the next cell reconnects."
        ),
        traceback="",
    )


def _text_value(reply: dict[str, Any], key: str) -> str:
    """A string the kernel evaluated in `user_expressions` ('' if it failed)."""
    value = (reply.get("user_expressions") or {}).get(key) or {}
    try:
        text = ast.literal_eval(value["data"]["text/plain"])
    except (KeyError, TypeError, ValueError, SyntaxError):
        return ""
    return text if isinstance(text, str) else ""
