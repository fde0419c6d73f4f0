"""A project opened once: its config, its store, and its catalogs of roles and plugins.

    workspace = Workspace.load("project", ["llm.model=gpt-4o"])
    session = workspace.new_session()                     # or: session, report = workspace.resume_session("last")
    ...
    session.close(); workspace.close()

Every session a workspace opens shares its store (on PostgreSQL, one connection pool) and the roles
and plugins it found, so opening or resuming a session reads the config once and opens the store
once: a resume asks the store for the session's remembered `--set` values and its record, then the
session runs. `reconfigured` gives the same workspace under a new config (those remembered values),
keeping the store. The chat starts from one; the session's experience (the tips its owner may see)
stays with the session.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from taskweaver_lite.config import Config
from taskweaver_lite.config_file import load_config
from taskweaver_lite.plugins.catalog import PluginCatalog, discover
from taskweaver_lite.roles.registry import RoleCatalog, discover_roles
from taskweaver_lite.session import ResumeReport, Session
from taskweaver_lite.store.interface import SessionEntry, Store
from taskweaver_lite.store.opening import open_store


class Workspace:
    """The project's config, store, roles and plugins, found once and shared by the sessions opened from it."""

    def __init__(self, config: Config, *, store: Store | None = None) -> None:
        """Open `config`'s store (unless one is given, which stays the caller's to close) and find the roles and plugins."""
        self.config = config
        self.store = store or open_store(config)
        self._owns_store = store is None
        self.roles: RoleCatalog = discover_roles(config.project_dir, enabled=config.session.roles, config=config)
        self.plugins: PluginCatalog = discover(config.project_dir)

    @classmethod
    def load(cls, project_dir: str | Path, overrides: Sequence[str] = ()) -> Workspace:
        """The workspace of the project folder, with `--set` overrides applied to its config."""
        return cls(load_config(project_dir, list(overrides)))

    def reconfigured(self, config: Config) -> Workspace:
        """This workspace under `config` (its roles and plugins found again), on the same store."""
        other = Workspace(config, store=self.store)
        other._owns_store, self._owns_store = self._owns_store, False
        return other

    def new_session(self, **options: Any) -> Session:
        """A new stored session on this workspace's store and catalogs (`options` as for Session.open)."""
        return Session.open(self.config, store=self.store, catalogs=(self.roles, self.plugins), **options)

    def resume_session(self, ref: str, **options: Any) -> tuple[Session, ResumeReport]:
        """A stored session continued ('last', an id or a unique start of one); `options` as for Session.resume."""
        return Session.resume(self.config, ref, store=self.store, catalogs=(self.roles, self.plugins), **options)

    def remembered_overrides(self, ref: str) -> list[str]:
        """The `--set` values the session `ref` names was started with (a resume applies them again)."""
        return self.store.overrides(self.store.resolve(ref))

    def sessions(self, *, owner: str | None = None) -> list[SessionEntry]:
        """The stored sessions (of `owner` only, when given), most recently active first."""
        return self.store.list_sessions(owner=owner)

    def close(self) -> None:
        """Close the store, when this workspace opened it (its sessions must be closed first)."""
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
