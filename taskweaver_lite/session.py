"""A session: one conversation, one kernel, and the turn loop that connects them.

    config = load_config("project")
    with Session.open(config) as session:
        print(session.ask("load sales.csv; which region grew fastest?").answer)

A turn runs hop by hop: the Planner answers the user or delegates a step; the CodeInterpreter
writes and runs code for it; its report goes back to the Planner. Listeners (the CLI, the store)
observe every event; they never drive the turn.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskweaver_lite.config import Config, LLMConfig, ModelUser
from taskweaver_lite.confirm import ConfirmCell
from taskweaver_lite.errors import ConfigError, RoundFailedError, StoreError, TaskWeaverError
from taskweaver_lite.events import Event, FileLoaded, Listener, ModelCalled, PostAdded, ReplyStreamed, RoundEnded, RoundStarted, Working
from taskweaver_lite.execution import Executor, ExecutorFactory, Variable
from taskweaver_lite.llm.client import CallRecord, ChatModel, MeteredModel, Usage
from taskweaver_lite.llm.tokens import get_tokenizer
from taskweaver_lite.memory.compression import RoleContext
from taskweaver_lite.memory.conversation import Conversation, Post, RoleName, Round
from taskweaver_lite.memory.summary import CompressionState
from taskweaver_lite.memory.variables import LiveVariables
from taskweaver_lite.plugins.catalog import PluginCatalog, PluginSpec, discover
from taskweaver_lite.plugins.prompt import planner_line
from taskweaver_lite.roles.code_generator import CodeGenerator
from taskweaver_lite.roles.examples import load_examples
from taskweaver_lite.roles.planner import Planner, list_working_files
from taskweaver_lite.roles.role import RepairTurns
from taskweaver_lite.store.database import SessionStore, StoreRecorder
from taskweaver_lite.store.lock import SessionLock
from taskweaver_lite.uploads import check_upload
from taskweaver_lite.verification import verifier_from


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
        store: SessionStore | None = None,
        lock: SessionLock | None = None,
        usage_before: Usage = Usage(),
        executor_factory: ExecutorFactory | None = None,
        plugins: PluginCatalog | None = None,
        owns_model: bool = False,
        confirm: ConfirmCell | None = None,
    ) -> None:
        self.config = config
        self._confirm = confirm  # confirm mode: a person runs, edits or skips each cell
        self.plugins = plugins or PluginCatalog()  # every plugin found, broken ones with their errors; the enabled ones are shown
        self.id = session_id
        self.executor = executor
        self._executor_factory = executor_factory  # how /reset builds the next session's executor
        self.store = store
        self.conversation = Conversation()
        self._lock = lock
        self._listeners = list(listeners)
        self._model = MeteredModel(model, on_call=self._on_call, usage=usage_before)
        self._owns_model = owns_model  # built by us (not passed in): we close its HTTP connections
        self._notes: list[str] = []
        self.loads: list[FileLoaded] = []  # every /load, for /history and the exports
        self._lost: list[str] = []
        self._recency: dict[str, int] = {}  # variable name -> the last cell that created or changed it
        self._cells = 0
        self.planner, self.code_generator = self._build_roles()
        if store is not None:
            self._listeners.append(StoreRecorder(store, session_id, compression_state=self._compression_state))

    @property
    def working_dir(self) -> Path:
        """The folder the session's code reads and writes files in."""
        return self.executor.working_dir

    def _build_roles(self) -> tuple[Planner, CodeGenerator]:
        config = self.config
        checks = config.code_interpreter
        # Each role counts with its own model's tokenizer (planner.llm.tokenizer...).
        planner_context = RoleContext(
            RoleName.PLANNER, config=config, model=self._model, tokenizer=get_tokenizer(config.llm_for("planner").tokenizer), on_fold=self._emit
        )
        coder_context = RoleContext(
            RoleName.CODE_GENERATOR,
            config=config,
            model=self._model,
            tokenizer=get_tokenizer(config.llm_for("code_generator").tokenizer),
            live_variables=self.live_variables,
            on_fold=self._emit,
        )
        planner = Planner(
            self._model,
            context=planner_context,
            examples=load_examples(config.project_dir, RoleName.PLANNER),
            max_hops=config.session.max_internal_hops,
            working_files=lambda: list_working_files(self.working_dir),
            on_delta=lambda delta: self._emit(ReplyStreamed(RoleName.PLANNER, delta)),
            plugin_lines=[planner_line(spec) for spec in self.plugins.enabled],
        )
        code_generator = CodeGenerator(
            self._model,
            executor=self.executor,
            context=coder_context,
            examples=load_examples(config.project_dir, RoleName.CODE_GENERATOR),
            max_retry_count=config.code_interpreter.max_retry_count,
            on_delta=lambda delta: self._emit(ReplyStreamed(RoleName.CODE_GENERATOR, delta)),
            plugins=self.plugins.enabled,
            plugin_top_k=config.code_generator.auto_plugin_selection_topk if config.code_generator.auto_plugin_selection else None,
            verifier=verifier_from(checks.allowed_modules, checks.blocked_functions) if checks.code_verification_on else None,
            confirm=self._confirm,
        )
        return planner, code_generator

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
    ) -> Session:
        """Start a stored session: its kernel boots in the background while the first request is typed.

        `model` defaults to the openai-SDK client for `config.llm`; `executor` builds the session's
        executor from its session folder (default: a local Jupyter kernel). `confirm` turns on
        confirm mode: it is asked about each cell before the cell runs.
        """
        session_id = session_id or new_session_id()
        store = SessionStore(config.store_path)
        with _closing_on_error(store) as guard:
            lock = guard.lock = store.lock(session_id)
            store.create_session(session_id, started=time.time())
            return cls._assemble(config, session_id, store=store, lock=lock, model=model, executor=executor, listeners=listeners, confirm=confirm)

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
    ) -> tuple[Session, ResumeReport]:
        """Continue a stored session ('last' or an id): conversation, summaries and, by replay, the kernel's variables."""
        store = SessionStore(config.store_path)
        with _closing_on_error(store) as guard:
            session_id = store.resolve(ref)
            lock = guard.lock = store.lock(session_id)
            cut_off = store.mark_interrupted(session_id)
            stored = store.load(session_id)
            cells = store.successful_cells(session_id) if replay else []
            session = cls._assemble(
                config,
                session_id,
                store=store,
                lock=lock,
                model=model,
                executor=executor,
                listeners=listeners,
                usage_before=stored.usage,
                confirm=confirm,
            )
        session.conversation.rounds = list(stored.rounds)
        session.loads = list(stored.loads)
        for context in session.contexts().values():
            saved = stored.compression.get(context.role.value)
            if saved:
                context.restore(CompressionState.from_dict(saved))
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

    @classmethod
    def _assemble(
        cls,
        config: Config,
        session_id: str,
        *,
        store: SessionStore,
        lock: SessionLock,
        model: ChatModel | None,
        executor: ExecutorFactory | None,
        listeners: Iterable[Listener],
        usage_before: Usage = Usage(),
        confirm: ConfirmCell | None = None,
    ) -> Session:
        chat_model = model or role_models(config)
        plugins = discover(config.project_dir)
        running = (executor or default_executor(config, plugins=plugins.enabled))(config.sessions_dir / session_id)
        try:
            return cls(
                config,
                model=chat_model,
                executor=running,
                session_id=session_id,
                listeners=listeners,
                store=store,
                lock=lock,
                usage_before=usage_before,
                executor_factory=executor,
                plugins=plugins,
                owns_model=model is None,
                confirm=confirm,
            )
        except BaseException:  # bad examples or prompts: the kernel already booting must not linger
            running.shutdown()
            raise

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_listener(self, listener: Listener, *, first: bool = False) -> None:
        """Observe every event from now on (the CLI renderer, the store); `first`: before the store records it."""
        if first:
            self._listeners.insert(0, listener)
        else:
            self._listeners.append(listener)

    def ask(self, text: str) -> Round:
        """Handle one user request to the end and return its round.

        A reply that cannot be repaired fails the round and the session goes on. A model error
        (unreachable, refused) fails the round and is raised. Ctrl-C (KeyboardInterrupt) cancels
        the step, fails the round, and is raised after the kernel has stopped.
        """
        planner_view, coder_view = self.conversation.view("Planner"), self.conversation.view("CodeInterpreter")
        rnd = self.conversation.start_round(text)
        message = "\n\n".join([*self._notes, text])
        try:
            self._emit(RoundStarted(rnd))
            self._add(rnd, Post(send_from="User", send_to="Planner", message=message))
            self._run_hops(rnd, planner_view, coder_view)
            rnd.state = "finished"
            self._notes.clear()  # only now: a failed round's notes go out again with the next request
        except RoundFailedError as exc:
            self._fail(rnd, str(exc))
            return rnd
        except TaskWeaverError as exc:  # the model or the kernel failed: the round fails, the record stays
            self._fail(rnd, str(exc))
            raise
        except KeyboardInterrupt:
            self._fail(rnd, "Cancelled by the user.")
            raise
        self._emit(RoundEnded(rnd))
        self._after_round()
        return rnd

    def _run_hops(self, rnd: Round, planner_view: Sequence[Round], coder_view: Sequence[Round]) -> None:
        repairs = RepairTurns(self.config.session.max_repair_attempts)
        max_hops = self.config.session.max_internal_hops
        hops = 0
        while True:
            self._emit(Working("planner_thinking"))
            post = self.planner.reply(planner_view, rnd.visible_to("Planner"), repairs=repairs, on_repair=self._on_repair)
            if post.send_to == "CodeInterpreter" and hops >= max_hops:
                self._add(rnd, self.planner.hop_limit_post(hops=hops, last=_last_report(rnd), plan=post.plan))
                return
            self._add(rnd, post)
            if post.send_to == "User":
                return
            hops += 1
            report = self.code_generator.handle(
                post,
                history=coder_view,
                current=rnd,
                add_post=lambda p: self._add(rnd, p),
                repairs=repairs,
                notify=self._emit,
            )
            self._add(rnd, report)

    def load_file(self, source: str | Path) -> Path:
        """Copy a data file into the working folder and tell the Planner with the next request.

        Only regular files up to `session.max_upload_bytes` are copied (UploadError says why not).
        """
        path = Path(source).expanduser()
        check_upload(path, max_bytes=self.config.session.max_upload_bytes)
        name = self.executor.upload(path)
        self._notes.append(self.planner.file_note(name))
        loaded = FileLoaded(name=name, source=str(path.resolve()), after_round=len(self.conversation.rounds), at=time.time())
        self.loads.append(loaded)
        self._emit(loaded)
        return self.working_dir / name

    def reset(self) -> Session:
        """Start over: a new session with a fresh kernel and a copy of this one's working files.

        This session is closed (and stays stored, resumable); use the returned one from now on.
        """
        listeners = [listener for listener in self._listeners if not isinstance(listener, StoreRecorder)]
        fresh = Session.open(self.config, model=self._model.inner, executor=self._executor_factory, listeners=listeners, confirm=self._confirm)
        shutil.copytree(self.working_dir, fresh.working_dir, dirs_exist_ok=True)
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
                raise TaskWeaverError(f"Request {last.index} is already folded into the {role.label}'s summary and cannot be undone; /reset starts over.")
        self._flush_store()
        if self.store is not None:
            self.store.drop_round(self.id, last.id)
        self.conversation.rounds.pop()
        # Files loaded just before it were announced in its message: the next request says so again.
        self._notes = [self.planner.file_note(load.name) for load in self.loads if load.after_round == last.index - 1] + self._notes
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

    def use_model(self, name: str, *, user: ModelUser | None = None) -> None:
        """Call model `name` from the next request on: for every part, or for one (`planner`, `code_generator`, `round_compressor`)."""
        if not self._owns_model:
            raise TaskWeaverError("This session's model was handed to it by the program that opened it; only that program can change it.")
        section = self.config.llm if user is None else getattr(self.config, user).llm
        section.model = name  # a part with its own `llm.model` keeps it (with its own address and key)
        previous, self._model.inner = self._model.inner, role_models(self.config)
        close = getattr(previous, "close", None)
        if callable(close):
            close()

    def live_variables(self) -> LiveVariables:
        """The kernel's variables now, most recently created or changed first, and names lost to restarts."""
        variables = self.executor.variables()
        alive = {v.name for v in variables}
        lost = tuple(dict.fromkeys(n for n in self._lost if n not in alive))
        return LiveVariables(variables=_newest_first(variables, self._recency), lost=lost)

    def contexts(self) -> dict[RoleName, RoleContext]:
        """Each role's prompt history manager."""
        return {RoleName.PLANNER: self.planner.context, RoleName.CODE_GENERATOR: self.code_generator.context}

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
                if store is not None:
                    store.close()
                self._close_model()

    def _close_model(self) -> None:
        """Close the model's HTTP connections if we built the model; a model passed in is its owner's."""
        close = getattr(self._model.inner, "close", None)
        if self._owns_model and callable(close):
            self._owns_model = False
            close()

    def _compression_state(self, role: RoleName) -> dict[str, Any] | None:
        context = self.contexts().get(role)
        return context.state.to_dict() if context is not None else None

    def _after_round(self) -> None:
        for role in (self.planner, self.code_generator):
            role.context.round_finished([role.rendered(r) for r in self.conversation.view(role.name.party)])

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
                ok=record.ok, error=record.error, prompt=prompt, reply=reply,
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
        for listener in list(self._listeners):
            listener(event)


