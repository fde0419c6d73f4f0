"""What running a cell produces: `ExecutionResult`, variable snapshots, and what the kernel offers code.

These are plain values with an explicit JSON shape (`to_dict`/`from_dict`) so that the
conversation, the prompts, compression and the store all read the same thing. The `Executor` seam
that produces them is `kernel/interface.py`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from taskweaver_lite.records.mcp_tools import McpServer


@dataclass(frozen=True)
class Variable:
    """One user variable as the kernel holds it."""

    name: str
    type: str
    description: str

    def to_dict(self) -> dict[str, str]:
        """JSON shape: {name, type, description}."""
        return {"name": self.name, "type": self.type, "description": self.description}

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
class CellError:
    """What a cell raised (a record, not an exception): name, message, traceback without ANSI colour codes."""

    name: str
    value: str
    traceback: str

    def to_dict(self) -> dict[str, str]:
        """JSON shape: {name, value, traceback}."""
        return asdict(self)


DATA_OPEN, DATA_CLOSE = "<data>", "</data>"
# A cell that prints "</data>" must not end its own block early and pass the rest off as ours.
_DATA_TAGS = re.compile(r"<(/?)data>", re.IGNORECASE)


def as_data(text: str, *, block: bool = True) -> str:
    """`text` (cell output, file contents) marked as data, which the prompts tell the roles never to obey."""
    inner = _DATA_TAGS.sub(r"&lt;\1data&gt;", text)
    return f"{DATA_OPEN}\n{inner}\n{DATA_CLOSE}" if block else f"{DATA_OPEN}{inner}{DATA_CLOSE}"


@dataclass(frozen=True)
class FoldPiece:
    """A piece of text a fold reads (of a result, of a round); essential pieces survive any cut whole."""

    text: str
    essential: bool = False  # the user's request, the Planner's instruction, an execution's outcome


class CellCancelled(KeyboardInterrupt):
    """Ctrl-C (or Stop) while a cell ran: still a KeyboardInterrupt, carrying what the cell printed until then."""

    def __init__(self, result: ExecutionResult) -> None:
        super().__init__()
        self.result = result


@dataclass(frozen=True)
class ExecutionResult:
    """Everything one cell did, with text already bounded for prompts.

    `stdout`, `stderr`, `result`, `displays` and the error share one token limit per cell (the
    error's name, message and last frames first; head and tail of the rest, with a marker saying
    how much was left out); `full_output_path` names the file holding the complete output
    whenever anything was cut. `result_html` is for pages and exports, never for prompts.
    """

    code: str
    success: bool
    stdout: str = ""
    stderr: str = ""
    result: str | None = None
    result_html: str | None = None
    error: CellError | None = None
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
    notices: tuple[str, ...] = ()  # what the executor put right after the cell (a working folder restored)
    refused: str = ""  # why the code was not run at all (a verification rule, the user declined); "" when it ran
    cancelled: bool = False  # stopped by the user (Ctrl-C, the page's Stop): the output is what it printed until then
    limit_reached: str = ""  # a limit the cell passed (execution.disk_limit): what happened and how to go on; "" when none
    kernel_ended: str = ""  # with kernel_died: why the kernel went though it did not die (a gateway ended it while idle); "" when it died

    def to_dict(self) -> dict[str, Any]:
        """JSON shape used by the store and by export."""
        # Field by field, not `asdict`: that deep-copies every value, each of a wide kernel's hundreds of
        # variables included, on every post the store records (17 ms a cell at 250 variables).
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["error"] = self.error.to_dict() if self.error else None
        data["variables"] = [v.to_dict() for v in self.variables]
        data["changes"] = self.changes.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExecutionResult:
        """Inverse of `to_dict`."""
        values = dict(data)
        err = values.get("error")
        values["error"] = CellError(**err) if err else None
        values["variables"] = tuple(Variable.from_dict(v) for v in values.get("variables", ()))
        values["changes"] = VariableChanges.from_dict(values.get("changes") or {})
        values["refused"] = str(values.get("refused") or "")
        values["cancelled"] = bool(values.get("cancelled", False))  # stored before cancelled cells were kept
        values["limit_reached"] = str(values.get("limit_reached") or "")  # stored before the disk limit
        values["kernel_ended"] = str(values.get("kernel_ended") or "")  # stored before ended kernels were told from dead ones
        for name in ("displays", "artifacts", "lost_variables", "notices"):
            values[name] = tuple(values.get(name) or ())
        return cls(**values)

    def outcome(self) -> str:
        """The first line a model reads: how the cell ended."""
        if self.refused:
            return f"The code was not run: {self.refused}."
        lost = ", ".join(self.lost_variables) or "none"
        if self.kernel_died and self.timed_out:
            return f"The cell timed out after {self.elapsed:.0f} s and did not stop when interrupted, so the kernel was restarted. Variables lost: {lost}."
        if self.kernel_died and self.kernel_ended:
            ran = "this cell ran on a new kernel" if self.success else "this cell was lost with it and a new kernel started"
            return f"{self.kernel_ended}, so {ran}. Variables lost: {lost}."
        if self.kernel_died and self.success:
            # It died between cells (the OOM killer picks idle kernels too): this cell ran on a fresh one.
            return f"The kernel died before this cell and was restarted; the cell ran on the fresh kernel. Variables lost: {lost}."
        if self.kernel_died and self.cancelled:
            return f"The user cancelled the cell, and the kernel did not come through the interrupt, so it was restarted. Variables lost: {lost}."
        if self.kernel_died:
            return f"The kernel died while running this cell and was restarted. Variables lost: {lost}."
        if self.limit_reached:
            return f"{self.limit_reached}. Earlier variables are kept."
        if self.timed_out:
            return f"The cell timed out after {self.elapsed:.0f} s and was interrupted; earlier variables are kept."
        if self.cancelled:
            return "The user cancelled the cell while it ran (Ctrl-C); below is what it printed until then; earlier variables are kept."
        if self.interrupted:
            return "The cell was interrupted; earlier variables are kept."
        return "The execution succeeded." if self.success else "The execution failed."

    def prompt_text(self, *, marked: bool = True, outcome_told: bool = False) -> str:
        """The result as the models read it: outcome, error first, output, value, artifacts, variables.

        What the cell printed and raised is marked as data (`as_data`); `marked=False` is for people.
        `outcome_told`: the reader was already told whether the code succeeded, so the plain
        succeeded/failed line is left out (a kernel death, timeout or interrupt is still said).
        """
        return "\n".join(piece.text for piece in self.fold_pieces(marked=marked, outcome_told=outcome_told))

    def shortened_prompt_text(self, cut: Callable[[str], str], *, outcome_told: bool = False) -> str:
        """`prompt_text` for an earlier round: the outcome, error line and variables whole, what the cell
        printed and its traceback passed through `cut` (head and tail kept; the full output's file named)."""
        return "\n".join(p.text if p.essential else cut(p.text) for p in self.fold_pieces(outcome_told=outcome_told))

    def masked_prompt_text(self, *, outcome_told: bool = False) -> str:
        """`prompt_text` with what the cell printed as one placeholder line (observation masking): outcome, error line, variables stay."""
        lines = sum(len(text.splitlines()) for text in (self.stdout, self.stderr, self.result or "", *self.displays))
        if self.error is not None and self.error.traceback.strip():
            lines += len(self.error.traceback.splitlines())
        kept = [p.text for p in self.fold_pieces(outcome_told=outcome_told) if p.essential]
        if lines:
            where = f"; full output in {self.full_output_path}" if self.full_output_path else ""
            kept.insert(len(kept) - bool(self.changes), f"(Output omitted: {lines} lines{where})")
        return "\n".join(kept)

    def fold_pieces(self, *, marked: bool = True, outcome_told: bool = False) -> tuple[FoldPiece, ...]:
        """`prompt_text` in pieces; the outcome and the error line are what a fold must keep."""
        block = as_data if marked else _unmarked
        outcome = self.outcome()
        plain = not (self.kernel_died or self.timed_out or self.interrupted or self.refused or self.cancelled or self.limit_reached)
        pieces = [] if outcome_told and plain else [FoldPiece(outcome, essential=True)]
        if self.error is not None:
            pieces.append(FoldPiece(f"Error: {self.error.name}: {block(self.error.value, block=False)}", essential=True))
            if self.error.traceback.strip():
                pieces.append(FoldPiece(f"Traceback (last frames):\n{block(self.error.traceback.rstrip())}"))
        if self.stdout:
            pieces.append(FoldPiece(f"Output:\n{block(self.stdout.rstrip())}"))
        if self.stderr:
            pieces.append(FoldPiece(f"Stderr:\n{block(self.stderr.rstrip())}"))
        pieces += [FoldPiece(f"Display:\n{block(shown.rstrip())}") for shown in self.displays]
        if self.result is not None:
            pieces.append(FoldPiece(f"Result value:\n{block(self.result.rstrip())}"))
        if self.artifacts:
            pieces.append(FoldPiece("Artifacts saved: " + ", ".join(self.artifacts), essential=True))
        pieces += [FoldPiece(f"Note: {notice}", essential=True) for notice in self.notices]
        if self.full_output_path:
            pieces.append(FoldPiece(f"(Full output saved to {self.full_output_path})"))
        if self.changes:
            parts = [
                f"{label}: {', '.join(names)}"
                for label, names in (("created", self.changes.created), ("changed", self.changes.changed), ("deleted", self.changes.deleted))
                if names
            ]
            pieces.append(FoldPiece("Variables " + "; ".join(parts), essential=True))
        return tuple(pieces)


def _unmarked(text: str, *, block: bool = True) -> str:
    return text


@dataclass(frozen=True)
class KernelEnvironment:
    """What the kernel offers code: the analysis libraries it can import, the user's folders it sees, its Python."""

    libraries: tuple[str, ...] = ()  # import names, as probed in the kernel at its start (() if unknown)
    mounts: tuple[str, ...] = ()  # "/data (read-only)", one per execution.mounts entry
    python: str = ""  # the interpreter, for /info
    safety: tuple[tuple[str, str], ...] = ()  # (layer, state) for /info: the sandbox, the syscall filter, the disk limit
    mcp_servers: tuple[McpServer, ...] = ()  # mcp.servers as the kernel started them: their tools, or why not
