"""A session: one conversation, one kernel, and the turn loop that connects them.

    config = load_config("project")
    with Session.open(config) as session:
        print(session.ask("load sales.csv; which region grew fastest?").answer)

A turn runs hop by hop: the role the user talks to (the Planner) answers the user or delegates a
step to an enabled role by its alias; that role's reply goes back to it. Which roles take part is
the role registry's (`session.roles`, roles/registry.py); the session names none of them. Each role
sees only the posts it sent or received and keeps its own prompt history and compression. A
broken project role is left out with one line (`role_problems`); a project role that fails on a
request (its model unreachable, its class raising) answers with the reason and the turn goes on.
Listeners (the CLI, the store) observe every event; they never drive the turn.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from taskweaver_lite.assembly import OpeningGuard, default_executor, kept_variables, new_session_id, role_models
from taskweaver_lite.config import DISTILLER, FOLDER, Config, LLMOverrides, RoleSectionConfig, merged_llm
from taskweaver_lite.confirm import ConfirmCell
from taskweaver_lite.errors import ConfigError, RoundFailedError, StoreError, TaskWeaverError
from taskweaver_lite.events import Event, FileLoaded, Listener, ModelCalled, PostAdded, ReplyStreamed, RoundEnded, RoundStarted, Working
from taskweaver_lite.execution import Executor, ExecutorFactory, Variable
from taskweaver_lite.knowledge.distil import distil
from taskweaver_lite.knowledge.experience import Experience
from taskweaver_lite.knowledge.tips import Tip
from taskweaver_lite.llm.client import CallRecord, ChatModel, MeteredModel, Usage, scope_cache
from taskweaver_lite.llm.tokens import get_tokenizer
from taskweaver_lite.memory.compression import ContextSettings, RoleContext
from taskweaver_lite.memory.conversation import USER, Conversation, Post, Round
from taskweaver_lite.memory.summary import CompressionState
from taskweaver_lite.memory.variables import LiveVariables
from taskweaver_lite.plugins.catalog import PluginCatalog, discover
from taskweaver_lite.roles.builtin import BuiltRole, CodeInterpreterRole, PlannerRole, SessionParts, build_role
from taskweaver_lite.roles.planner import list_working_files
from taskweaver_lite.roles.registry import RoleCatalog, RoleSpec, discover_roles
from taskweaver_lite.roles.role import RepairTurns, Role
from taskweaver_lite.roles.worker import RoleRequest, RoleTools, Turn
from taskweaver_lite.store.interface import INTERRUPTED_ERROR, SessionClaim, Store
from taskweaver_lite.store.opening import open_store
from taskweaver_lite.store.recorder import StoreRecorder
from taskweaver_lite.uploads import check_upload
from taskweaver_lite.workfiles import CopyReport, copy_folder, owner_only_folder

CANCELLED_ERROR = "Cancelled by the user."  # a failed round's error after Ctrl-C or Stop

# `/reset` copies at most this many times session.max_upload_bytes of working files.
RESET_COPY_UPLOADS = 4

# Experience tips take at most this fraction of a role's prompt budget (and experience.max_tokens).
EXPERIENCE_SHARE = 8


Catalogs = tuple[RoleCatalog, PluginCatalog]  # a project's roles and plugins, as a Workspace found them once


@dataclass(frozen=True)
class ResumeReport:
    """What a resume brought back, and what it could not."""

    session_id: str
    rounds: int
    cut_off: tuple[int, ...]  # rounds that were running when the program stopped, now failed
    replayed: int  # cells re-run to rebuild the kernel's variables
    replay_failures: int
    lost: tuple[str, ...]  # variables not rebuilt (replay skipped)


UNDO_FOLD_WAIT = 30.0  # seconds /undo waits for a running fold (it may be folding the request being undone)


def numbered(requests: list[str]) -> str:
    """`session.suggested_requests` as the numbered lines a user picks from."""
    return "\n".join(f"{number}. {text}" for number, text in enumerate(requests, 1))


def suggested(text: str, requests: list[str]) -> str:
    """The suggested request `text` numbers (1-based), or `text` as it is."""
    number = text.strip()
    # isdecimal, not isdigit: int() refuses '²'; and it refuses numbers of thousands of digits.
    index = int(number) if number.isdecimal() and len(number) < 10 else 0
    return requests[index - 1] if 1 <= index <= len(requests) else text


@dataclass(frozen=True)
class SessionOptions:
    """What a session may be given besides its config, model and executor (Session.open and resume fill it in)."""

    store: Store | None = None
    lock: SessionClaim | None = None
    owner: str | None = None  # the user the session belongs to (None: no users)
    owns_store: bool = True  # opened for this session (closed with it), not handed in by a server that shares it
    usage_before: Usage = Usage()
    executor_factory: ExecutorFactory | None = None  # how /reset builds the next session's executor
    plugins: PluginCatalog | None = None
    roles: RoleCatalog | None = None  # default: discovered from the project and session.roles
    owns_model: bool = False  # built by us (not passed in): we close its HTTP connections
    confirm: ConfirmCell | None = None  # confirm mode: a person runs, edits or skips each cell


@dataclass(frozen=True)
class ActiveRole:
    """An enabled role in this session: its declaration, its tools (model, context, folders) and its behaviour."""

    spec: RoleSpec
    tools: RoleTools
    role: BuiltRole

    @property
    def context(self) -> RoleContext:
        """The role's prompt history and compression."""
        return self.tools.context


