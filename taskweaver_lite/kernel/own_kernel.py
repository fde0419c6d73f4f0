"""The analyst's own kernel as an executor: cells run in the IPython shell of this very process.

`%%ask` (notebook/magics.py) runs the agent inside the notebook's kernel, and its code runs there
too, in the shell's own namespace: the names the analyst made are the code's to use (and in the
variable list the prompts carry), and the names the code makes stay for the analyst's next cells.
Nothing confines it: it is their kernel, as when they run a cell themselves.

Each cell goes through `shell.run_cell`, so it is shown as the analyst's cells are: its prints,
tables and plots land in the output of the `%%ask` cell as they come, and a failing cell shows
IPython's own traceback there (as stderr text: an error output would stop "Run all" and papermill
on a step the CodeGenerator then fixed). What it shows is also tapped (the streams, the display publisher,
the result's display hook) into a `CellOutput`, which bounds it for the prompts and saves its plots
as artifacts, as for the other executors. The variable snapshot is `snapshot.py`'s, taken in-process
before and after each cell, so the analyst's own cells between two requests are seen too.

The stop button (SIGINT) stops the running cell: IPython turns it into a KeyboardInterrupt there,
and `run` raises `CellCancelled` with what the cell printed, as Ctrl-C does in the chat. A timeout
(`execution.timeout`) or `interrupt()` sends SIGINT to the thread running the cell. The kernel
itself is never restarted or ended by us: that stays the analyst's.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import dataclasses
import importlib.machinery
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from taskweaver_lite.config.settings import ExecutionConfig
from taskweaver_lite.errors import KernelError
from taskweaver_lite.kernel import namespace
from taskweaver_lite.kernel import snapshot as kernel_snapshot
from taskweaver_lite.kernel.interface import OutputSink
from taskweaver_lite.kernel.output import CellOutput, artifact_file
from taskweaver_lite.kernel.uploads import copy_file
from taskweaver_lite.records.execution import CellCancelled, ExecutionResult, KernelEnvironment, Variable
from taskweaver_lite.safety.workfiles import owner_only_folder
from taskweaver_lite.telemetry import tracing

if TYPE_CHECKING:
    from IPython.core.interactiveshell import ExecutionResult as ShellResult
    from IPython.core.interactiveshell import InteractiveShell

# Seconds between interrupts of a cell past its timeout that does not stop (C code that never checks for signals).
INTERRUPT_EVERY = 1.0
NO_SANDBOX = "none: code runs in this notebook's own kernel, with your permissions, as your own cells do"


class OwnKernelExecutor:
    """The `Executor` over the IPython shell this process runs: the notebook's namespace is the session's."""

    def __init__(self, session_dir: Path, *, shell: InteractiveShell, config: ExecutionConfig, output_tokens: int) -> None:
        """`session_dir` keeps what the cells leave besides the namespace: their full outputs and their plots."""
        self.session_dir = Path(session_dir).resolve()
        self.artifacts_dir = self.session_dir / "artifacts"
        self.outputs_dir = self.session_dir / "outputs"
        for folder in (self.session_dir, self.artifacts_dir, self.outputs_dir):
            owner_only_folder(folder)
        self._shell = shell
        self._config = config
        self._output_tokens = output_tokens
        self._namespace = namespace.VariableTracker()
        self._cell = namespace.last_cell_number(self.outputs_dir, self.artifacts_dir)
        self._libraries: tuple[str, ...] | None = None
        self._lock = threading.Lock()
        self._signal_lock = threading.Lock()  # a signal is sent only while the cell runs
        self._running: int | None = None  # the id of the thread running a cell
        self._interrupt_requested = False
        self._timed_out = False

    @property
    def working_dir(self) -> Path:
        """The kernel's working folder, where the notebook's relative paths resolve (the analyst's `%cd` moves it)."""
        return Path.cwd()

    def upload(self, source: Path, *, name: str | None = None) -> str:
        """Copy a local file into the working folder; returns its name there."""
        target = Path(name or source.name).name
        copy_file(source, self.working_dir, target)
        return target

    def artifact(self, name: str) -> Path:
        """The file of a plot a cell displayed, by its file name; KeyError if there is none."""
        return artifact_file(self.artifacts_dir, name)

    def run(self, code: str, *, timeout: float | None = None, on_output: OutputSink | None = None) -> ExecutionResult:
        """Run one cell in the notebook's namespace; its output shows in the running cell and goes to `on_output` too."""
        tracer = tracing.active()
        if tracer is None:
            return self._run(code, timeout=self._config.timeout if timeout is None else timeout, on_output=on_output)
        with tracing.cell(tracer, session_id=self.session_dir.name, code=code) as cell:
            result = self._run(code, timeout=self._config.timeout if timeout is None else timeout, on_output=on_output)
            cell.finished(result)
        return result

    def _run(self, code: str, *, timeout: float, on_output: OutputSink | None) -> ExecutionResult:
        with self._lock:
            self._cell += 1
            stem = f"cell-{self._cell:04d}"
            output = CellOutput(max_tokens=self._output_tokens, transcript_path=self.outputs_dir / f"{stem}.txt", artifacts_dir=self.artifacts_dir, stem=stem)
            self._namespace.take(self._rows())  # the analyst's cells since the last one: this cell's changes are its own
            started = time.monotonic()
            error = self._run_cell(code, output, on_output, timeout=timeout)
            if error is not None:
                output.add("error", _error_content(error))
            base = output.finish(code)
            changes = self._namespace.take(self._rows())
            stopped = isinstance(error, KeyboardInterrupt)
            result = dataclasses.replace(
                base,
                success=base.success and error is None,
                elapsed=time.monotonic() - started,
                timed_out=stopped and self._timed_out,
                interrupted=stopped and self._interrupt_requested and not self._timed_out,
                variables=self._namespace.variables,
                changes=changes,
            )
            if stopped and not (self._timed_out or self._interrupt_requested):
                raise CellCancelled(dataclasses.replace(result, cancelled=True, interrupted=True))
            return result

    def _run_cell(self, code: str, output: CellOutput, on_output: OutputSink | None, *, timeout: float) -> BaseException | None:
        """Run `code` through the shell with its output tapped; the exception it raised, if any."""
        self._interrupt_requested = self._timed_out = False
        watch = threading.Thread(target=self._watch, args=(time.monotonic() + timeout,), name="cell-timeout", daemon=True)
        outcome: ShellResult | None = None
        try:
            with _tapped(self._shell, output, on_output):
                with self._signal_lock:
                    self._running = threading.get_ident()
                watch.start()
                try:
                    outcome = self._shell.run_cell(code, store_history=False, silent=False)
                finally:
                    with self._signal_lock:
                        self._running = None
        except KeyboardInterrupt as late:  # it came between IPython's own steps rather than in the code
            return late
        if outcome is None:
            return None
        return outcome.error_before_exec or outcome.error_in_exec

    def _watch(self, deadline: float) -> None:
        """Past the deadline, interrupt the cell (again each second, until it stops)."""
        while True:
            with self._signal_lock:
                if self._running is None:
                    return
            left = deadline - time.monotonic()
            if left > 0:
                time.sleep(min(left, 0.1))
                continue
            self._timed_out = True
            self._send_interrupt()
            deadline = time.monotonic() + INTERRUPT_EVERY

    def interrupt(self) -> None:
        """Stop the running cell, if any; the namespace stays (safe from another thread)."""
        with self._signal_lock:
            if self._running is None:
                return
            self._interrupt_requested = True
        self._send_interrupt()

    def _send_interrupt(self) -> None:
        with self._signal_lock:
            thread = self._running
            if thread is None:
                return
            if thread == threading.main_thread().ident:
                # A signal wakes a sleep or a blocking read; Python raises KeyboardInterrupt in the cell.
                signal.pthread_kill(thread, signal.SIGINT)
            else:  # cells run by another thread (not the notebook's way): raised at its next bytecode
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object(KeyboardInterrupt))

    def variables(self) -> tuple[Variable, ...]:
        """The notebook's variables now (read in-process: the analyst's cells since the last step included)."""
        self._namespace.take(self._rows())
        return self._namespace.variables

    def _rows(self) -> list[list[str]] | None:
        return namespace.snapshot_rows({"user_expressions": {namespace.SNAPSHOT: {"status": "ok", "data": {"text/plain": repr(kernel_snapshot.snapshot())}}}})

    def environment(self) -> KernelEnvironment:
        """The analysis libraries this kernel can import, its Python, and that nothing confines it."""
        if self._libraries is None:
            self._libraries = tuple(name for name in namespace.ANALYSIS_LIBRARIES if importlib.machinery.PathFinder.find_spec(name) is not None)
        return KernelEnvironment(libraries=self._libraries, python=f"{sys.executable} (this notebook's kernel)", safety=(("Sandbox", NO_SANDBOX),))

    def restart(self) -> tuple[str, ...]:
        """Refused: the notebook's kernel is the analyst's to restart (Kernel > Restart), variables and all."""
        raise KernelError("The notebook's own kernel is not restarted by the agent: restart it from the notebook (Kernel > Restart) if you mean to.")

    def shutdown(self) -> None:
        """Nothing to end: the kernel and its namespace stay the notebook's."""

    def kept_variables(self) -> bool:
        """True: the notebook's namespace is there, whatever the session's history (nothing is replayed into it)."""
        return True

    def catch_up(self, kernel_id: str | None, *, cells_before: int) -> bool:
        """False: no other process runs cells in this kernel."""
        return False

    def start(self) -> None:
        """Nothing to start: the notebook's kernel already runs."""

    def still_there(self) -> bool:
        """True: the notebook's own kernel is the one running this code."""
        return True

    def known_there(self) -> bool:
        """True, as `still_there`."""
        return True


