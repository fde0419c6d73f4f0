"""A session's life in the store: a new one, a stored one resumed, a fresh one in place of another (`/reset`), one deleted.

    session = open_session(config)                        # a new stored session on config's store
    session, report = resume_session(config, "last")      # its record taken back, its kernel rebuilt by replay
    session = reset_session(session)                      # the old one closed, stays stored
    delete_session(config, "20261127-...", store=store)   # gone for good, with its tips and its kernel

A `Workspace` calls these with its store and its catalogs (roles, plugins, experience), so that
nothing is opened or looked for twice; without them a session opens `config`'s store (and closes
it with itself) and finds the roles and plugins. The order is the store's first (claim, create or load),
then the models and the kernel, then the session: a failure on the way releases the claim and
closes a store opened for it (`OpeningGuard`), and a kernel already booting is shut down.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from taskweaver_lite.config.settings import Config
from taskweaver_lite.errors import SessionBusyError
from taskweaver_lite.kernel.choice import executor_factory
from taskweaver_lite.kernel.interface import Executor, ExecutorFactory
from taskweaver_lite.knowledge.experience import Experience
from taskweaver_lite.llm.client import ChatModel
from taskweaver_lite.plugins.catalog import PluginCatalog, discover
from taskweaver_lite.records.events import Listener
from taskweaver_lite.roles.registry import RoleCatalog, discover_roles
from taskweaver_lite.safety.confirm import ConfirmCell
from taskweaver_lite.safety.workfiles import copy_folder, owner_only_folder
from taskweaver_lite.session.model_choice import role_models
from taskweaver_lite.session.session import Session, SessionOptions
from taskweaver_lite.store.interface import SessionClaim, Store
from taskweaver_lite.store.opening import open_store

Replayed = Callable[[int, int], None]  # told (cells re-run, cells in all) as a replay goes

# `/reset` copies at most this many times session.max_upload_bytes of working files.
RESET_COPY_UPLOADS = 4
# Seconds a deletion holds the session's lease (so no server starts a request in it meanwhile).
DELETE_LEASE_SECONDS = 60.0


@dataclass(frozen=True)
class Catalogs:
    """What a Workspace found once in the project and gives every session: its roles, its plugins and its experience."""

    roles: RoleCatalog
    plugins: PluginCatalog
    experience: Experience  # everyone's view; each session takes its owner's (`for_owner`)


@dataclass(frozen=True)
class ResumeReport:
    """What a resume brought back, and what it could not."""

    session_id: str
    rounds: int
    cut_off: tuple[int, ...]  # rounds that were running when the program stopped, now failed
    replayed: int  # cells re-run to rebuild the kernel's variables
    replay_failures: int
    lost: tuple[str, ...]  # variables not rebuilt (replay skipped)
    unrestored: tuple[str, ...] = ()  # loaded files a new kernel's folder lacks and the store had no bytes of


def open_session(
    config: Config,
    *,
    model: ChatModel | None = None,
    executor: ExecutorFactory | None = None,
    listeners: Iterable[Listener] = (),
    session_id: str | None = None,
    confirm: ConfirmCell | None = None,
    owner: str | None = None,
    store: Store | None = None,
    claim: bool = True,
    catalogs: Catalogs | None = None,
    limit: int | None = None,
) -> Session:
    """Start a stored session: its kernel boots in the background while the first request is typed.

    `model` defaults to the openai-SDK client for `config.llm`; `executor` builds the session's
    executor from its session folder (default: a local Jupyter kernel). `confirm` turns on
    confirm mode: it is asked about each cell before the cell runs. `owner`: the user it belongs to.
    `store`: a store the caller keeps open and closes (default: `config`'s, opened for this session);
    `claim=False` takes no claim on the session for this process (replicas guard each request instead).
    `catalogs`: the project's roles and plugins as a `Workspace` found them (default: discovered now).
    `limit`: the most sessions `owner` may have (SessionLimitReached, and nothing made, when they have as many).
    """
    session_id = session_id or new_session_id()
    owns_store = store is None
    store = store or open_store(config)
    with OpeningGuard(store, owned=owns_store) as guard:
        lock = guard.lock = store.lock(session_id) if claim else None
        store.create_session(session_id, started=time.time(), owner=owner, limit=limit)
        parts = SessionOptions(store=store, lock=lock, owner=owner, owns_store=owns_store, confirm=confirm, **_found(catalogs))
        return _assemble(config, session_id, parts, model=model, executor=executor, listeners=listeners)


def resume_session(
    config: Config,
    ref: str,
    *,
    replay: bool = True,
    model: ChatModel | None = None,
    executor: ExecutorFactory | None = None,
    listeners: Iterable[Listener] = (),
    on_replay: Replayed | None = None,
    confirm: ConfirmCell | None = None,
    owner: str | None = None,
    store: Store | None = None,
    claim: bool = True,
    catalogs: Catalogs | None = None,
) -> tuple[Session, ResumeReport]:
    """Continue a stored session ('last' or an id): conversation, summaries and, by replay, the kernel's variables.

    With `owner`, only that user's sessions are found (another's is unknown, as if absent); `store`,
    `claim` and `catalogs` as in `open_session`.
    """
    owns_store = store is None
    store = store or open_store(config)
    with OpeningGuard(store, owned=owns_store) as guard:
        session_id = store.resolve(ref, owner=owner)
        lock = guard.lock = store.lock(session_id) if claim else None
        cut_off = store.mark_interrupted(session_id)
        stored = store.load(session_id)
        cells = store.successful_cells(session_id) if replay else []
        parts = SessionOptions(
            store=store, lock=lock, owner=stored.owner, owns_store=owns_store, usage_before=stored.usage, confirm=confirm, **_found(catalogs)
        )
        session = _assemble(config, session_id, parts, model=model, executor=executor, listeners=listeners)
    session.restore(stored)
    fresh = replay and not session.executor.kept_variables()  # not attached to a gateway kernel that outlived the server before
    if not fresh:
        cells = []  # the variables (and files) are there
    unrestored = restore_uploads(session, store) if fresh else ()
    failed_cells = replay_cells(session.executor, cells, on_replay=on_replay)
    if not replay:
        session.variables.lost = [v.name for v in stored.last_variables]
    report = ResumeReport(
        session_id=session_id,
        rounds=len(stored.rounds),
        cut_off=cut_off,
        replayed=len(cells),
        replay_failures=failed_cells,
        lost=tuple(session.variables.lost),
        unrestored=unrestored,
    )
    return session, report


def restore_uploads(session: Session, store: Store) -> tuple[str, ...]:
    """Put the session's loaded files back into a new kernel's folder from the store, before its cells are replayed.

    A store that keeps files (PostgreSQL) has their bytes: a kernel on a gateway that lost its folder
    gets them again. A file the store has no bytes of (over its size limit) is named in what is
    returned, and the Planner is told with the next request that it must be loaded again, rather
    than the replayed cells and the next ones failing on a file that is not there.
    """
    if not store.keeps_files:
        return ()
    missing: list[str] = []
    for name in dict.fromkeys(load.name for load in session.loads):
        data = store.file(session.id, "upload", name)
        if data is None:
            missing.append(name)
            session.note(f"The file {name}, loaded earlier, is no longer in the working folder and could not be restored: ask the user to load it again.")
            continue
        with tempfile.TemporaryDirectory() as folder:
            copy = Path(folder) / name
            copy.write_bytes(data)
            session.executor.upload(copy, name=name)
    return tuple(missing)


def reset_session(session: Session) -> Session:
    """Start over: a new session with a fresh kernel and a copy of `session`'s working files, on the same store and catalogs.

    `session` is closed (and stays stored, resumable); use the returned one from now on. Its
    `reset_report` says what was copied and what was not (links, odd files, past the bounds).
    """
    options = session.options
    fresh = open_session(
        session.config,
        model=session.model,
        executor=options.executor_factory,
        listeners=session.listeners,
        confirm=options.confirm,
        owner=session.owner,
        store=None if options.owns_store else session.store,  # a workspace's store stays the workspace's
        claim=options.lock is not None,
        catalogs=Catalogs(session.roles, session.plugins, session.experience),
    )
    # The old kernel wrote this folder: no link is followed, and the copy is bounded (count, bytes).
    limit = RESET_COPY_UPLOADS * session.config.session.max_upload_bytes
    fresh.reset_report = copy_folder(session.working_dir, fresh.working_dir, max_bytes=limit)
    fresh.owns_model, session.owns_model = session.owns_model, False  # the model client lives on in the new session
    session.close()
    return fresh


def delete_session(config: Config, ref: str, *, store: Store, owner: str | None = None, claim: bool = True) -> str:
    """Delete a stored session for good; returns its id. SessionBusyError while it is open or answering elsewhere.

    Gone with it: its rounds, events and model calls, its kept files, the tips saved from it, its
    folder on this machine, and its kernel on `execution.kernel_gateway` if one is still running.
    `ref` as for a resume ('last', an id or a unique start of one), among `owner`'s sessions when
    given. `claim=False`: the caller already holds the session's lease (a replica's request).
    """
    session_id = store.resolve(ref, owner=owner)
    holder = f"delete-{uuid.uuid4().hex[:8]}"
    claimed = store.lock(session_id) if claim else None  # a chat or a one-process server that has it open refuses
    try:
        if claim and store.take_lease(session_id, holder, seconds=DELETE_LEASE_SECONDS) is None:
            raise SessionBusyError(f"session {session_id} is answering a request on a server: wait for it to finish (or stop it), then delete it")
        kernel_id = store.load(session_id).kernel_id
        store.delete_session(session_id)  # its lease with it
    finally:
        if claimed is not None:
            claimed.release()
    if config.execution.kernel_gateway is not None:
        _end_on_gateway(config, session_id, kernel_id)
    shutil.rmtree(config.sessions_dir / session_id, ignore_errors=True)
    return session_id


def _end_on_gateway(config: Config, session_id: str, kernel_id: str | None) -> None:
    """End a deleted session's kernel on the gateway, if it still runs there; on `taskweaver-lite gateway`, its folder there goes too."""
    from taskweaver_lite.kernel.gateway.kernel import GatewayKernel  # the gateway extra, as in kernel/choice.py

    assert config.execution.kernel_gateway is not None
    kernel = GatewayKernel(config.execution.kernel_gateway)
    kernel.remove_session(session_id)  # a plain gateway has no such route: its culling ends the kernel, its folder stays
    if kernel_id is not None and kernel.attach(kernel_id):
        kernel.shutdown()
    else:
        kernel.release()