class Session:
    """One conversation with its kernel: ask, load files, reset, and inspect the context."""

    def __init__(
        self,
        config: Config,
        *,
        model: ChatModel,
        executor: Executor,
        session_id: str,
        listeners: Iterable[Listener] = (),
        options: SessionOptions = SessionOptions(),
    ) -> None:
        self.config = config
        self.options = options
        self.plugins = options.plugins or PluginCatalog()  # every plugin found, broken ones with their errors; the enabled ones are shown
        self.roles = options.roles or discover_roles(config.project_dir, enabled=config.session.roles, config=config)
        self.roles.check_names()
        self.id = session_id
        self.executor = executor
        self.store = options.store
        self.owner = options.owner
        self.conversation = Conversation()
        self._lock = options.lock
        self._listeners = list(listeners)
        self._model = MeteredModel(model, on_call=self._on_call, usage=options.usage_before)
        scope_cache(model, name=session_id)  # prompt cache keys per session and role
        self._owns_model = options.owns_model
        self._notes: list[str] = []
        # Set once the program running the request is going away (a server past its drain timeout):
        # the interrupt that follows fails the round as cut off, as if the process had died, not as cancelled.
        self.ending = False
        self.reset_report: CopyReport | None = None  # set on the session `reset` made: what it copied over
        self.loads: list[FileLoaded] = []  # every /load, for /history and the exports
        self._lost: list[str] = []
        self._recency: dict[str, int] = {}  # variable name -> the last cell that created or changed it
        self._cells = 0
        self.experience = Experience(store=self.store, owner=options.owner, folder=config.experience_dir, settings=config.experience)
        self.active = self._build_roles()
        self._hook_experience()
        # Each role's view of the finished rounds, extended as rounds finish (a view costs a copy of every round).
        self._views: dict[str, list[Round]] = {alias: [] for alias in self.active}
        self._viewed = 0
        entry = next((active for active in self.active.values() if isinstance(active.role, PlannerRole)), None)
        if entry is None or not isinstance(entry.role, PlannerRole):
            raise ConfigError("session.roles must include planner: it is the role the user talks to")
        self._entry, self._planner = entry, entry.role
        if self.store is not None:
            self._listeners.append(StoreRecorder(self.store, session_id, compression_state=self._compression_state, working_dir=self.working_dir))

    @property
    def working_dir(self) -> Path:
        """The folder the session's code reads and writes files in."""
        return self.executor.working_dir

    @property
    def role_problems(self) -> list[str]:
        """One line per role left out (a broken role file, a class that failed to import, a name that is no role)."""
        return self.roles.problems

    def _build_roles(self) -> dict[str, ActiveRole]:
        """The enabled roles by alias, each with its own context (its own section, model and tokenizer)."""
        team = self.roles.enabled
        parts = SessionParts(
            executor=self.executor,
            plugins=self.plugins.enabled,
            team=team,
            checks=self.config.code_interpreter,
            max_hops=self.config.session.max_internal_hops,
            working_files=lambda: list_working_files(self.working_dir),
            confirm=self.options.confirm,
        )
        active: dict[str, ActiveRole] = {}
        for spec in team:
            tools = self._tools(spec)
            active[spec.alias] = ActiveRole(spec, tools, build_role(spec, tools, parts))
        return active

    def _tools(self, spec: RoleSpec) -> RoleTools:
        section = spec.section(self.config.role_section(spec.key))
        settings = ContextSettings.of(self.config, spec.key, section=section, label=spec.label, fold_template=spec.fold_prompt)
        live = self.live_variables if spec.kernel_variables else None
        context = RoleContext(settings, model=self._model, tokenizer=get_tokenizer(settings.llm.tokenizer), live_variables=live, on_fold=self._emit)
        stream = (lambda delta: self._emit(ReplyStreamed(spec.key, delta, spec.alias))) if spec.streams else None
        return RoleTools(
            key=spec.key,
            alias=spec.alias,
            config=section,
            options={**spec.options, **(section.model_extra or {})},  # the role's own keys: its file's, the project config's over them
            model=self._model,
            context=context,
            project_dir=self.config.project_dir,
            working_dir=self.working_dir,
            prompt=spec.prompt,
            intro=spec.intro,
            on_delta=stream,
        )

    @classmethod
    def open(
        cls,
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
    ) -> Session:
        """Start a stored session: its kernel boots in the background while the first request is typed.

        `model` defaults to the openai-SDK client for `config.llm`; `executor` builds the session's
        executor from its session folder (default: a local Jupyter kernel). `confirm` turns on
        confirm mode: it is asked about each cell before the cell runs. `owner`: the user it belongs to.
        `store`: a store the caller keeps open and closes (default: `config`'s, opened for this session);
        `claim=False` takes no claim on the session for this process (replicas guard each request instead).
        `catalogs`: the project's roles and plugins as a `Workspace` found them (default: discovered now).
        """
        session_id = session_id or new_session_id()
        owns_store = store is None
        store = store or open_store(config)
        with OpeningGuard(store, owned=owns_store) as guard:
            lock = guard.lock = store.lock(session_id) if claim else None
            store.create_session(session_id, started=time.time(), owner=owner)
            parts = SessionOptions(store=store, lock=lock, owner=owner, owns_store=owns_store, confirm=confirm, **_catalogs(catalogs))
            return cls._assemble(config, session_id, parts, model=model, executor=executor, listeners=listeners)

    @classmethod
    def resume(
        cls,
        config: Config,
        ref: str,
        *,
        replay: bool = True,
        model: ChatModel | None = None,
        executor: ExecutorFactory | None = None,
        listeners: Iterable[Listener] = (),
        on_replay: Callable[[int, int], None] | None = None,
        confirm: ConfirmCell | None = None,
        owner: str | None = None,
        store: Store | None = None,
        claim: bool = True,
        catalogs: Catalogs | None = None,
    ) -> tuple[Session, ResumeReport]:
        """Continue a stored session ('last' or an id): conversation, summaries and, by replay, the kernel's variables.

        With `owner`, only that user's sessions are found (another's is unknown, as if absent); `store`,
        `claim` and `catalogs` as in `open`.
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
                store=store, lock=lock, owner=stored.owner, owns_store=owns_store, usage_before=stored.usage, confirm=confirm, **_catalogs(catalogs)
            )
            session = cls._assemble(config, session_id, parts, model=model, executor=executor, listeners=listeners)
        session._restore(stored.rounds, loads=stored.loads, compression=stored.compression)
        if cells and kept_variables(session.executor):
            cells = []  # attached to the gateway kernel that outlived the server before: the variables are there
        failed_cells = 0
        for number, code in enumerate(cells, 1):
            failed_cells += not session.executor.run(code).success
            if on_replay is not None:
                on_replay(number, len(cells))
        if not replay:
            session._lost = [v.name for v in stored.last_variables]
        report = ResumeReport(
            session_id=session_id,
            rounds=len(stored.rounds),
            cut_off=cut_off,
            replayed=len(cells),
            replay_failures=failed_cells,
            lost=tuple(session._lost),
        )
        return session, report

    def _restore(self, rounds: Sequence[Round], *, loads: Sequence[FileLoaded], compression: Mapping[str, dict[str, Any]]) -> None:
        """Take back a stored session's record: its rounds, its loads, and each role's summary (by the role's key)."""
        self.conversation.rounds = list(rounds)
        self.loads = list(loads)
        # Files loaded after the last request (perhaps by another server) are announced by the next one.
        self._notes = [self._planner.file_note(load.name) for load in self.loads if load.after_round == len(self.conversation.rounds)]
        for context in self.contexts().values():
            saved = compression.get(context.role)
            if saved:
                context.restore(CompressionState.from_dict(saved))

    @classmethod
    def _assemble(
        cls,
        config: Config,
        session_id: str,
        parts: SessionOptions,
        *,
        model: ChatModel | None,
        executor: ExecutorFactory | None,
        listeners: Iterable[Listener],
    ) -> Session:
        roles = parts.roles or discover_roles(config.project_dir, enabled=config.session.roles, config=config)
        roles.check_names()  # a typo in session.roles stops here, before the kernel starts or a model is called
        chat_model = model or role_models(config, roles=roles.enabled)
        plugins = parts.plugins or discover(config.project_dir)
        for folder in (config.sessions_dir, config.sessions_dir / session_id):
            owner_only_folder(folder)  # conversations, outputs and sockets: no other user (or kernel) may look in
        running = (executor or default_executor(config, plugins=plugins.enabled))(config.sessions_dir / session_id)
        options = replace(parts, executor_factory=executor, plugins=plugins, roles=roles, owns_model=model is None)
        try:
            return cls(config, model=chat_model, executor=running, session_id=session_id, listeners=listeners, options=options)
        except BaseException:  # bad examples or prompts: the kernel already booting must not linger
            running.shutdown()
            raise

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_listener(self, listener: Listener, *, first: bool = False) -> None:
        """Observe every event from now on (the CLI renderer, the page); `first`: before the other listeners.

        Whatever the order, the store records each event before any listener sees it (`_emit`).
        """
        if first:
            self._listeners.insert(0, listener)
        else:
            self._listeners.append(listener)

    def ask(self, text: str) -> Round:
        """Handle one user request to the end and return its round.

        A reply that cannot be repaired fails the round and the session goes on. A model error
        (unreachable, refused) fails the round and is raised. Ctrl-C (KeyboardInterrupt) cancels
        the step, fails the round, and is raised after the kernel has stopped. A request's number
        in `session.suggested_requests` asks that request: the round holds its words.
        """
        text = suggested(text, self.config.session.suggested_requests)
        views = self._role_views()
        rnd = self.conversation.start_round(text)
        message = "\n\n".join([*self._notes, text])
        try:
            self._emit(RoundStarted(rnd))
            self._add(rnd, Post(send_from=USER, send_to=self._entry.spec.alias, message=message))
            self._run_hops(rnd, views)
            rnd.state = "finished"
            self._notes.clear()  # only now: a failed round's notes go out again with the next request
        except RoundFailedError as exc:
            self._fail(rnd, str(exc))
            return rnd
        except TaskWeaverError as exc:  # the model or the kernel failed: the round fails, the record stays
            self._fail(rnd, str(exc))
            raise
        except KeyboardInterrupt:
            self._fail(rnd, INTERRUPTED_ERROR if self.ending else CANCELLED_ERROR)
            raise
        self._emit(RoundEnded(rnd))
        self._after_round()
        return rnd

    def _run_hops(self, rnd: Round, views: dict[str, list[Round]]) -> None:
        """The entry role answers or delegates; each delegated role's reply goes back to it, up to max_internal_hops."""
        turn = Turn(RepairTurns(self.config.session.max_repair_attempts), add_post=lambda p: self._add(rnd, p), notify=self._emit)
        max_hops = self.config.session.max_internal_hops
        entry = self._entry
        hops = 0
        while True:
            self._emit(Working("planner_thinking"))
            post = entry.role.reply(RoleRequest(rnd.posts[-1], views[entry.spec.alias], rnd, turn), entry.tools)
            if post.send_to != USER and hops >= max_hops:
                self._add(rnd, self._planner.hop_limit_post(hops=hops, last=_last_report(rnd, to=entry.spec.alias), plan=post.plan))
                return
            self._add(rnd, post)
            if post.send_to == USER:
                return
            hops += 1
            self._add(rnd, self._consult(self.active[post.send_to], post, rnd, views, turn))

    def _consult(self, active: ActiveRole, post: Post, rnd: Round, views: dict[str, list[Round]], turn: Turn) -> Post:
        """A delegated role's reply to `post`; a project role that fails answers with the reason instead."""
        spec = active.spec
        request = RoleRequest(post, views[spec.alias], rnd, turn)
        if spec.builtin:
            return active.role.reply(request, active.tools)
        self._emit(Working("role_working", spec.label))
        try:
            reply = active.role.reply(request, active.tools)
        except Exception as exc:  # noqa: BLE001 - a project role's failure (its model, its code) must not end the request: the Planner hears why
            return request.answer(role_failure(spec, exc))
        if not isinstance(reply, Post):
            why = f"answered with {type(reply).__name__}, not a post; its class ({spec.where}) must return request.answer(...)"
            return request.answer(f"The {spec.alias} role {why}.")
        # A role answers the one who asked, whatever its post says.
        return dataclasses.replace(reply, send_from=spec.alias, send_to=post.send_from)

    def load_file(self, source: str | Path) -> Path:
        """Copy a data file into the working folder and tell the Planner with the next request.

        Only regular files up to `session.max_upload_bytes` are copied (UploadError says why not).
        """
        path = Path(source).expanduser()
        check_upload(path, max_bytes=self.config.session.max_upload_bytes)
        name = self.executor.upload(path)
        self._notes.append(self._planner.file_note(name))
        loaded = FileLoaded(name=name, source=str(path.resolve()), after_round=len(self.conversation.rounds), at=time.time())
        self.loads.append(loaded)
        self._emit(loaded)
        return self.working_dir / name

    def reset(self) -> Session:
        """Start over: a new session with a fresh kernel and a copy of this one's working files.

        This session is closed (and stays stored, resumable); use the returned one from now on. Its
        `reset_report` says what was copied and what was not (links, odd files, past the bounds).
        """
        listeners = [listener for listener in self._listeners if not isinstance(listener, StoreRecorder)]
        options = self.options
        shared = None if options.owns_store else self.store  # a server's store stays the server's
        fresh = Session.open(
            self.config,
            model=self._model.inner,
            executor=options.executor_factory,
            listeners=listeners,
            confirm=options.confirm,
            owner=self.owner,
            store=shared,
            claim=self._lock is not None,
        )
        # The old kernel wrote this folder: no link is followed, and the copy is bounded (count, bytes).
        limit = RESET_COPY_UPLOADS * self.config.session.max_upload_bytes
        fresh.reset_report = copy_folder(self.working_dir, fresh.working_dir, max_bytes=limit)
        fresh._owns_model, self._owns_model = self._owns_model, False  # the model client lives on in the new session
        self.close()
        return fresh

    def undo(self, *, on_replay: Callable[[int, int], None] | None = None) -> Round:
        """Drop the last request with everything it caused (from the store too) and rebuild the kernel by replay; returns it.

        Files its cells wrote stay in the working folder. A request already folded into a role's
        summary cannot be taken back (TaskWeaverError says so).
        """
        if not self.conversation.rounds:
            raise TaskWeaverError("Nothing to undo: this session has no requests yet.")
        last = self.conversation.rounds[-1]
        for role, context in self.contexts().items():
            context.wait_idle(timeout=UNDO_FOLD_WAIT)
            if context.state.folded_through >= last.index:
                raise TaskWeaverError(f"Request {last.index} is already folded into the {role} role's summary and cannot be undone; /reset starts over.")
        self._flush_store()
        if self.store is not None:
            self.store.drop_round(self.id, last.id)
        self.conversation.rounds.pop()
        self._viewed = min(self._viewed, len(self.conversation.rounds))
        for alias, view in self._views.items():
            self._views[alias] = [rnd for rnd in view if rnd.id != last.id]
        for context in self.contexts().values():  # the next prompt is built afresh: no variables list kept from the undone request
            context.restore(context.state)
        # Files loaded just before it were announced in its message: the next request says so again.
        self._notes = [self._planner.file_note(load.name) for load in self.loads if load.after_round == last.index - 1] + self._notes
        self._rebuild_kernel(on_replay)
        return last

    def _rebuild_kernel(self, on_replay: Callable[[int, int], None] | None) -> None:
        """A fresh kernel, then every cell that ran without error re-run in order (what resume does)."""
        cells = self.store.successful_cells(self.id) if self.store is not None else _good_cells(self.conversation.rounds)
        self.executor.restart()
        self._recency.clear()
        self._cells, self._lost = 0, []
        for number, code in enumerate(cells, 1):
            self.executor.run(code)
            if on_replay is not None:
                on_replay(number, len(cells))

    def _flush_store(self) -> None:
        for listener in self._listeners:
            if isinstance(listener, StoreRecorder):
                listener.flush()

    def model_users(self) -> list[str]:
        """What `use_model` accepts as `user`: the enabled roles' config keys, and round_compressor (the folds)."""
        return [*self.contexts(), FOLDER]

    def use_model(self, name: str, *, user: str | None = None) -> None:
        """Call model `name` from the next request on: for every part, or for one (a role's key, or round_compressor)."""
        if not self._owns_model:
            raise TaskWeaverError("This session's model was handed to it by the program that opened it; only that program can change it.")
        config = self.config
        if user is None:
            config.llm.model = name  # a part with its own `llm.model` keeps it (with its own address and key)
        else:
            section = config.round_compressor if user == FOLDER else config.role_section(user) if user in type(config).model_fields else None
            if section is None:  # a project role: its section may not be written yet
                section = config.role_sections.setdefault(user, RoleSectionConfig())
            # Assigned whole, so the section counts as set where a role's file settings are merged under it.
            section.llm = LLMOverrides.model_validate({**section.llm.model_dump(exclude_unset=True), "model": name})
        for active in self.active.values():  # what /info names (each role's window, and so its budget, stays)
            active.context.llm = merged_llm(config.llm, active.spec.section(config.role_section(active.spec.key)).llm)
        previous, self._model.inner = self._model.inner, role_models(config, roles=[active.spec for active in self.active.values()])
        close = getattr(previous, "close", None)
        if callable(close):
            close()

    def live_variables(self) -> LiveVariables:
        """The kernel's variables now, most recently created or changed first, and names lost to restarts."""
        variables = self.executor.variables()
        alive = {v.name for v in variables}
        lost = tuple(dict.fromkeys(n for n in self._lost if n not in alive))
        return LiveVariables(variables=_newest_first(variables, self._recency), lost=lost)

    def save_experience(self) -> list[Tip]:
        """Distil this session into tips with the model and store them; ExperienceError (nothing stored) when that fails."""
        llm = self.config.llm_for(DISTILLER)  # experience.llm over llm
        tips = distil(self.conversation.rounds, model=self._model, tokenizer=get_tokenizer(llm.tokenizer), llm=llm)
        return self.experience.save(self.id, tips)

    def _tips_for(self, role: Role, request: str) -> str:
        """The experience tips that fit `request`, as `role`'s prompt shows them (at most an eighth of its budget)."""
        context = role.context
        return self.experience.block(request, tokenizer=context.tokenizer, max_tokens=context.budget // EXPERIENCE_SHARE)

    def _hook_experience(self) -> None:
        """The Planner's and the CodeGenerator's prompts show the tips that fit their request."""
        for active in self.active.values():
            built = active.role
            role = built.planner if isinstance(built, PlannerRole) else built.code_generator if isinstance(built, CodeInterpreterRole) else None
            if role is not None:
                role.experience = functools.partial(self._tips_for, role)

    def contexts(self) -> dict[str, RoleContext]:
        """Each enabled role's prompt history manager, by the role's key (its config section)."""
        return {active.spec.key: active.context for active in self.active.values()}

    def usage(self) -> Usage:
        """Model calls and tokens used so far (failed calls counted, with no tokens)."""
        return self._model.usage()

    def usage_by_model(self) -> dict[tuple[str, str], Usage]:
        """This process's model calls summed per (purpose, model name): which role spent what, on which model."""
        return self._model.usage_by_model()

    def close(self) -> None:
        """Stop background folds and the kernel; save the summaries; release the stored session."""
        for context in self.contexts().values():
            context.close()
        store, self.store = self.store, None
        try:
            if store is not None:
                for listener in self._listeners:
                    if isinstance(listener, StoreRecorder):
                        listener.flush()
                for context in self.contexts().values():
                    store.save_compression(self.id, context.role, context.state.to_dict())
        finally:
            try:
                self.executor.shutdown()
            finally:
                if self._lock is not None:
                    self._lock.release()
                if store is not None and self.options.owns_store:
                    store.close()
                self._close_model()

    def _close_model(self) -> None:
        """Close the model's HTTP connections if we built the model; a model passed in is its owner's."""
        close = getattr(self._model.inner, "close", None)
        if self._owns_model and callable(close):
            self._owns_model = False
            close()

    def _compression_state(self, role: str) -> dict[str, Any] | None:
        context = self.contexts().get(role)
        return context.state.to_dict() if context is not None else None

    def _role_views(self) -> dict[str, list[Round]]:
        """Each role's view of the finished rounds: only the posts it sent or received (copies: a turn may not change them)."""
        rounds = self.conversation.rounds
        for rnd in rounds[self._viewed :]:
            if rnd.state == "finished":
                for alias, view in self._views.items():
                    view.append(rnd.visible_to(alias))
        self._viewed = len(rounds)
        return {alias: list(view) for alias, view in self._views.items()}

    def _after_round(self) -> None:
        for alias, view in self._role_views().items():
            active = self.active[alias]
            # A round the role took no part in renders to nothing and never folds: it is not rendered at all.
            active.context.round_finished([active.role.render(r) for r in view if r.posts])

    def _add(self, rnd: Round, post: Post) -> None:
        rnd.posts.append(post)
        execution = post.execution
        if execution is not None:
            self._cells += 1
            for name in (*execution.changes.created, *execution.changes.changed):
                self._recency[name] = self._cells
            if execution.kernel_died:
                self._lost.extend(execution.lost_variables)
        self._emit(PostAdded(rnd, post))

    def _on_call(self, record: CallRecord) -> None:
        keep = self.config.store.record_prompts
        prompt = tuple({"role": m["role"], "content": m["content"]} for m in record.messages) if keep else None
        reply = record.reply if keep else None
        self._emit(
            ModelCalled(
                record.purpose, record.prompt_tokens, record.completion_tokens, record.latency,
                ok=record.ok, error=record.error, prompt=prompt, reply=reply, cached_tokens=record.cached_tokens,
            )
        )

    def _fail(self, rnd: Round, error: str) -> None:
        rnd.state = "failed"
        rnd.error = error
        # The store may have failed too (a full disk): the error being raised already says why.
        with contextlib.suppress(StoreError):
            self._emit(RoundEnded(rnd))

    def _on_repair(self, problem: str) -> None:
        self._emit(Working("repairing", problem))

    def _emit(self, event: Event) -> None:
        """The store records `event` first, then the listeners show it: what was shown is durable.

        Should the store fail, the event is still shown (nothing the user saw is hidden) and the
        failure is raised after, so the round says its record is incomplete.
        """
        listeners = list(self._listeners)
        recorders = [listener for listener in listeners if isinstance(listener, StoreRecorder)]
        try:
            for recorder in recorders:
                recorder(event)
        finally:
            for listener in listeners:
                if not isinstance(listener, StoreRecorder):
                    listener(event)


def _catalogs(catalogs: Catalogs | None) -> dict[str, Any]:
    """SessionOptions' roles and plugins from a workspace's catalogs (none: the session discovers them)."""
    return {} if catalogs is None else {"roles": catalogs[0], "plugins": catalogs[1]}


def _good_cells(rounds: Sequence[Round]) -> list[str]:
    """The code of every cell that ran without error, in order (the store's `successful_cells` for a session without one)."""
    return [post.execution.code for rnd in rounds for post in rnd.posts if post.execution is not None and post.execution.success]


def _newest_first(variables: Sequence[Variable], recency: dict[str, int]) -> tuple[Variable, ...]:
    """Most recently created or changed first; the kernel's own order among equals."""
    return tuple(sorted(variables, key=lambda v: -recency.get(v.name, 0)))


def _last_report(rnd: Round, *, to: str) -> str:
    for post in reversed(rnd.posts):
        if post.send_to == to and post.send_from != USER:
            return post.execution.prompt_text() if post.execution else post.message
    return "(no results yet)"


def role_failure(spec: RoleSpec, exc: BaseException) -> str:
    """What the Planner (and the user, on screen) hear when a project role could not answer: the reason and the setting."""
    why = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, TaskWeaverError):
        return f"The {spec.alias} role could not answer: {why} (its model is set by {spec.key}.llm over llm). Go on without it."
    return f"The {spec.alias} role failed ({type(exc).__name__}: {why}) in its class from {spec.where}. Go on without it."
