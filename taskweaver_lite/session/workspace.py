"""A project opened once: its config, its store, its catalogs of roles and plugins, and its experience.

    with Workspace.load("project", ["llm.model=gpt-4o"]) as workspace:
        session = workspace.new_session()                 # or: session, report = workspace.resume_session("last")
        ...
        session.close()

The chat, the web server and eval each start from one. Every session a workspace opens shares its
store (on PostgreSQL, one connection pool) and the roles and plugins it found, so opening or
resuming a session reads the config once and opens the store once: a resume asks the store for
the session's remembered `--set` values and its record, then the session runs. `reconfigured`
gives the same store and plugins under another config (those remembered values, an eval case's
settings); the roles are found again, since the config names which are enabled. The experience is
the project's knowledge, everyone's tips: each session takes the view its owner may see, and the
handcrafted tip files are read once for all of them (again only when they change).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from taskweaver_lite.config.file import load_config
from taskweaver_lite.config.settings import Config
from taskweaver_lite.kernel.interface import ExecutorFactory
from taskweaver_lite.knowledge.experience import Experience
from taskweaver_lite.llm.client import ChatModel
from taskweaver_lite.plugins.catalog import PluginCatalog, discover
from taskweaver_lite.records.events import Listener
from taskweaver_lite.roles.registry import RoleCatalog, discover_roles
from taskweaver_lite.safety.confirm import ConfirmCell
from taskweaver_lite.session.assembly import Catalogs, Replayed, ResumeReport, delete_session, open_session, resume_session
from taskweaver_lite.session.session import Session
from taskweaver_lite.store.interface import SessionEntry, Store
from taskweaver_lite.store.opening import open_store


class Workspace:
    """The project's config, store, roles, plugins and experience, found once and shared by the sessions opened from it."""

    def __init__(self, config: Config, *, store: Store | None = None, plugins: PluginCatalog | None = None) -> None:
        """Open `config`'s store (unless one is given, which stays the caller's to close) and find the roles and plugins."""
        self.config = config
        self.store = store if store is not None else open_store(config)
        self._owns_store = store is None
        self.roles: RoleCatalog = discover_roles(config.project_dir, enabled=config.session.roles, config=config)
        self.plugins: PluginCatalog = plugins or discover(config.project_dir)
        self.experience = Experience(store=self.store, folder=config.experience_dir, settings=config.experience)  # everyone's tips

    @classmethod
    def load(cls, project_dir: str | Path, overrides: Sequence[str] = ()) -> Workspace:
        """The workspace of the project folder, with `--set` overrides applied to its config."""
        return cls(load_config(project_dir, list(overrides)))

    @property
    def catalogs(self) -> Catalogs:
        """The roles, plugins and experience every session opened here is given."""
        return Catalogs(self.roles, self.plugins, self.experience)

    def reconfigured(self, config: Config) -> Workspace:
        """This workspace's store and plugins under `config`, its roles found again; the store stays this workspace's to close."""
        same_project = config.project_dir == self.config.project_dir
        return Workspace(config, store=self.store, plugins=self.plugins if same_project else None)

    def new_session(
        self,
        *,
        model: ChatModel | None = None,
        executor: ExecutorFactory | None = None,
        listeners: Iterable[Listener] = (),
        session_id: str | None = None,
        confirm: ConfirmCell | None = None,
        owner: str | None = None,
        claim: bool = True,
        limit: int | None = None,
    ) -> Session:
        """A new stored session on this workspace's store and catalogs (each option as for `assembly.open_session`)."""
        return open_session(
            self.config,
            model=model,
            executor=executor,
            listeners=listeners,
            session_id=session_id,
            confirm=confirm,
            owner=owner,
            store=self.store,
            claim=claim,
            catalogs=self.catalogs,
            limit=limit,
        )

    def resume_session(
        self,
        ref: str,
        *,
        replay: bool = True,
        model: ChatModel | None = None,
        executor: ExecutorFactory | None = None,
        listeners: Iterable[Listener] = (),
        on_replay: Replayed | None = None,
        confirm: ConfirmCell | None = None,
        owner: str | None = None,
        claim: bool = True,
    ) -> tuple[Session, ResumeReport]:
        """A stored session continued ('last', an id or a unique start of one); each option as for `assembly.resume_session`."""
        return resume_session(
            self.config,
            ref,
            replay=replay,
            model=model,
            executor=executor,
            listeners=listeners,
            on_replay=on_replay,
            confirm=confirm,
            owner=owner,
            store=self.store,
            claim=claim,
            catalogs=self.catalogs,
        )

    def delete_session(self, ref: str, *, owner: str | None = None) -> str:
        """Delete a stored session for good (see assembly.delete_session); returns its id."""
        return delete_session(self.config, ref, store=self.store, owner=owner)

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
