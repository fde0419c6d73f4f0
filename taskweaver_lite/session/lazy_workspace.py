"""The project a protocol server serves (`taskweaver-lite mcp`, `taskweaver-lite acp`), opened by the first call that needs it.

An MCP host or an editor starts its servers as it starts and waits for each one's `initialize`
answer. Reading the config, importing the session's stack (roles, kernel, model client) and opening
the store with the roles and plugins found takes longer than the rest of the start, and neither
`initialize` nor MCP's lists of tools and of the open sessions' files need any of it. So the command
checks only that the project folder is there (a wrong `-p` stops it at once, with one line on
stderr), and the project stays closed until a call needs it:

- the first such call reads the config and opens the project, on its own thread, and tells stderr
  what that found (the config's notices, a broken plugin, a role that is off); calls that come
  meanwhile wait for that one opening and share its outcome;
- an opening that fails (a mistake in the config, `execution.confirm: true`, a damaged store,
  PostgreSQL down) fails the calls that waited for it with the reason, said once on stderr, and
  leaves the project closed: the next call reads the config and tries again, so a config fixed or a
  store that comes back needs no restart of the host.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from taskweaver_lite.errors import TaskWeaverError

if TYPE_CHECKING:
    from taskweaver_lite.config.settings import Config
    from taskweaver_lite.session.workspace import Workspace


class LazyWorkspace:
    """The project's `Workspace`, opened by the first `get()` on whichever thread, once; closed by `close()` if it was opened."""

    def __init__(
        self,
        project_dir: Path,
        overrides: Sequence[str] = (),
        *,
        say: Callable[[str], None] = lambda line: None,
        check: Callable[[Config], None] = lambda config: None,
    ) -> None:
        """`overrides`: the command's --set values; `say`: where a line for the server's log goes (what the opening found, why it failed);
        `check`: what the server cannot serve, raised as a ConfigError before the workspace is opened (MCP: confirm mode)."""
        self.project_dir = project_dir
        self.overrides = list(overrides)
        self._say = say
        self._check = check
        self._workspace: Workspace | None = None
        self._opening = threading.Lock()
        self._attempts = 0  # openings finished so far, opened or failed
        self._failure: TaskWeaverError | None = None  # why the last one failed
        self._closed = False

    @property
    def opened(self) -> Workspace | None:
        """The workspace if a call opened it, else None (an answer that does not need it opens nothing)."""
        return self._workspace

    def get(self) -> Workspace:
        """The workspace, opened now when no call has yet; the TaskWeaverError that says why it cannot be (it blocks: call it off the event loop)."""
        workspace = self._workspace
        if workspace is not None:
            return workspace
        attempts = self._attempts
        with self._opening:
            if self._workspace is not None:
                return self._workspace
            if self._failure is not None and self._attempts != attempts:
                raise self._failure  # an opening failed while this call waited for it: its answer, not a second wait
            self._failure = None
            try:
                self._workspace = self._open()
            except TaskWeaverError as exc:
                self._failure = exc
                raise
            finally:
                self._attempts += 1
            return self._workspace

    def _open(self) -> Workspace:
        if self._closed:
            raise TaskWeaverError("the server is shutting down: the project is closed")
        # The config's modules and the session's stack, imported by the first call that needs them.
        from taskweaver_lite.config.file import load_config
        from taskweaver_lite.session.workspace import Workspace

        try:
            config = load_config(self.project_dir, self.overrides)
            self._check(config)
            workspace = Workspace(config)
        except TaskWeaverError as exc:
            self._say(f"taskweaver-lite: the project could not be opened (the next call tries again): {exc}")
            raise
        for line in [*config.notices, *(entry.line() for entry in workspace.plugins.broken), *workspace.roles.problems]:
            self._say(line)
        return workspace

    def close(self) -> None:
        """Close the workspace if it was opened (its sessions closed first); no call opens it after this."""
        with self._opening:
            self._closed = True
            workspace, self._workspace = self._workspace, None
        if workspace is not None:
            workspace.close()

    def __enter__(self) -> LazyWorkspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
