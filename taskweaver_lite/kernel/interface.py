"""The `Executor` seam: what a session needs from a kernel, local, sandboxed or on a gateway.

The values a cell produces (`ExecutionResult`, variables) are records (`records/execution.py`); the
Jupyter implementations live beside this module.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from taskweaver_lite.records.execution import ExecutionResult, KernelEnvironment, Variable

# What a running cell prints, as it prints it: (stream name "stdout" or "stderr", text).
OutputSink = Callable[[str, str], None]


class Executor(Protocol):
    """Runs code in a persistent namespace: the seam between the agent and the kernel.

    A session needs nothing else from it: a local, sandboxed or remote kernel is a drop-in.
    """

    @property
    def working_dir(self) -> Path:
        """The folder the code's relative paths resolve to, as a local folder of this process."""
        ...

    def upload(self, source: Path, *, name: str | None = None) -> str:
        """Put a local file into the working folder (as `name`, default its own name); returns that name."""
        ...

    def artifact(self, name: str) -> Path:
        """The local file of an artifact a cell produced; KeyError if there is none."""
        ...

    def run(self, code: str, *, timeout: float | None = None, on_output: OutputSink | None = None) -> ExecutionResult:
        """Run one cell and return what it did; what it prints also goes to `on_output` as it is printed."""
        ...

    def interrupt(self) -> None:
        """Stop the running cell (safe to call from another thread or a signal handler)."""
        ...

    def variables(self) -> tuple[Variable, ...]:
        """The latest snapshot of user variables (from the last cell; no kernel round trip)."""
        ...

    def environment(self) -> KernelEnvironment:
        """The libraries the kernel can import and the folders it sees (waits for a kernel still starting)."""
        ...

    def restart(self) -> tuple[str, ...]:
        """Start a fresh kernel; returns the names of the variables that were lost."""
        ...

    def shutdown(self) -> None:
        """End the kernel and everything it started."""
        ...

    def kept_variables(self) -> bool:
        """Whether the kernel came with the session's variables (one that outlived another process, attached by its id; waits for it)."""
        ...

    def catch_up(self, kernel_id: str | None, *, cells_before: int) -> bool:
        """Go on with this kernel after another process ran `cells_before` cells in it; False when only a fresh load will do."""
        ...

    def start(self) -> None:
        """Start a kernel that waits for its first use (a no-op once started); what refuses it at once is raised here (a gateway's limit)."""
        ...

    def still_there(self) -> bool:
        """False when the kernel, with its variables, went away since the last cell (a gateway ended it or restarted); GatewayError when unreachable."""
        ...

    def known_there(self) -> bool:
        """`still_there` when it can say so without asking anyone (no wait); False when only asking would tell."""
        ...


# Builds a session's executor for its session folder (kernel/choice.py chooses it; opening, resuming and resetting a session call it).
ExecutorFactory = Callable[[Path], Executor]