@contextlib.contextmanager
def _tapped(shell: InteractiveShell, output: CellOutput, on_output: OutputSink | None) -> Iterator[None]:
    """While the cell runs, what it prints and displays still reaches the notebook, and `output` too."""
    publisher, hook = shell.display_pub, shell.displayhook
    publish, write_format_data = publisher.publish, hook.write_format_data

    def published(data: dict[str, Any], metadata: Any = None, *args: Any, **kwargs: Any) -> None:
        publish(data, metadata, *args, **kwargs)
        output.add("update_display_data" if kwargs.get("update") else "display_data", {"data": _encoded(data)})

    def formatted(format_dict: dict[str, Any], md_dict: Any = None) -> None:
        write_format_data(format_dict, md_dict)
        output.add("execute_result", {"data": _encoded(format_dict)})

    streams = sys.stdout, sys.stderr

    def traceback_shown(kind: type[BaseException], error: BaseException, lines: list[str]) -> None:
        # A step's error belongs to the step, not to the cell: written as stderr text, it is no error output,
        # at which "Run all", nbclient and papermill would stop; the request decides how the cell ends.
        streams[1].write(shell.InteractiveTB.stb2text(lines) + "\n")

    sys.stdout, sys.stderr = _Tee(sys.stdout, "stdout", output, on_output), _Tee(sys.stderr, "stderr", output, on_output)
    publisher.publish = published  # type: ignore[method-assign]
    hook.write_format_data = formatted  # type: ignore[method-assign]
    shell._showtraceback = traceback_shown  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = streams
        # The instance attributes go: the classes' own methods show through again.
        for owner, name in ((publisher, "publish"), (hook, "write_format_data"), (shell, "_showtraceback")):
            with contextlib.suppress(AttributeError):
                delattr(owner, name)


