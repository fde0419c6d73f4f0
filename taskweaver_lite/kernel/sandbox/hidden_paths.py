"""What to say when a cell reaches for a path the sandbox hides: it exists here, and this is how to reach it.

A sandboxed kernel sees neither the user's home nor `/tmp` (bwrap.py): "analyze
~/Downloads/sales.csv" fails with a bare FileNotFoundError for a file that exists, and a model
would retry blindly. The executor adds one note to such a result, for the model and the user:
the path is hidden by the sandbox, `/load` copies it in, or a mount (the exact setting) shows it.
Writing into a read-only mount gets the setting that makes it writable.
"""

from __future__ import annotations

import re
from pathlib import Path

from taskweaver_lite.kernel.sandbox.bwrap import SandboxPlan, sees
from taskweaver_lite.records.execution import CellError

# The errors whose message names the path (Python's OSError text: "[Errno 2] No such file or directory: '/x'");
# writing into a read-only mount is a plain OSError ("[Errno 30] Read-only file system: '/x'").
PATH_ERRORS = ("FileNotFoundError", "PermissionError", "IsADirectoryError", "NotADirectoryError", "OSError")
_READ_ONLY = ("PermissionError", "OSError")
_QUOTED_PATH = re.compile(r"""['"]((?:/|~/)[^'"]*)['"]""")


def hidden_path_notes(error: CellError | None, plan: SandboxPlan | None) -> tuple[str, ...]:
    """One note per path the error names that this machine has but the kernel cannot see (or write); () otherwise."""
    if error is None or plan is None or error.name not in PATH_ERRORS:
        return ()
    notes = []
    for named in dict.fromkeys(_QUOTED_PATH.findall(error.value)):
        path = Path(named).expanduser()
        note = _read_only_note(path, plan) if error.name in _READ_ONLY else None
        note = note or _hidden_note(path, plan)
        if note:
            notes.append(note)
    return tuple(notes)


def _hidden_note(path: Path, plan: SandboxPlan) -> str | None:
    if not path.exists() or sees(path, plan):
        return None
    folder = path if path.is_dir() else path.parent
    return (
        f"{path} exists on this machine, but the sandbox hides it from the kernel. To use it, the user can "
        f"`/load {path}` (a copy in the working folder, then read it by its name), or let the kernel read the folder in place: "
        f"execution.mounts: [{folder}] in taskweaver_config.yaml, or --set 'execution.mounts=[\"{folder}\"]'."
    )


def _read_only_note(path: Path, plan: SandboxPlan) -> str | None:
    mount = next((m for m in plan.mounts if not m.writable and (path == m.path or m.path in path.parents)), None)
    if mount is None:
        return None
    return (
        f"{path} is in the read-only mount {mount.path}: write into the working folder instead, or the user can make the "
        f"mount writable: execution.mounts: [{{path: {mount.path}, mode: rw}}] in taskweaver_config.yaml."
    )