def role_models(config: Config) -> ChatModel:
    """The openai-SDK clients a session calls: one per distinct role model (`planner.llm`...), shared when equal."""
    from taskweaver_lite.llm.client import OpenAIChatModel, RoutedModel

    clients: dict[str, OpenAIChatModel] = {}

    def client(llm: LLMConfig) -> OpenAIChatModel:
        secret = llm.api_key.get_secret_value() if llm.api_key is not None else None
        key = json.dumps([llm.model_dump(mode="json", exclude={"api_key"}), secret], sort_keys=True)
        if key not in clients:
            clients[key] = OpenAIChatModel(llm)
        return clients[key]

    folder = client(config.llm_for("round_compressor"))
    by_purpose: dict[str, ChatModel] = {
        "planner": client(config.llm_for("planner")),
        "code_generator": client(config.llm_for("code_generator")),
        "compression_planner": folder,
        "compression_code_generator": folder,
    }
    return RoutedModel(by_purpose, default=client(config.llm))


def default_executor(config: Config, *, plugins: Sequence[PluginSpec] = ()) -> ExecutorFactory:
    """A Jupyter kernel per session, started in the background, with `plugins` loaded in it: local, or on `execution.kernel_gateway`."""
    from taskweaver_lite.kernel.executor import KernelExecutor

    gateway = config.execution.kernel_gateway
    if gateway is not None:
        try:
            from taskweaver_lite.kernel.remote import GatewayExecutor
        except ImportError as exc:
            raise ConfigError(
                f"execution.kernel_gateway needs {exc.name}: pip install 'taskweaver-lite[gateway]'"
            ) from exc
        return functools.partial(GatewayExecutor, config=config.execution, gateway=gateway, output_tokens=config.cell_output_tokens, plugins=tuple(plugins))
    # A sandboxed kernel sees neither the project folder nor the store (wherever store.path puts it).
    hidden = (config.project_dir, config.store_path.parent)
    return functools.partial(KernelExecutor, config=config.execution, output_tokens=config.cell_output_tokens, plugins=tuple(plugins), hidden=hidden)


def _good_cells(rounds: Sequence[Round]) -> list[str]:
    """The code of every cell that ran without error, in order (the store's `successful_cells` for a session without one)."""
    return [post.execution.code for rnd in rounds for post in rnd.posts if post.execution is not None and post.execution.success]


def _newest_first(variables: Sequence[Variable], recency: dict[str, int]) -> tuple[Variable, ...]:
    """Most recently created or changed first; the kernel's own order among equals."""
    return tuple(sorted(variables, key=lambda v: -recency.get(v.name, 0)))


def new_session_id() -> str:
    """A sortable, readable session id: date, time, and a short random suffix."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


def _last_report(rnd: Round) -> str:
    for post in reversed(rnd.posts):
        if post.send_from == "CodeInterpreter":
            return post.execution.prompt_text() if post.execution else post.message
    return "(no results yet)"


class _closing_on_error:
    """Closes the store, and releases the session lock once taken, if opening a session fails."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self.lock: SessionLock | None = None

    def __enter__(self) -> _closing_on_error:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is not None:
            if self.lock is not None:
                self.lock.release()
            self.store.close()