class _Tee:
    """A stream that writes to the notebook's own stream and to the cell's collected output."""

    def __init__(self, stream: TextIO, name: str, output: CellOutput, on_output: OutputSink | None) -> None:
        self._stream = stream
        self._name = name
        self._output = output
        self._on_output = on_output

    def write(self, text: str) -> int:
        written = self._stream.write(text)
        if text:
            self._output.add("stream", {"name": self._name, "text": text})
            if self._on_output is not None:
                self._on_output(self._name, text)
        return written

    def __getattr__(self, name: str) -> Any:
        # flush, isatty, encoding, fileno...: the notebook's stream answers.
        return getattr(self._stream, name)


def _encoded(data: dict[str, Any]) -> dict[str, Any]:
    """A MIME bundle as a kernel sends it: images as base64 text (IPython hands PNG and JPEG over as bytes)."""
    return {mime: base64.b64encode(value).decode("ascii") if isinstance(value, bytes) else value for mime, value in data.items()}


def _error_content(error: BaseException) -> dict[str, Any]:
    """What a kernel's error message says of `error`: name, message and the traceback from the cell's own frames on."""
    import IPython

    ipython_dir = str(Path(IPython.__file__ or "").parent)
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(ipython_dir):
        tb = tb.tb_next  # IPython's frames above the cell's code say nothing about it
    lines = traceback.format_exception(type(error), error, tb)
    return {"ename": type(error).__name__, "evalue": str(error), "traceback": ["".join(lines).rstrip()]}