def replay_cells(executor: Executor, cells: Sequence[str], *, on_replay: Replayed | None = None) -> int:
    """Re-run `cells` in order to rebuild the kernel's variables; how many failed."""
    failed = 0
    for number, code in enumerate(cells, 1):
        failed += not executor.run(code).success
        if on_replay is not None:
            on_replay(number, len(cells))
    return failed


def _assemble(
    config: Config, session_id: str, parts: SessionOptions, *, model: ChatModel | None, executor: ExecutorFactory | None, listeners: Iterable[Listener]
) -> Session:
    """The session on its claimed store record: roles checked, models built, its folder made private, its kernel started."""
    roles = parts.roles or discover_roles(config.project_dir, enabled=config.session.roles, config=config)
    roles.check_names()  # a typo in session.roles stops here, before the kernel starts or a model is called
    chat_model = model or role_models(config, roles=roles.enabled)
    plugins = parts.plugins or discover(config.project_dir)
    for folder in (config.sessions_dir, config.sessions_dir / session_id):
        owner_only_folder(folder)  # conversations, outputs and sockets: no other user (or kernel) may look in
    running = (executor or executor_factory(config, plugins=plugins.enabled))(config.sessions_dir / session_id)
    options = replace(parts, executor_factory=executor, plugins=plugins, roles=roles, owns_model=model is None)
    try:
        return Session(config, model=chat_model, executor=running, session_id=session_id, listeners=listeners, options=options)
    except BaseException:  # bad examples or prompts: the kernel already booting must not linger
        running.shutdown()
        raise


def _found(catalogs: Catalogs | None) -> dict[str, Any]:
    """SessionOptions' roles, plugins and experience from a workspace's catalogs (none: the session finds them)."""
    return {} if catalogs is None else {"roles": catalogs.roles, "plugins": catalogs.plugins, "experience": catalogs.experience}


def new_session_id() -> str:
    """A sortable, readable session id: date, time, and a short random suffix."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


class OpeningGuard:
    """Closes the store, and releases the session lock once taken, if opening a session fails."""

    def __init__(self, store: Store, *, owned: bool) -> None:
        self.store = store
        self.owned = owned
        self.lock: SessionClaim | None = None

    def __enter__(self) -> OpeningGuard:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is not None:
            if self.lock is not None:
                self.lock.release()
            if self.owned:
                self.store.close()
