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
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskweaver_lite.config.settings import ExecutionConfig, KernelGatewayConfig
from taskweaver_lite.errors import GatewayConnectionLost, GatewayError, GatewayUnreachableError, KernelError
from taskweaver_lite.kernel import namespace
from taskweaver_lite.kernel.base import (
    ABORTED,
    ABORTED_WORDS,
    DEFAULT_OUTPUT_TOKENS,
    POLL_INTERVAL,
    REPLY_WAIT,
    CellEnd,
    CellWatch,
    Ending,
    SessionKernel,
    reply_problem,
    show,
)
from taskweaver_lite.kernel.gateway import remote_code
from taskweaver_lite.kernel.gateway.kernel import GONE, GatewayKernel
from taskweaver_lite.kernel.gateway.provisioner import OWNER_VARIABLE, SESSION_VARIABLE, USER_NAME_VARIABLE
from taskweaver_lite.kernel.interface import OutputSink
from taskweaver_lite.kernel.output import CellOutput
from taskweaver_lite.kernel.uploads import UploadError
from taskweaver_lite.records.execution import CellError
from taskweaver_lite.records.plugin_spec import PluginSpec

# Raw bytes per upload request (base64 makes it a third bigger on the wire); requests in flight at once.
UPLOAD_CHUNK = 1024 * 1024
UPLOAD_WINDOW = 4
# Tries at an upload whose parts the kernel dropped unrun (each try is sent whole).
UPLOAD_ATTEMPTS = 3
# Where sessions' folders go, relative to the folder the gateway starts kernels in.
REMOTE_SESSIONS = "taskweaver_sessions"
# What the gateway says when a kernel died ("restarting", "dead" if it gave up) and what a new one
# says when it boots ("starting"): any of them means the variables are gone.
_STATES_OF_DEATH = ("restarting", "dead", "starting")
# Seconds between asking the gateway how a silent cell's kernel is, should its "restarting" message
# have gone astray: two answers in a row that are not "busy" mean the kernel is no longer in our cell.
LIVENESS_CHECK = 2.0
_HOME = "home"
ENDED_WHILE_IDLE = (
    "The session's kernel was no longer on the gateway, which ends idle kernels (culled after gateway.cull_idle_timeout, "
    "or to make room for another of its user's sessions under gateway.max_kernels_per_user)"
)
# Seconds without a cell after which the next one first asks whether the gateway still has the kernel (it may have culled it).
GONE_CHECK = 30.0
# Seconds to wait for a new kernel's output channel to answer before asking again.
IOPUB_PROBE = 0.2


@dataclass(frozen=True)
class KernelHandover:
    """How a session's kernel outlives one replica: the id of a kernel to attach to, whether to leave it running, who hears a new id."""

    reuse: str | None = None  # a kernel the gateway already runs for this session (its id from the store)
    keep: bool = False  # on shutdown only disconnect: another replica attaches to it next
    on_start: Callable[[str], None] | None = None  # told the id of a kernel started here (to store it)
    cells_before: int = 0  # cells the session ran elsewhere: numbering goes on after them (artifact names stay unique)
    owner: str | None = None  # the session's user: sent as KERNEL_USERNAME (our gateway counts kernels by it; Enterprise Gateway runs the kernel as them)
    owner_name: str | None = None  # how the gateway's log and metrics name that user (the owner is an id)
    at_first_use: bool = False  # start the kernel at the session's first use (`start`), not when the session opens: a session never used costs none


@dataclass(kw_only=True)
class _Watch(CellWatch):
    """Where one running cell stands: its deadline and interrupts, its reply, when it went idle, the gateway's answers."""

    msg_id: str
    next_check: float
    reply: dict[str, Any] | None = None
    idle_at: float | None = None
    replied_at: float | None = None
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
            show(msg, output, self.on_output)

    def done(self, now: float) -> bool:
        """Idle and replied; or one of the two and the other overdue (its channel dropped it)."""
        if self.idle_at is not None:
            return self.reply is not None or now > self.idle_at + REPLY_WAIT
        if self.reply is not None:
            self.replied_at = self.replied_at or now
            return now > self.replied_at + REPLY_WAIT
        return False


