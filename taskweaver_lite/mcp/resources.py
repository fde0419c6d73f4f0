"""What a session's cells produced, offered to MCP clients as resources: plots and the files they wrote.

A resource's address names its session and its folder: `taskweaver-lite://session/<id>/artifacts/<name>`
for what a cell displayed (plots, saved by the kernel), `taskweaver-lite://session/<id>/files/<name>`
for a file a cell wrote in the working folder. Only a regular file directly in that folder is
read, opened relative to the folder's descriptor with no link followed and checked on that same
descriptor (a cell swapping the name for a link meanwhile gets nothing), up to MAX_RESOURCE_BYTES;
text comes as text, the rest as base64.
The files of a stored session that is not open here are read from its folder all the same.
"""

from __future__ import annotations

import base64
import mimetypes
import os
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote

import mcp_types as types
from mcp.shared.exceptions import MCPError

from taskweaver_lite.safety.workfiles import open_below

if TYPE_CHECKING:  # the MCP server answers `initialize` before these are imported (mcp/server.py)
    from taskweaver_lite.records.conversation import Round
    from taskweaver_lite.session.session import Session

SCHEME = "taskweaver-lite"
MAX_RESOURCE_BYTES = 25 * 1024 * 1024
MAX_LISTED_PER_SESSION = 200
# Folder in an address -> the folder in a session's own folder.
_FOLDERS = {"artifacts": "artifacts", "files": "cwd"}


def resource_uri(session_id: str, kind: str, name: str) -> str:
    """The address of a session's file: kind `artifacts` (plots) or `files` (the working folder)."""
    return f"{SCHEME}://session/{quote(session_id, safe='')}/{kind}/{quote(name, safe='')}"


def mime_type(name: str) -> str:
    """The file's MIME type from its name (application/octet-stream when unknown)."""
    return mimetypes.guess_type(name)[0] or ("text/plain" if name.endswith((".txt", ".log", ".md")) else "application/octet-stream")


def _resource(session_id: str, kind: str, path: Path) -> types.Resource:
    return types.Resource(
        uri=resource_uri(session_id, kind, path.name),
        name=path.name,
        mime_type=mime_type(path.name),
        size=path.stat().st_size,
        description=f"session {session_id}",
    )


def session_files(session: Session) -> list[tuple[str, Path]]:
    """(kind, file) of what the session's cells produced: plots, then the files written in the working folder (not those loaded)."""
    artifacts = [Path(path) for rnd in session.conversation.rounds for post in rnd.posts if post.execution for path in post.execution.artifacts]
    found = [("artifacts", path) for path in artifacts if path.is_file()]
    loaded = {load.name for load in session.loads}
    known = {path.name for _, path in found}
    try:
        written = sorted(p for p in session.working_dir.iterdir() if p.is_file() and not p.is_symlink() and not p.name.startswith("."))
    except OSError:
        written = []
    found += [("files", path) for path in written if path.name not in loaded and path.name not in known]
    return found[:MAX_LISTED_PER_SESSION]


def list_resources(sessions: Iterable[Session]) -> list[types.Resource]:
    """Every file the open sessions' cells produced, as resources."""
    return [_resource(session.id, kind, path) for session in sessions for kind, path in session_files(session) if path.exists()]


def artifact_links(session: Session, rnd: Round, *, written: Collection[str]) -> list[types.ResourceLink]:
    """Links to what a turn's cells produced: its plots, and the files its cells wrote in the working folder (`written`: turn_files.py)."""
    plots = [Path(path) for post in rnd.posts if post.execution for path in post.execution.artifacts]
    found = [("artifacts", path) for path in plots if path.is_file()]
    found += [("files", session.working_dir / name) for name in written if (session.working_dir / name).is_file()]
    return [
        types.ResourceLink(type="resource_link", uri=resource_uri(session.id, kind, path.name), name=path.name, mime_type=mime_type(path.name))
        for kind, path in found
    ]


def read_resource(uri: str, sessions: Mapping[str, Session], *, stored: Callable[[str], Path | None]) -> types.ReadResourceResult:
    """The contents of the file `uri` names: of a session open here, or of a stored one (`stored` finds its folder)."""
    session_id, kind, name = resource_parts(uri)
    session = sessions.get(session_id)
    folder = session.working_dir.parent if session is not None else stored(session_id)
    if folder is None:
        raise _not_found(uri, f"no session {session_id!r} in this project")
    data = _read(uri, folder / _FOLDERS[kind], name, what=f"session {session_id} has no file {name!r} in its {kind}")
    return resource_contents(uri, name, data)


def resource_contents(uri: str, name: str, data: bytes) -> types.ReadResourceResult:
    """The bytes of the file `name` as the resource `uri`: text when its type is text and it decodes, else base64."""
    kind_of = mime_type(name)
    if kind_of.startswith("text/") or kind_of in ("application/json", "image/svg+xml"):
        try:
            return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, mime_type=kind_of, text=data.decode("utf-8"))])
        except UnicodeDecodeError:
            pass
    blob = base64.b64encode(data).decode("ascii")
    return types.ReadResourceResult(contents=[types.BlobResourceContents(uri=uri, mime_type=kind_of, blob=blob)])


def _read(uri: str, folder: Path, name: str, *, what: str) -> bytes:
    """The regular file `name` directly in `folder`: opened relative to the folder's descriptor with no link followed,
    checked (`fstat`) and read through that one descriptor, so a name swapped for a link meanwhile is never followed."""
    if Path(name).name != name or name in (".", ".."):
        raise _not_found(uri, what)
    try:
        fd, info = open_below(folder, name)
    except OSError:  # missing, a link, not a regular file: the same answer, with none of this machine's paths
        raise _not_found(uri, what) from None
    with os.fdopen(fd, "rb") as file:
        if info.st_size > MAX_RESOURCE_BYTES:
            raise too_large(uri, name, info.st_size)
        return file.read(MAX_RESOURCE_BYTES + 1)[:MAX_RESOURCE_BYTES]


def resource_parts(uri: str) -> tuple[str, str, str]:
    """(session id, kind, file name) of one of our addresses; a protocol error naming the expected shape otherwise."""
    prefix = f"{SCHEME}://session/"
    parts = uri.removeprefix(prefix).split("/") if uri.startswith(prefix) else []
    if len(parts) != 3 or parts[1] not in _FOLDERS or not parts[0] or not parts[2]:
        raise _not_found(uri, f"not a resource of this server: addresses look like {resource_uri('ID', 'artifacts', 'NAME')} (or files/NAME)")
    return unquote(parts[0]), parts[1], unquote(parts[2])


def too_large(uri: str, name: str, size: int) -> MCPError:
    """A file past MAX_RESOURCE_BYTES: refused as such (invalid params), never as a resource that does not exist."""
    return MCPError(
        code=types.INVALID_PARAMS,
        message=f"{uri}: {name} is too large to read as a resource: {size:,} bytes, more than {MAX_RESOURCE_BYTES:,} (it is there, but not sent)",
    )


def _not_found(uri: str, why: str) -> MCPError:
    # -32002: the MCP specification's code for a resource that is not found.
    return MCPError(code=-32002, message=f"{uri}: {why}")
