"""What a session's kernel does wherever it runs: the lifecycle the local and the remote executor share.

`SessionKernel` keeps the session's folders, starts its kernel in a background thread the moment a
session opens, runs one cell at a time as ONE execute request (the variable snapshot rides along in
`user_expressions`), interrupts a cell at its timeout or when asked (again each second, until a
grace runs out), replaces a kernel that died or is stuck and names the variables lost, and shuts
down once. A subclass brings the transport: how the kernel starts, how a request goes out, how the
cell's messages are followed, how the kernel is interrupted, replaced and ended, and how files get
into its working folder (`executor.py` locally, `gateway/remote.py` on a Jupyter gateway).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar

from taskweaver_lite.config.settings import ExecutionConfig
from taskweaver_lite.errors import KernelError
from taskweaver_lite.kernel import namespace
from taskweaver_lite.kernel.interface import OutputSink
from taskweaver_lite.kernel.output import CellOutput, DisplayBudget, artifact_file
from taskweaver_lite.kernel.process import end_at_exit, forget
from taskweaver_lite.records.execution import CellCancelled, CellError, ExecutionResult, KernelEnvironment, Variable, VariableChanges
from taskweaver_lite.records.mcp_tools import McpServer
from taskweaver_lite.records.plugin_spec import PluginSpec
from taskweaver_lite.safety.workfiles import owner_only_folder
from taskweaver_lite.telemetry import tracing

# Seconds between checks of the clock and of the kernel while a cell runs: the bound on how late a
# timeout fires and how long a dead kernel goes unnoticed.
POLL_INTERVAL = 0.1
# An interrupted cell gets this long to unwind (the interrupt is repeated each second) before the
# kernel is replaced; C code that never checks for signals ends up here.
INTERRUPT_GRACE = 5.0
REPLY_WAIT = 5.0
DEFAULT_OUTPUT_TOKENS = 1_000
# The status of a reply to a request the kernel dropped without running it: ipykernel aborts the
# execute requests queued behind a cell that failed with `stop_on_error` set. Ours never set it, but
# another client of the same kernel (a notebook on the same gateway kernel) may.
ABORTED = "aborted"
ABORTED_WORDS = "the kernel dropped the request without running it (it was queued behind another client's cell that failed)"

# How following a cell ended: the kernel went idle, died, would not stop, or could not be reached.
Ending = Literal["idle", "died", "stuck", "lost"]

_Kernel = TypeVar("_Kernel", bound="SessionKernel")


@dataclass(kw_only=True)
class CellWatch:
    """Where one running cell stands against its deadline: whether it timed out, when it was interrupted and last signalled."""

    deadline: float
    timed_out: bool = False
    interrupted_at: float | None = None
    signalled_at: float = 0.0


@dataclass(frozen=True)
class CellEnd:
    """How following a cell ended, the kernel's reply to it (when idle), and the error to report when it was unreachable."""

    ending: Ending
    timed_out: bool
    reply: dict[str, Any] | None = None
    error: CellError | None = None


