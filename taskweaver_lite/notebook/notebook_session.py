"""A notebook's one stored session: found by the notebook's identity, opened at its first request, kept across kernel restarts.

Which notebook this kernel runs, first found first: `__session__` (ipykernel sets it from
`JPY_SESSION_NAME`, the notebook's path that JupyterLab and Notebook 7 give the kernel), then
`JPY_SESSION_NAME` itself, then `__vsc_ipynb_file__` (VS Code), then the kernel's working folder
(nbclient, papermill and a plain IPython give no path: one session per folder). The session that
identity has is written in the project's state folder (`notebooks/<hash>.json`), so a restarted
kernel finds it again: its rounds, summaries and settings, as `chat --resume` does. Its variables are
the notebook's own business: nothing is replayed into the kernel.

The project is `TASKWEAVER_LITE_PROJECT`, else the kernel's working folder when it holds a project
(`taskweaver_config.yaml`, or TaskWeaver's JSON, there or in `./project`), else the defaults, kept
in a folder of the user's (`$XDG_STATE_HOME/taskweaver-lite/notebooks`). `--set` values apply from
the request that gives them on, and are stored with the session (a restart applies them again).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from taskweaver_lite.config.file import CONFIG_FILE_NAME, load_config, merge_overrides
from taskweaver_lite.config.settings import Config
from taskweaver_lite.config.taskweaver_json import JSON_FILE_NAME
from taskweaver_lite.errors import ConfigError, UnknownSessionError
from taskweaver_lite.kernel.choice import own_kernel_factory
from taskweaver_lite.llm.discovery import discover, needs_discovery, no_model_found, use_local_server
from taskweaver_lite.notebook.cell_view import CellView, show_markdown
from taskweaver_lite.plugins.catalog import PluginCatalog
from taskweaver_lite.records.conversation import Round
from taskweaver_lite.records.events import Event
from taskweaver_lite.safety.confirm import CellChoice
from taskweaver_lite.safety.workfiles import owner_only_folder
from taskweaver_lite.session.session import Session
from taskweaver_lite.session.workspace import Workspace

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

PROJECT_VARIABLE = "TASKWEAVER_LITE_PROJECT"
# Where each notebook's session id is kept, in the project's state folder.
INDEX_FOLDER = "notebooks"
UNSANDBOXED = "No sandbox here: the code it writes runs in this kernel with your permissions, as your own cells do."


@dataclass(frozen=True)
class NotebookIdentity:
    """Which notebook a kernel runs, and where that was read."""

    key: str
    source: str  # "__session__", "JPY_SESSION_NAME", "__vsc_ipynb_file__" or "working folder"


@dataclass(frozen=True)
class ProjectChoice:
    """The project a notebook's session uses, and why that one."""

    folder: Path
    source: str  # PROJECT_VARIABLE, "working folder" or "defaults"


def notebook_identity(user_ns: Mapping[str, Any], environ: Mapping[str, str], cwd: Path) -> NotebookIdentity:
    """The notebook's path as the front end gave it to the kernel, else the kernel's working folder."""
    for name, value in (("__session__", user_ns.get("__session__")), ("JPY_SESSION_NAME", environ.get("JPY_SESSION_NAME"))):
        if isinstance(value, str) and value.strip():
            return NotebookIdentity(value, name)
    vscode = user_ns.get("__vsc_ipynb_file__")
    if isinstance(vscode, str) and vscode.strip():
        return NotebookIdentity(vscode, "__vsc_ipynb_file__")
    return NotebookIdentity(str(cwd.resolve()), "working folder")


