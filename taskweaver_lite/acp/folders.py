"""What an editor brings to a session: its folder, lent to the kernel read-only, and its MCP servers.

`session/new` and `session/load` name the editor's working folder (`cwd`) and the MCP servers it
wants the agent to use. Both become settings of that session only, applied as `--set` values over
the project's config, so that they are checked as the config file's keys are:

- the folder joins `execution.mounts`, read-only: the sandboxed kernel reads the analyst's files
  at their own paths and cannot change them. It is not lent when the sandbox could not keep it
  read-only (`execution.sandbox: none`: the kernel sees every folder anyway), when the kernel
  runs on a gateway (another machine), or when it is the project folder or the store's, or inside
  them (the sandbox hides those: the config holds the model's key);
- each stdio server joins `mcp.servers` under its name made a Python name (a cell calls its tool
  T as NAME.T(...)); it runs inside the kernel, as the project's servers do. HTTP and SSE servers
  are not taken (the agent declares neither).

What is left out is said in one line each (`EditorSettings.notices`), for the editor's log.
"""

from __future__ import annotations

import json
import keyword
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taskweaver_lite.config.settings import Config


class FolderError(ValueError):
    """The editor's folder cannot be a session's (not absolute, not there): said to the client as bad input."""


@dataclass(frozen=True)
class EditorSettings:
    """The `--set` values that give one session the editor's folder and servers, and what was left out."""

    overrides: tuple[str, ...] = ()
    lent: Path | None = None  # the folder the kernel reads, when lent
    notices: tuple[str, ...] = field(default_factory=tuple)


def editor_settings(config: Config, *, cwd: str, servers: Sequence[Any] = ()) -> EditorSettings:
    """The settings `cwd` and the editor's MCP `servers` add to `config` (already loaded with the command's --set values)."""
    folder = _folder(cwd)
    overrides: list[str] = []
    notices: list[str] = []
    why_not = _not_lendable(config, folder)
    if why_not:
        notices.append(f"The editor's folder {folder} is not lent to the kernel: {why_not}.")
    elif not any(Path(mount.path) == folder for mount in config.execution.mounts):  # a project's own mount of it stays as it is
        mounts = [{"path": mount.path, "mode": mount.mode} for mount in config.execution.mounts]
        overrides.append("execution.mounts=" + json.dumps([*mounts, {"path": str(folder), "mode": "ro"}]))
    added: dict[str, dict[str, Any]] = {}
    for server in servers:
        notice = _server(config, server, added)
        if notice:
            notices.append(notice)
    if added:
        kept = {name: entry.model_dump() for name, entry in config.mcp.servers.items() if name not in added}
        overrides.append("mcp.servers=" + json.dumps({**kept, **added}))
    return EditorSettings(overrides=tuple(overrides), lent=None if why_not else folder, notices=tuple(notices))


def _folder(cwd: str) -> Path:
    path = Path(cwd)
    if not cwd or not path.is_absolute():
        raise FolderError(f"cwd must be an absolute path (the editor's working folder), not {cwd!r}")
    if not path.is_dir():
        raise FolderError(f"cwd {cwd} is not a folder on this machine")
    return path.resolve()


def _not_lendable(config: Config, folder: Path) -> str:
    """Why the kernel cannot be lent `folder` read-only ("" when it can)."""
    execution = config.execution
    if execution.kernel_gateway is not None:
        return "the kernel runs on a gateway (execution.kernel_gateway), another machine"
    if execution.sandbox == "none":
        return "execution.sandbox is none, so the kernel sees every folder and read-only cannot be kept"
    for hidden, what in ((config.project_dir, "project folder"), (config.store_path.parent, "store's folder")):
        hidden = Path(hidden).resolve()
        if folder == hidden or hidden in folder.parents:
            return f"it is the {what} {hidden} or inside it, which the sandbox hides (the config holds the model's key); open a folder outside it"
    return ""


def _server(config: Config, server: Any, added: dict[str, dict[str, Any]]) -> str:
    """Add one editor MCP server to `added` under its Python name; returns what to say about it ("" for nothing)."""
    name = str(getattr(server, "name", "") or "server")
    command = getattr(server, "command", None)
    if command is None or getattr(server, "url", None) is not None:
        return f"The editor's MCP server {name!r} is not started: only servers run by a command (stdio) run beside the kernel."
    if config.execution.kernel_gateway is not None:
        return f"The editor's MCP server {name!r} is not started: MCP servers run beside the kernel, and it runs on a gateway."
    key = python_name(name)
    env = {str(item.name): str(item.value) for item in getattr(server, "env", None) or []}
    added[key] = {"command": [str(command), *(str(arg) for arg in getattr(server, "args", None) or [])], "env": env}
    return f"The editor's MCP server {name!r} runs beside the kernel as {key}: a cell calls its tools as {key}.TOOL(...)." if key != name else ""


def python_name(name: str) -> str:
    """`name` as a Python name: other characters become `_`, a leading digit or a keyword gets a `_` more."""
    cleaned = re.sub(r"\W", "_", name.strip()) or "server"
    if cleaned[0].isdigit() or keyword.iskeyword(cleaned):
        cleaned = "_" + cleaned
    return cleaned
