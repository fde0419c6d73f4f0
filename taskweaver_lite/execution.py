"""What running a cell produces: `ExecutionResult`, variable snapshots, and the `Executor` seam.

These are plain values with an explicit JSON shape (`to_dict`/`from_dict`) so that the
conversation, the prompts, compression and the store all read the same thing. The Jupyter
implementation lives in `kernel.py`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Variable:
    """One user variable as the kernel holds it."""

    name: str
    type: str
    description: str

    def to_dict(self) -> dict[str, str]:
        """JSON shape: {name, type, description}."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Variable:
        """Inverse of `to_dict`."""
        return cls(name=str(data["name"]), type=str(data["type"]), description=str(data["description"]))


@dataclass(frozen=True)
class VariableChanges:
    """How a snapshot differs from the one before it."""

    created: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.created or self.changed or self.deleted)

    def to_dict(self) -> dict[str, list[str]]:
        """JSON shape: {created, changed, deleted} as lists of names."""
        return {"created": list(self.created), "changed": list(self.changed), "deleted": list(self.deleted)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VariableChanges:
        """Inverse of `to_dict`."""
        return cls(tuple(data.get("created", ())), tuple(data.get("changed", ())), tuple(data.get("deleted", ())))


@dataclass(frozen=True)
class ExecutionError:
    """The exception a cell raised, traceback without ANSI colour codes."""

    name: str
    value: str
    traceback: str

    def to_dict(self) -> dict[str, str]:
        """JSON shape: {name, value, traceback}."""
        return asdict(self)


@dataclass(frozen=True)
class ExecutionResult:
    """Everything one cell did, with text already bounded for prompts.

    `stdout`, `stderr`, `result` and `displays` are cut to the configured budget (head and tail
    kept, with a marker saying how much was left out); `full_output_path` names the file holding
    the complete output whenever anything was cut.
    """

    code: str
    success: bool
    stdout: str = ""
    stderr: str = ""
    result: str | None = None
    result_html: str | None = None
    error: ExecutionError | None = None
    displays: tuple[str, ...] = ()
    artifacts: tuple[str, ...] = ()
    elapsed: float = 0.0
    timed_out: bool = False
    interrupted: bool = False
    kernel_died: bool = False
    lost_variables: tuple[str, ...] = ()
    full_output_path: str | None = None
    variables: tuple[Variable, ...] = ()
    changes: VariableChanges = field(default_factory=VariableChanges)
    execution_count: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON shape used by the store and by export."""
        data = asdict(self)
        data["variables"] = [v.to_dict() for v in self.variables]
        data["changes"] = self.changes.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExecutionResult:
        """Inverse of `to_dict`."""
        values = dict(data)
        err = values.get("error")
        values["error"] = ExecutionError(**err) if err else None
        values["variables"] = tuple(Variable.from_dict(v) for v in values.get("variables", ()))
        values["changes"] = VariableChanges.from_dict(values.get("changes") or {})
        for name in ("displays", "artifacts", "lost_variables"):
            values[name] = tuple(values.get(name) or ())
        return cls(**values)

    def summary_text(self) -> str:
        """The result as the models read it: status, output, value, error, artifacts, variables."""
        lines: list[str] = []
        lost = ", ".join(self.lost_variables) or "none"
        if self.kernel_died and self.timed_out:
            lines.append(
                f"The cell timed out after {self.elapsed:.0f} s and did not stop when interrupted, so the kernel "
                f"was restarted. Variables lost: {lost}."
            )
        elif self.kernel_died:
            lines.append(f"The kernel died while running this cell and was restarted. Variables lost: {lost}.")
        elif self.timed_out:
            lines.append(f"The cell timed out after {self.elapsed:.0f} s and was interrupted; earlier variables are kept.")
        elif self.interrupted:
            lines.append("The cell was interrupted; earlier variables are kept.")
        else:
            lines.append("The execution succeeded." if self.success else "The execution failed.")
        if self.stdout:
            lines.append(f"Output:\n{self.stdout.rstrip()}")
        if self.stderr:
            lines.append(f"Stderr:\n{self.stderr.rstrip()}")
        for shown in self.displays:
            lines.append(f"Display:\n{shown.rstrip()}")
        if self.result is not None:
            lines.append(f"Result value:\n{self.result.rstrip()}")
        if self.error is not None:
            lines.append(f"Error: {self.error.name}: {self.error.value}\n{self.error.traceback.rstrip()}")
        if self.artifacts:
            lines.append("Artifacts saved: " + ", ".join(self.artifacts))
        if self.full_output_path:
            lines.append(f"(Full output saved to {self.full_output_path})")
        if self.changes:
            parts = [
                f"{label}: {', '.join(names)}"
                for label, names in (("created", self.changes.created), ("changed", self.changes.changed), ("deleted", self.changes.deleted))
                if names
            ]
            lines.append("Variables " + "; ".join(parts))
        return "\n".join(lines)


class Executor(Protocol):
    """Runs code in a persistent namespace: the seam between the agent and the kernel."""

    def run(self, code: str, *, timeout: float | None = None) -> ExecutionResult:
        """Run one cell and return what it did."""
        ...

    def interrupt(self) -> None:
        """Stop the running cell (safe to call from another thread or a signal handler)."""
        ...

    def variables(self) -> tuple[Variable, ...]:
        """The latest snapshot of user variables (from the last cell; no kernel round trip)."""
        ...

    def restart(self) -> tuple[str, ...]:
        """Start a fresh kernel; returns the names of the variables that were lost."""
        ...

    def shutdown(self) -> None:
        """End the kernel and everything it started."""
        ...