def notebook_project(environ: Mapping[str, str], cwd: Path) -> ProjectChoice:
    """`TASKWEAVER_LITE_PROJECT`, else a project in the working folder (itself or `./project`), else the defaults' folder."""
    named = environ.get(PROJECT_VARIABLE, "").strip()
    if named:
        folder = Path(named).expanduser()
        if not folder.is_dir():
            raise ConfigError(f"{PROJECT_VARIABLE}={named}: no such project folder; create one with `taskweaver-lite init {named}` or unset it")
        return ProjectChoice(folder, PROJECT_VARIABLE)
    for folder in (cwd, cwd / "project"):
        if (folder / CONFIG_FILE_NAME).is_file() or (folder / JSON_FILE_NAME).is_file():
            return ProjectChoice(folder, "working folder")
    return ProjectChoice(defaults_folder(environ), "defaults")


def defaults_folder(environ: Mapping[str, str]) -> Path:
    """The folder that stands for a project when there is none: the sessions of notebooks without one live there."""
    home = Path(environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    for base in (home / "taskweaver-lite", Path(tempfile.gettempdir()) / f"taskweaver-lite-{os.getuid()}"):
        with contextlib.suppress(OSError):
            owner_only_folder(base / INDEX_FOLDER)
            return base / INDEX_FOLDER
    raise ConfigError(f"no folder could be made for this notebook's sessions: set {PROJECT_VARIABLE} to a project folder (`taskweaver-lite init` makes one)")


class SessionIndex:
    """Which stored session each notebook has: one small file per notebook identity in the project's state folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _path(self, key: str) -> Path:
        return self.folder / f"{hashlib.sha256(key.encode('utf-8')).hexdigest()[:24]}.json"

    def get(self, key: str) -> str | None:
        """The session id the notebook `key` has, None if it has none yet (or the file is unreadable)."""
        try:
            data = json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        session_id = data.get("session_id") if isinstance(data, dict) and data.get("key") == key else None
        return session_id if isinstance(session_id, str) else None

    def set(self, key: str, session_id: str) -> None:
        """Remember `session_id` as the notebook's (written whole under a new name, then renamed into place)."""
        owner_only_folder(self.folder)
        path = self._path(key)
        fresh = path.with_name(f".{path.name}.{os.getpid()}")
        fresh.write_text(json.dumps({"key": key, "session_id": session_id}), encoding="utf-8")
        os.replace(fresh, path)

    def forget(self, key: str) -> None:
        """The notebook has no session any more: its next request starts one."""
        self._path(key).unlink(missing_ok=True)


class NotebookSession:
    """The session of the notebook this kernel runs, opened at its first request; `ask`, `history` and `reset` act on it."""

    def __init__(self, shell: InteractiveShell, *, environ: Mapping[str, str] | None = None) -> None:
        """`environ`: where the project and the notebook's path are read (default: this process's environment)."""
        self._shell = shell
        self._environ = os.environ if environ is None else environ
        self._overrides: list[str] = []
        self._workspace: Workspace | None = None
        self._session: Session | None = None
        self._view: CellView | None = None  # the running request's cell
        self._told = False  # the first request says once where the code runs

    @property
    def session(self) -> Session | None:
        """The open session, once a request opened it."""
        return self._session

    def identity(self) -> NotebookIdentity:
        """Which notebook this kernel runs (read at each use: a notebook renamed in JupyterLab moves its path)."""
        return notebook_identity(self._shell.user_ns, self._environ, Path.cwd())

    def ask(self, request: str, *, overrides: Sequence[str] = (), insert: bool = False) -> Round:
        """One request in the notebook's session, shown in the running cell; KeyboardInterrupt (the stop button) ends it, the session stays."""
        session = self._open(overrides)
        view = CellView(self._shell, request=request, insert=insert or session.config.execution.confirm)
        self._view, outcome = view, "failed"
        try:
            rnd = session.ask(request)
            outcome = "done" if rnd.state == "finished" else "failed"
            return rnd
        except KeyboardInterrupt:
            outcome = "stopped"
            raise
        finally:
            self._view = None
            view.finish(outcome=outcome)

    def _open(self, overrides: Sequence[str]) -> Session:
        """The notebook's session under its settings and `overrides` (reopened when they change them)."""
        wanted = merge_overrides(self._overrides, overrides)
        if self._session is not None and wanted == self._overrides:
            return self._session
        self.close()
        project = notebook_project(self._environ, Path.cwd())
        identity = self.identity()
        workspace = self._workspace = Workspace(load_config(project.folder, wanted), plugins=PluginCatalog())
        index = SessionIndex(workspace.config.state_dir / INDEX_FOLDER)
        known = self._stored(workspace, index.get(identity.key))
        if known is not None:
            wanted = merge_overrides(workspace.store.overrides(known), wanted)  # what it ran with before a restart, then the new values
            workspace = workspace.reconfigured(load_config(project.folder, wanted))
        _find_model(workspace.config)
        factory = own_kernel_factory(workspace.config, shell=self._shell)
        confirm = CellChoice.hand_over if workspace.config.execution.confirm else None
        if known is not None:
            session, _ = workspace.resume_session(known, executor=factory, listeners=[self._show], confirm=confirm)
        else:
            session = workspace.new_session(executor=factory, listeners=[self._show], confirm=confirm)
            index.set(identity.key, session.id)
        workspace.store.save_overrides(session.id, wanted)
        self._session, self._overrides = session, wanted
        self._tell_once(session, project, earlier=len(session.conversation.rounds))
        return session

    @staticmethod
    def _stored(workspace: Workspace, session_id: str | None) -> str | None:
        """`session_id` if the store still has it (a deleted session is forgotten: a new one starts)."""
        if session_id is None:
            return None
        try:
            return workspace.store.resolve(session_id)
        except UnknownSessionError:
            return None

    def _tell_once(self, session: Session, project: ProjectChoice, *, earlier: int) -> None:
        if self._told:
            return
        self._told = True
        resumed = f", {earlier} earlier request{'s' * (earlier != 1)}" if earlier else ""
        where = f"project `{project.folder}`" if project.source != "defaults" else "default settings"
        show_markdown(f"*taskweaver-lite: this notebook's session `{session.id}`{resumed}, {where}. {UNSANDBOXED}*")

    def _show(self, event: Event) -> None:
        """The session's listener: the running request's cell shows each event."""
        if self._view is not None:
            self._view(event)

    def rounds(self) -> tuple[str | None, list[Round]]:
        """The notebook's session id and its rounds (read from the store when no request opened it in this kernel)."""
        if self._session is not None:
            return self._session.id, list(self._session.conversation.rounds)
        project = notebook_project(self._environ, Path.cwd())
        with Workspace(load_config(project.folder), plugins=PluginCatalog()) as workspace:
            known = self._stored(workspace, SessionIndex(workspace.config.state_dir / INDEX_FOLDER).get(self.identity().key))
            return known, (workspace.store.load(known).rounds if known is not None else [])

    def reset(self) -> str | None:
        """Start over: the next request opens a new session (the one this notebook had stays stored); returns its id."""
        session_id, _ = self.rounds()
        self.close()
        project = notebook_project(self._environ, Path.cwd())
        SessionIndex(load_config(project.folder).state_dir / INDEX_FOLDER).forget(self.identity().key)
        self._overrides = []
        return session_id

    def project(self) -> ProjectChoice:
        """The project the notebook's session uses."""
        return notebook_project(self._environ, Path.cwd())

    def close(self) -> None:
        """Close the session (it stays stored) and the workspace's store; the kernel and its variables stay."""
        session, self._session = self._session, None
        workspace, self._workspace = self._workspace, None
        try:
            if session is not None:
                session.close()
        finally:
            if workspace is not None:
                workspace.close()


def _find_model(config: Config) -> None:
    """With no key and no address anywhere, a local model server (as the chat does); ConfigError naming the settings if none."""
    if not needs_discovery(config):
        return
    servers = discover()
    if use_local_server(config, servers) is None:
        raise ConfigError(no_model_found(config, servers))