class SessionKernel(ABC):
    """One session's kernel: the lifecycle of the `Executor` protocol, over a transport its subclass brings."""

    def __init__(self, session_dir: Path, *, config: ExecutionConfig, output_tokens: int, plugins: tuple[PluginSpec, ...]) -> None:
        """Prepare the session folders (`cwd`, `artifacts`, `outputs`) and the state of an unstarted kernel."""
        self.session_dir = Path(session_dir).resolve()
        self.cwd = self.session_dir / "cwd"
        self.artifacts_dir = self.session_dir / "artifacts"
        self.outputs_dir = self.session_dir / "outputs"
        for folder in (self.session_dir, self.cwd, self.artifacts_dir, self.outputs_dir):
            owner_only_folder(folder)  # the conversation's files: no other user (or another session's kernel) may look in
        self.config = config
        self.output_tokens = output_tokens
        self.plugins = plugins
        self.plugin_failures: tuple[str, ...] = ()  # plugins that failed to load in the current kernel, one line each
        self._unreported_failures: tuple[str, ...] = ()
        self._first_notices: tuple[str, ...] = ()  # said with the next cell's result, once
        self.libraries: tuple[str, ...] = ()  # the analysis libraries the current kernel can import (asked at its start)
        self.mcp_servers: tuple[McpServer, ...] = ()  # mcp.servers as the current kernel started them (their tools, or why not)
        self._start_wait = 0.0  # seconds a start may take besides the kernel's own (the MCP servers it starts)
        self._namespace = namespace.VariableTracker()
        self._cell = namespace.last_cell_number(self.outputs_dir, self.artifacts_dir)
        # Images the cells may keep, per cell and in all (execution.display_per_cell, display_per_session).
        self._display = DisplayBudget.for_session(config.display_caps(), self.artifacts_dir)
        self._expressions: dict[str, str] = {}
        self._start_error: BaseException | None = None
        self._ready = threading.Event()
        self._run_lock = threading.Lock()
        self._running = False
        self._interrupt_requested = False
        self._closed = False
        self._starter: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._thread_name = "kernel-start"
        self._claimed = False  # the kernel was asked for (on a gateway: its start accepted) before the start thread ran
        self._ended_why = ""  # set with a kernel found gone between cells that did not die (a gateway ended it): said on the next cell

    def _begin(self, thread_name: str, *, now: bool = True) -> None:
        """Start the kernel in a background thread, or (`now=False`) at its first use (the subclass calls this last in its constructor)."""
        end_at_exit(self)
        self._thread_name = thread_name
        if now:
            with self._start_lock:
                self._starter = threading.Thread(target=self._start, name=thread_name, daemon=True)
                self._starter.start()

    def start(self) -> None:
        """Start a kernel that waits for its first use; what refuses the start at once (a gateway's limit) is raised here. No-op once started."""
        with self._start_lock:
            if self._starter is not None or self._closed:
                return
            self._claim()
            self._claimed = True
            self._starter = threading.Thread(target=self._start, name=self._thread_name, daemon=True)
            self._starter.start()

    def still_there(self) -> bool:
        """True: a local kernel cannot go away unnoticed (a gateway's kernel may: gateway/remote.py)."""
        return True

    def known_there(self) -> bool:
        """True, as `still_there`: nothing to ask."""
        return True

    @property
    def working_dir(self) -> Path:
        """The session's local working folder (`<session>/cwd`)."""
        return self.cwd

    def artifact(self, name: str) -> Path:
        """The local file of an artifact a cell saved (plots), by its file name; KeyError if there is none."""
        return artifact_file(self.artifacts_dir, name)

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until the kernel answers (default limit: the configured start timeout), starting one that waited for its first use; KernelError if not."""
        self._check_open()
        self.start()
        limit = self.config.kernel_start_timeout + REPLY_WAIT + self._start_wait if timeout is None else timeout
        if not self._ready.wait(limit):
            raise KernelError(f"{self._kernel_name()} is not ready after {limit:g} s{self._see_also()}")
        if self._start_error is not None:
            raise self._start_failure(self._start_error)

    def run(self, code: str, *, timeout: float | None = None, on_output: OutputSink | None = None) -> ExecutionResult:
        """Run one cell and return what it did (its prints also go to `on_output` as they come); waits for the kernel to start."""
        tracer = tracing.active()
        if tracer is None:
            return self._run(code, timeout=timeout, on_output=on_output)
        with tracing.cell(tracer, session_id=self.session_dir.name, code=code) as cell:
            result = self._run(code, timeout=timeout, on_output=on_output)
            cell.finished(result)
        return result

    def _run(self, code: str, *, timeout: float | None, on_output: OutputSink | None) -> ExecutionResult:
        self.wait_ready()
        with self._run_lock:
            self._check_open()
            lost = self._lost_since_last_cell()
            with self._cell_limits():
                result = self._run_cell(code, self.config.timeout if timeout is None else timeout, on_output)
            result = self._limits_checked(result)
            if lost is not None:  # died (or was ended) since the last cell, with or without variables: say so on this one
                result = dataclasses.replace(result, kernel_died=True, lost_variables=lost, kernel_ended=self._ended_why)
            self._ended_why = ""
            return result

    def interrupt(self) -> None:
        """Stop the running cell, if any; the kernel and its variables stay."""
        if not self._running or self._closed:
            return
        self._interrupt_requested = True
        self._interrupt_kernel()

    def variables(self) -> tuple[Variable, ...]:
        """The latest snapshot of user variables (from the last cell; no kernel round trip)."""
        return self._namespace.variables

    def environment(self) -> KernelEnvironment:
        """The libraries the kernel can import and the folders it sees; waits for a kernel still starting."""
        with contextlib.suppress(KernelError):  # the next cell says what went wrong; the prompt is built without the list
            self.wait_ready()
        return KernelEnvironment(libraries=self.libraries, mounts=self._mounts(), python=self._python(), safety=self._safety(), mcp_servers=self.mcp_servers)

    def _safety(self) -> tuple[tuple[str, str], ...]:
        """The containment layers and their state, for /info (a gateway's kernel: the gateway's own)."""
        return ()

    def _mounts(self) -> tuple[str, ...]:
        """The user's folders the kernel sees, described for prompts and /info."""
        return ()

    def _python(self) -> str:
        """The kernel's interpreter, described for /info ('' when another machine's)."""
        return ""

    def restart(self) -> tuple[str, ...]:
        """Replace the kernel with a fresh one; returns the names of the variables that were lost."""
        self.wait_ready()
        with self._run_lock:
            self._check_open()
            lost = self._namespace.names()
            self._replace_kernel(graceful=True)
            return lost

    def kept_variables(self) -> bool:
        """False: a kernel started for this session has none of its variables yet (a gateway's attached kernel may)."""
        return False

    def catch_up(self, kernel_id: str | None, *, cells_before: int) -> bool:
        """False: only a kernel that outlives its process (on a gateway) can be caught up on."""
        return False

    def shutdown(self) -> None:
        """End the kernel and everything it started; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        forget(self)
        # A start stuck past its own timeout must not keep the kernel alive: go on and end it.
        if self._starter is not None:
            self._starter.join(self.config.kernel_start_timeout + REPLY_WAIT + self._start_wait)
        self._end()

    def __enter__(self: _Kernel) -> _Kernel:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.shutdown()

    def _check_open(self) -> None:
        if self._closed:
            raise KernelError("The Python kernel of this session was already shut down.")

    def _take_mcp_servers(self, servers: tuple[McpServer, ...]) -> None:
        """The MCP servers a new kernel started: those that did not are told with the next cell, one line each."""
        self.mcp_servers = servers
        self._first_notices += tuple(f"{server.line()}; its tools are not available" for server in servers if not server.started)

    def _start(self) -> None:
        try:
            if not self._claimed:
                self._claim()
            self._launch()
        except Exception as exc:  # noqa: BLE001 - whatever it is, `wait_ready` reports it as a KernelError in the caller's thread
            self._start_error = exc
        finally:
            self._ready.set()

    def _cell_expressions(self, kernel_folder: str) -> dict[str, str]:
        """What every cell's request asks the kernel for: the variables, the working folder put back, plugin reports."""
        expressions = namespace.cell_expressions(kernel_folder)
        if self.plugins:  # what plugins logged and saved during the cell; no cost for sessions without plugins
            expressions.update(namespace.PLUGIN_REPORT_EXPRESSION)
        return expressions

    def _run_cell(self, code: str, timeout: float, on_output: OutputSink | None) -> ExecutionResult:
        self._cell += 1
        stem = f"cell-{self._cell:04d}"
        output = CellOutput(
            max_tokens=self.output_tokens, transcript_path=self.outputs_dir / f"{stem}.txt", artifacts_dir=self.artifacts_dir, stem=stem, display=self._display
        )
        self._interrupt_requested = False
        started = time.monotonic()
        msg_id = ""
        try:
            # A Ctrl-C while the cell is being sent waits until it is sent: raised in between, it left
            # a cell running in the kernel that nobody followed or interrupted (it ran to its end).
            with ctrl_c_deferred():
                msg_id = self._execute(code)
                self._running = True
            end = self._follow(msg_id, output, deadline=started + timeout, on_output=on_output)
        except KeyboardInterrupt:
            if not msg_id:  # nothing was sent
                output.close()
                raise
            partial = self._stop_after_ctrl_c(msg_id, output, code=code)
            if partial is None:
                raise
            kept = dataclasses.replace(partial, success=False, cancelled=True, interrupted=True, elapsed=time.monotonic() - started)
            raise CellCancelled(kept) from None
        except Exception:
            output.close()  # the transport failed (its gateway went away): the error says what became of the cell
            raise
        finally:
            self._running = False
        interrupted = self._interrupt_requested and not end.timed_out
        base = dataclasses.replace(output.finish(code), elapsed=time.monotonic() - started, timed_out=end.timed_out, interrupted=interrupted)
        if end.error is not None:
            return dataclasses.replace(base, success=False, error=end.error)
        if end.ending != "idle":
            lost = self._namespace.names()
            self._recover(end.ending)
            ended, self._ended_why = self._ended_why, ""
            return dataclasses.replace(base, success=False, kernel_died=True, lost_variables=lost, changes=VariableChanges(deleted=lost), kernel_ended=ended)
        return self._finish(base, end.reply or {})

    def _finish(self, base: ExecutionResult, reply: dict[str, Any]) -> ExecutionResult:
        """The cell's result with the kernel's reply: success, the new variable snapshot, notices, plugin reports."""
        ok = reply.get("status") == "ok"
        if reply.get("status") == ABORTED and base.error is None:
            base = dataclasses.replace(base, error=CellError(name="CellNotRun", value=f"The cell did not run: {ABORTED_WORDS}; run it again.", traceback=""))
        # The kernel skips user_expressions after an error, so only then do they cost a request.
        expressions = reply if ok else self._request_expressions()
        changes = self._namespace.take(namespace.snapshot_rows(expressions))
        notices = base.notices + namespace.moved_notice(namespace.moved_from(expressions), self._kernel_folder())
        logs, saved = namespace.plugin_reports(expressions)
        self.plugin_failures += namespace.plugins_broken(expressions)  # /plugins shows them from now on
        failures = self._first_notices + tuple(f"A plugin could not be loaded and is not available: {line}" for line in self._unreported_failures)
        self._unreported_failures = self._first_notices = ()
        plugin_notices, artifacts = self._plugin_artifacts(saved)
        notices += self._explain(base.error)
        return dataclasses.replace(
            base,
            success=base.success and ok,
            execution_count=reply.get("execution_count"),
            variables=self._namespace.variables,
            changes=changes,
            notices=failures + notices + logs + plugin_notices,
            artifacts=base.artifacts + artifacts,
        )

    def _keep_interrupting(self, watch: CellWatch, now: float) -> bool:
        """Interrupt at the deadline or when asked, again each second; True once the grace has run out (stuck)."""
        if watch.interrupted_at is None:
            if now >= watch.deadline and not self._interrupt_requested:
                watch.timed_out = True
                self._interrupt_kernel()
            if watch.timed_out or self._interrupt_requested:
                watch.interrupted_at = watch.signalled_at = now
            return False
        if now >= watch.interrupted_at + INTERRUPT_GRACE:
            return True
        if now >= watch.signalled_at + 1.0:
            # An interrupt that lands before the kernel enters the cell is ignored; repeat it.
            watch.signalled_at = now
            self._interrupt_kernel()
        return False

    def _stop_after_ctrl_c(self, msg_id: str, output: CellOutput, *, code: str) -> ExecutionResult | None:
        """Ctrl-C reached us mid-cell: stop the cell, wait for the kernel to settle, keep the snapshot current.

        Returns what the cell printed until it stopped (None when a second Ctrl-C cut the wait short).
        """
        self._interrupt_requested = True
        self._interrupt_kernel()
        try:
            end = self._follow(msg_id, output, deadline=math.inf)
        except BaseException:
            output.close()
            raise
        partial = output.finish(code)
        if end.ending == "idle":
            self._namespace.take(namespace.snapshot_rows(self._request_expressions()))
        elif end.ending != "lost":
            # It did not stop, or the kernel died: it is replaced, and the result says what went with it.
            lost = self._namespace.names()
            self._recover(end.ending)
            return dataclasses.replace(partial, kernel_died=True, lost_variables=lost, changes=VariableChanges(deleted=lost))
        return partial

    def _explain(self, error: CellError | None) -> tuple[str, ...]:
        """Notes on a cell's error that only the transport can give (a path the sandbox hides)."""
        return ()

    def _cell_limits(self) -> contextlib.AbstractContextManager[object]:
        """What is kept while a cell runs besides its timeout (the local kernel's disk limit); nothing here."""
        return contextlib.nullcontext()

    def _limits_checked(self, result: ExecutionResult) -> ExecutionResult:
        """The cell's result with what `_cell_limits` found (a limit reached); unchanged here."""
        return result

    def _plugin_artifacts(self, saved: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Notices and artifacts for what plugins saved during a cell: locally they are the session's artifacts."""
        return (), saved

    @abstractmethod
    def _kernel_name(self) -> str:
        """How messages name the kernel ("The Python kernel", "The kernel on the gateway ...")."""

    def _see_also(self) -> str:
        """What a message about a failed start adds: where to read more ("; see <log>")."""
        return ""

    @abstractmethod
    def _start_failure(self, error: BaseException) -> KernelError:
        """The KernelError `wait_ready` raises for what went wrong in the start thread."""

    @abstractmethod
    def _kernel_folder(self) -> str:
        """The kernel's working folder as the kernel names it (a cell that leaves it is put back there)."""

    def _claim(self) -> None:  # noqa: B027 - nothing to claim for a local kernel; a gateway's start request is one
        """The part of a start that may be refused at once (a gateway's start request); run by `start` in the caller's thread, else in the start thread."""

    @abstractmethod
    def _launch(self) -> None:
        """Start the kernel and connect to it (in the start thread, after `_claim`)."""

    @abstractmethod
    def _execute(self, code: str) -> str:
        """Send one cell with the snapshot expressions; returns the request's message id."""

    @abstractmethod
    def _follow(self, msg_id: str, output: CellOutput, *, deadline: float, on_output: OutputSink | None = None) -> CellEnd:
        """Feed the cell's messages to `output` (prints also to `on_output`) until the kernel is idle, dead, stuck or unreachable."""

    @abstractmethod
    def _request_expressions(self) -> dict[str, Any]:
        """The reply of an empty request that only evaluates the snapshot expressions ({} if none came)."""

    @abstractmethod
    def _interrupt_kernel(self) -> None:
        """Send the kernel one interrupt."""

    @abstractmethod
    def _lost_since_last_cell(self) -> tuple[str, ...] | None:
        """Names of the variables lost if the kernel died since the last cell (it is replaced first); None if it did not."""

    @abstractmethod
    def _replace_kernel(self, *, graceful: bool) -> None:
        """A fresh kernel in place of the current one (the namespace forgotten); KernelError if none can be had."""

    @abstractmethod
    def _recover(self, ending: Ending) -> None:
        """Get a working kernel after a cell left it dead or stuck."""

    @abstractmethod
    def _end(self) -> None:
        """End the kernel and release the connection (shutdown's transport part)."""


def reply_problem(reply: dict[str, Any] | None) -> str:
    """Why a request's reply is not "ok", in words: the error it names, that the kernel dropped it unrun, or that none came."""
    if reply is None:
        return "no answer"
    if reply.get("status") == ABORTED:
        return ABORTED_WORDS
    return f"{reply.get('ename', 'an error')}: {reply.get('evalue', '')}"


@contextlib.contextmanager
def ctrl_c_deferred() -> Iterator[None]:
    """Ctrl-C (SIGINT) inside the block is raised as KeyboardInterrupt when the block ends, not midway.

    Only the main thread receives signals, and only a handler of Python's own default is replaced;
    elsewhere the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    pressed: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if pressed:
        raise KeyboardInterrupt


def show(msg: dict[str, Any], output: CellOutput, on_output: OutputSink | None) -> None:
    """One output message of the running cell: into its bounded output, and what it prints to `on_output` too."""
    output.add(msg["msg_type"], msg["content"])
    if on_output is not None and msg["msg_type"] == "stream":
        on_output(str(msg["content"].get("name", "stdout")), str(msg["content"].get("text", "")))