class GatewayExecutor(SessionKernel):
    """Runs a session's cells in a kernel that a Jupyter gateway hosts; implements the `Executor` protocol."""

    def __init__(
        self,
        session_dir: Path,
        *,
        config: ExecutionConfig,
        gateway: KernelGatewayConfig,
        output_tokens: int = DEFAULT_OUTPUT_TOKENS,
        plugins: tuple[PluginSpec, ...] = (),
        kernel: KernelHandover = KernelHandover(),
    ) -> None:
        """Prepare the local folders and start the remote kernel (or attach to `kernel.reuse`) in the background; returns at once."""
        super().__init__(session_dir, config=config, output_tokens=output_tokens, plugins=plugins)
        self.kernel = GatewayKernel(gateway)
        self.handover = kernel
        self._cell = max(self._cell, kernel.cells_before)
        self._last_cell = time.monotonic()  # when the last cell was sent: after GONE_CHECK idle seconds, the next asks whether the kernel is still there
        self.attached = False  # the kernel of `handover.reuse` was found with our helpers (and the session's variables) in it
        self.home = f"{REMOTE_SESSIONS}/{self.session_dir.name}"  # made absolute by the kernel at start
        self._expressions = self._cell_expressions(self.home)
        self._attaching = False  # `_claim` found the session's kernel of `handover.reuse` still on the gateway
        self._begin("gateway-kernel-start", now=not kernel.at_first_use)

    def kept_variables(self) -> bool:
        """Whether the kernel came with the session's variables (attached to one that outlived its replica); waits for it."""
        try:
            self.wait_ready()
        except KernelError:
            return False
        return self.attached

    def catch_up(self, kernel_id: str | None, *, cells_before: int) -> bool:
        """Go on with this kernel after another replica ran cells in it: its variables read again, its numbering after theirs.

        What the other replica's cells sent to this connection meanwhile is dropped unread, and its
        output channel is seen to answer before the next cell: the request for the variables is the
        probe (its status messages come back on that channel), and only when they do not come is the
        channel asked again until it answers. False when this is not the session's kernel any more
        (`kernel_id`, from the store), when it does not answer, or when our helpers are gone from it:
        the session must then be loaded afresh.
        """
        if kernel_id is None or kernel_id != self.kernel.kernel_id or not self._ready.is_set() or self._start_error is not None:
            return False
        with self._run_lock:
            if self._closed:
                return False
            try:
                if self.kernel.connected:
                    with contextlib.suppress(GatewayConnectionLost):  # the gateway closed it: an idle copy answers no pings
                        self.kernel.drop_waiting()
                if not self.kernel.connected:
                    self.kernel.connect()
                asked = {k: v for k, v in namespace.cell_expressions(".").items() if k != namespace.CWD}
                reply, heard = self._listen(self.kernel.execute("", user_expressions=asked, silent=True), hear=True)
                if not heard:
                    # The kernel may have died and been restarted there: this connection's output channel then
                    # reconnects to the new one in its own time, and a cell sent before it has would lose its output.
                    self._await_iopub(time.monotonic() + self.config.kernel_start_timeout)
            except GatewayError:
                return False
            rows = namespace.snapshot_rows(reply or {})
            if rows is None:
                return False
            self._namespace.take(rows)
            self._cell = max(self._cell, cells_before)
            return True

    @property
    def kernel_id(self) -> str | None:
        """The gateway's id of the session's kernel (None before it started)."""
        return self.kernel.kernel_id

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

    def _kernel_name(self) -> str:
        return f"The kernel on the gateway {self.kernel.url}"

    def _start_failure(self, error: BaseException) -> KernelError:
        if isinstance(error, KernelError):
            return error
        return KernelError(f"The kernel on the gateway {self.kernel.url} could not start ({error}).")

    def _kernel_folder(self) -> str:
        return self.home

    def _end(self) -> None:
        if self.handover.keep:
            self.kernel.release()  # the session goes on elsewhere: its kernel stays on the gateway
        else:
            self.kernel.shutdown()

    def _claim(self) -> None:
        """Attach to the session's kernel if the gateway still has it, else ask for a new one (refused at once past the gateway's limit)."""
        wanted = self.handover.reuse
        self._attaching = wanted is not None and self.kernel.attach(wanted)
        if not self._attaching:
            self._new_kernel()

    def _launch(self) -> None:
        self.kernel.connect()
        if self._attaching:
            self.attached = self._reattach()
            if not self.attached:
                self._initialize()  # the gateway restarted it since (our helpers and the variables are gone)
            return
        self._initialize()

    def still_there(self) -> bool:
        """Whether the session's kernel is still on the gateway (False: culled, ended for room, or the gateway restarted; its variables are gone).

        True for a kernel not started yet, or still starting: there is nothing to lose. Raises
        GatewayUnreachableError when the gateway does not answer.

        A cell sent within GONE_CHECK seconds on a connection still open and silent answers without
        asking the gateway: a kernel it ends (culled, ended for room, restarted) says so on the
        connection first (its status messages), and a gateway that stops closes it; either leaves
        something to read, and the gateway is asked then.
        """
        return self.known_there() or self.kernel.present()

    def known_there(self) -> bool:
        """`still_there` without asking the gateway: False when only asking would tell."""
        if not self._ready.is_set() or self._start_error is not None or self.kernel.kernel_id is None or self._closed:
            return True
        return time.monotonic() - self._last_cell < GONE_CHECK and self.kernel.connected and not self.kernel.waiting()

    def _new_kernel(self) -> None:
        """Ask the gateway for a new kernel for the session; its id is told as the first one's was."""
        self.kernel.start(env=self._start_environment())
        if self.handover.on_start is not None and self.kernel.kernel_id is not None:
            self.handover.on_start(self.kernel.kernel_id)

    def _start_environment(self) -> dict[str, str]:
        """The start request's variables: the configured ones, the session's id (its folder on our gateway), its owner."""
        env = {**self.kernel.config.env, SESSION_VARIABLE: self.session_dir.name}
        if self.handover.owner is not None:
            env[OWNER_VARIABLE] = self.handover.owner
        if self.handover.owner_name is not None:
            env[USER_NAME_VARIABLE] = self.handover.owner_name
        return env

    def _reattach(self) -> bool:
        """Read the working folder, the libraries and the variables of a kernel our helpers already run in; False if they do not."""
        deadline = time.monotonic() + self.config.kernel_start_timeout
        self._settle_orphan(deadline)
        self._await_iopub(deadline)
        asked = {_HOME: remote_code.HOME_EXPRESSION, **namespace.LIBRARIES_EXPRESSION, **namespace.cell_expressions(".")}
        reply = self._reply(self.kernel.execute("", user_expressions={k: v for k, v in asked.items() if k != namespace.CWD}, silent=True), deadline)
        rows = namespace.snapshot_rows(reply or {})
        home = _text_value(reply or {}, _HOME)
        if rows is None or not home:
            return False
        self.home = home
        self._expressions = self._cell_expressions(home)
        self.libraries = namespace.importable_libraries(reply)
        self._namespace.take(rows)
        return True

    def _initialize(self) -> None:
        """Load our helpers into a fresh kernel and move it into the session's folder there."""
        deadline = time.monotonic() + self.config.kernel_start_timeout
        self._await_iopub(deadline)
        start_up = remote_code.start_up(self.home, self.config.display_width, plugins=bool(self.plugins))
        # The same request asks which analysis libraries the gateway's kernel can import.
        msg_id = self.kernel.execute(start_up, user_expressions={_HOME: remote_code.HOME_EXPRESSION, **namespace.LIBRARIES_EXPRESSION}, silent=True)
        reply = self._reply(msg_id, deadline)
        if reply is None or reply.get("status") != "ok":
            raise GatewayError(f"The kernel on the gateway {self.kernel.url} did not take our start-up code ({reply_problem(reply)}).")
        self.libraries = namespace.importable_libraries(reply)
        home = _text_value(reply, _HOME)
        if home:
            self.home = home
            self._expressions = self._cell_expressions(home)
        if self.plugins:  # their source travels in the request: the gateway's machine needs none of our files
            code = namespace.plugin_install_code(self.plugins, session_id=self.session_dir.name, cwd=Path(self.home)) + f"{self._cell})"
            installed = self._reply(self.kernel.execute(code, user_expressions=namespace.PLUGIN_FAILURES_EXPRESSION, silent=True), deadline)
            self.plugin_failures = self._unreported_failures = namespace.plugin_failures(installed)

    def _settle_orphan(self, deadline: float) -> None:
        """A cell whose replica died may still run in the kernel: interrupt it (its variables so far stay) and wait until idle."""
        while self.kernel.state() == "busy" and time.monotonic() < deadline:
            self.kernel.interrupt()
            time.sleep(POLL_INTERVAL * 5)

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

    def _replace_kernel(self, *, graceful: bool) -> None:
        """Ask the gateway to restart the kernel (it has no gentler way) and load our helpers into the new one."""
        self._namespace.forget()
        try:
            if self.kernel.state() == GONE:  # nothing left to restart
                self._start_afresh()
                return
            self.kernel.restart()
            self._initialize()
        except GatewayError as exc:
            raise KernelError(f"The kernel on the gateway could not be restarted: {exc}") from exc

    def _recover(self, ending: Ending) -> None:
        if ending == "died":
            self._after_death()
        else:
            self._replace_kernel(graceful=False)

    def _after_death(self) -> None:
        """The gateway restarted a kernel that died (or ended it: a new one is started): reconnect if need be and load our helpers again."""
        self._namespace.forget()
        try:
            if self.kernel.state() == GONE:
                self._ended_why = ENDED_WHILE_IDLE
                self._start_afresh()
                return
            if not self.kernel.connected:
                self.kernel.connect()
            self._initialize()
        except GatewayError:
            self._replace_kernel(graceful=False)  # the gateway's own restart failed ("dead"): ask for one

    def _lost_since_last_cell(self) -> tuple[str, ...] | None:
        """Names lost if the kernel died between cells (the gateway said "restarting"), else None; reconnects a dropped socket."""
        died = False
        if time.monotonic() - self._last_cell > GONE_CHECK and self.kernel.state() == GONE:
            return self._replaced_gone_kernel()
        try:
            if not self.kernel.connected:
                self.kernel.connect()
            while self.kernel.waiting() and (msg := self.kernel.receive(REPLY_WAIT)) is not None:
                died = died or _death(msg)
        except GatewayError:
            if self.kernel.state() == GONE:
                return self._replaced_gone_kernel()
            self.kernel.connect()
        if not died:
            return None
        lost = self._namespace.names()
        self._after_death()
        return lost

    def _replaced_gone_kernel(self) -> tuple[str, ...]:
        """The gateway has no kernel of that id any more (culled, or ended to make room for its user's next one): a new one; the lost names."""
        lost = self._namespace.names()
        self._ended_why = ENDED_WHILE_IDLE
        self._start_afresh()
        return lost

    def _start_afresh(self) -> None:
        """A new kernel for the session, its id told as the first one's was; the old one's variables are gone."""
        self._namespace.forget()
        self.kernel.disconnect()
        self._new_kernel()
        self.kernel.connect()
        self._initialize()

    def _execute(self, code: str) -> str:
        self._last_cell = time.monotonic()
        return self.kernel.execute(code, user_expressions=self._expressions)

    def _request_expressions(self) -> dict[str, Any]:
        return self._reply(self.kernel.execute("", user_expressions=self._expressions, silent=True)) or {}

    def _interrupt_kernel(self) -> None:
        self.kernel.interrupt()

    def _plugin_artifacts(self, saved: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        # A plugin's artifacts stay on the gateway's machine, in the kernel's folder there.
        return tuple(f"A plugin saved {path} on the gateway's machine" for path in saved), ()

    def _follow(self, msg_id: str, output: CellOutput, *, deadline: float, on_output: OutputSink | None = None) -> CellEnd:
        """Feed the cell's output to `output` until the kernel is idle (and has replied), dies, is stuck, or is unreachable."""
        watch = _Watch(msg_id=msg_id, deadline=deadline, next_check=time.monotonic() + LIVENESS_CHECK, on_output=on_output)
        reconnected = False
        while True:
            try:
                msg = self.kernel.receive(POLL_INTERVAL)
            except GatewayConnectionLost:
                if reconnected or not self._reconnect():
                    if not self._gateway_answers():
                        return CellEnd("died", watch.timed_out)
                    return CellEnd("lost", watch.timed_out, error=_connection_lost(self.kernel.url))
                reconnected, msg = True, None
            if msg is not None and _death(msg):
                return CellEnd("died", watch.timed_out)
            if msg is not None:
                watch.take(msg, output)
            now = time.monotonic()
            if watch.done(now):
                return CellEnd("idle", watch.timed_out, reply=watch.reply)
            if self._kernel_left(watch, now):
                return CellEnd("died", watch.timed_out)
            if self._keep_interrupting(watch, now):
                return CellEnd("stuck", watch.timed_out)

    def _kernel_left(self, watch: _Watch, now: float) -> bool:
        """Every LIVENESS_CHECK seconds of a silent cell: has the gateway said twice that the kernel is not busy with it?"""
        if watch.idle_at is not None or now < watch.next_check:
            return False
        watch.next_check = now + LIVENESS_CHECK
        watch.quiet = watch.quiet + 1 if self.kernel.state() not in ("busy", "") else 0  # "gone" too: nothing runs our cell
        return watch.quiet >= 2

    def _gateway_answers(self) -> bool:
        """After a connection that could not be restored: whether the gateway still has the kernel (False: it has not).

        A gateway that does not answer at all ends the request: GatewayUnreachableError, and the
        cell's outcome is unknown. Nothing the model could write would run until it is back.
        """
        try:
            return self.kernel.present()
        except GatewayUnreachableError as exc:
            raise GatewayUnreachableError(
                f"The kernel gateway {self.kernel.url} stopped answering during this cell, so its outcome is unknown; "
                "send the request again once the gateway is back (the session's variables are rebuilt by replaying its cells)."
            ) from exc

    def _reconnect(self) -> bool:
        """Reopen a dropped socket (the gateway hands over what it buffered meanwhile); False if that fails."""
        try:
            self.kernel.connect()
        except GatewayError:
            return False
        return self.kernel.exists()

    def _reply(self, msg_id: str, deadline: float | None = None) -> dict[str, Any] | None:
        """The shell reply to `msg_id` (None if none came by `deadline`, default REPLY_WAIT from now)."""
        return self._listen(msg_id, deadline)[0]

    def _listen(self, msg_id: str, deadline: float | None = None, *, hear: bool = False) -> tuple[dict[str, Any] | None, bool]:
        """The shell reply to `msg_id` (None if none came by `deadline`, default REPLY_WAIT from now), and whether its status came on the output channel.

        With `hear`, the status is waited for up to IOPUB_PROBE past the reply (the kernel says
        "busy" before it replies and "idle" after); without, the reply ends the wait.
        """
        deadline = time.monotonic() + REPLY_WAIT if deadline is None else deadline
        reply: dict[str, Any] | None = None
        heard = False
        while not (reply is not None and (heard or not hear)) and (left := deadline - time.monotonic()) > 0:
            msg = self.kernel.receive(min(left, 1.0))
            if msg is None:
                continue
            if _death(msg, booting=False):  # a kernel we just (re)started says "starting": not news
                raise GatewayError(f"The kernel on the gateway {self.kernel.url} died while answering.")
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg.get("channel") == "shell":
                reply = msg["content"]
                deadline = min(deadline, time.monotonic() + IOPUB_PROBE)
            elif msg.get("channel") == "iopub":
                heard = True
        return reply, heard

    def _stream(self, source: Path, target: str) -> None:
        """Write `source` to `<home>/<target>` through the kernel; started over when the kernel dropped a part of it unrun.

        A request the kernel aborted (queued behind another client's failing cell) was not run, and
        the parts after it may then have run against a file that was never opened: the whole upload is
        sent again, up to UPLOAD_ATTEMPTS times.
        """
        for _ in range(UPLOAD_ATTEMPTS):
            if self._send_upload(source, target):
                return
        raise GatewayError(f"{ABORTED_WORDS}, {UPLOAD_ATTEMPTS} times in a row, while writing {target}")

    def _send_upload(self, source: Path, target: str) -> bool:
        """One try at the upload, a few chunks in flight at a time; False when the kernel dropped a part of it unrun.

        Each chunk rides in `user_expressions` of an empty request: evaluated as one expression, it
        skips IPython's cell transforms, which cost ~0.3 s per megabyte of code.
        """
        partial = f"{target}.part"
        pending = [self.kernel.execute(remote_code.upload_open(partial), user_expressions={}, silent=True)]
        dropped = False
        with source.open("rb") as data:
            while chunk := data.read(UPLOAD_CHUNK):
                pending.append(self.kernel.execute("", user_expressions={remote_code.WRITE: remote_code.upload_write(chunk)}, silent=True))
                if len(pending) > UPLOAD_WINDOW:
                    dropped = self._dropped(pending.pop(0), target, after_drop=dropped) or dropped
        pending.append(self.kernel.execute(remote_code.upload_finish(partial, target), user_expressions={}, silent=True))
        for msg_id in pending:
            dropped = self._dropped(msg_id, target, after_drop=dropped) or dropped
        return not dropped

    def _dropped(self, msg_id: str, target: str, *, after_drop: bool = False) -> bool:
        """The kernel's reply to one upload request, checked: True if it was dropped unrun, GatewayError if it did not write.

        After a dropped part (`after_drop`) a failure is expected (nothing was opened to write to)
        and only the reply is waited for: the upload is sent again.
        """
        reply = self._reply(msg_id, time.monotonic() + self.kernel.config.connect_timeout)
        if reply is None:
            raise GatewayError(f"the kernel did not confirm a part of {target} in time")
        if reply.get("status") == ABORTED:
            return True
        written = (reply.get("user_expressions") or {}).get(remote_code.WRITE) or reply
        if written.get("status") != "ok" and not after_drop:
            raise GatewayError(f"the kernel could not write {target} ({reply_problem(written)})")
        return False


def _death(msg: dict[str, Any], *, booting: bool = True) -> bool:
    """The kernel died: the gateway is restarting it, or gave up ("dead"), or (`booting`) a new one says "starting"."""
    states = _STATES_OF_DEATH if booting else _STATES_OF_DEATH[:2]
    return msg.get("msg_type") == "status" and msg.get("content", {}).get("execution_state") in states


def _connection_lost(url: str) -> CellError:
    """The error a cell gets when the gateway could not be reached again during it."""
    return CellError(
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
