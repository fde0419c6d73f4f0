"""A session: one conversation, one kernel, and the turn loop that connects them.

    with Workspace.load("project") as workspace, workspace.new_session() as session:
        print(session.ask("load sales.csv; which region grew fastest?").answer)

A turn runs hop by hop: the role the user talks to (the Planner) answers the user or delegates a
step to an enabled role by its alias; that role's reply goes back to it. Which roles take part is
the role registry's (`session.roles`, roles/registry.py); the session names none of them. Each role
sees only the posts it sent or received and keeps its own prompt history and compression. A
broken project role is left out with one line (`role_problems`); a project role that fails on a
request (its model unreachable, its class raising) answers with the reason and the turn goes on.
Listeners (the CLI, the store) observe every event; they never drive the turn.

What happens around the turns lives beside this module: opening, resuming and resetting a session
(assembly.py, which the Workspace calls), `/undo` (undo.py), `/model` (model_choice.py) and the
team of roles it runs (roles/team.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskweaver_lite.config.settings import DISTILLER, Config
from taskweaver_lite.errors import RoundFailedError, StoreError, TaskWeaverError
from taskweaver_lite.kernel.interface import Executor, ExecutorFactory
from taskweaver_lite.kernel.uploads import check_upload
from taskweaver_lite.knowledge.distil import distil
from taskweaver_lite.knowledge.experience import Experience
from taskweaver_lite.llm.client import ChatModel, MeteredModel
from taskweaver_lite.llm.counting import ModelTokenizer
from taskweaver_lite.llm.tokens import get_tokenizer
from taskweaver_lite.memory.compression import RoleContext
from taskweaver_lite.memory.summary import CompressionState
from taskweaver_lite.memory.variables import LiveVariables, VariableHistory
from taskweaver_lite.plugins.catalog import PluginCatalog
from taskweaver_lite.records.conversation import USER, Conversation, Post, Round
from taskweaver_lite.records.events import Event, FileLoaded, Listener, ModelCalled, PostAdded, RoundEnded, RoundStarted, Working
from taskweaver_lite.records.model_calls import CallRecord, Usage
from taskweaver_lite.records.tips import Tip
from taskweaver_lite.roles.builtin import SessionParts
from taskweaver_lite.roles.planner import list_working_files
from taskweaver_lite.roles.registry import RoleCatalog, RoleSpec, discover_roles
from taskweaver_lite.roles.role import RepairTurns
from taskweaver_lite.roles.team import TeamMember, build_team, show_tips
from taskweaver_lite.roles.worker import RoleRequest, Turn
from taskweaver_lite.safety.confirm import ConfirmCell
from taskweaver_lite.safety.workfiles import CopyReport
from taskweaver_lite.store.interface import INTERRUPTED_ERROR, FreedMarks, LeaseMark, SessionClaim, Store, StoredSession
from taskweaver_lite.store.recorder import StoreRecorder
from taskweaver_lite.telemetry import tracing

CANCELLED_ERROR = "Cancelled by the user."  # a failed round's error after Ctrl-C or Stop
TOKEN_RATIOS = "@token_ratios"  # where a session's measured token ratios are kept beside its roles' summaries (no role has this key)


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
    """What a session may be given besides its config, model and executor (assembly.py fills it in)."""

    store: Store | None = None
    lock: SessionClaim | None = None
    owner: str | None = None  # the user the session belongs to (None: no users)
    owns_store: bool = True  # opened for this session (closed with it), not handed in by a workspace that shares it
    usage_before: Usage = Usage()
    executor_factory: ExecutorFactory | None = None  # how /reset builds the next session's executor
    plugins: PluginCatalog | None = None
    roles: RoleCatalog | None = None  # default: discovered from the project and session.roles
    experience: Experience | None = None  # the project's, as a workspace opened it (default: opened for this session)
    owns_model: bool = False  # built by us (not passed in): we close its HTTP connections
    confirm: ConfirmCell | None = None  # confirm mode: a person runs, edits or skips each cell


class Session:
    """One conversation with its kernel: ask, load files, and inspect the context."""

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
        self.tracer = tracing.tracer_for(config.tracing)  # None with tracing off (nothing of OpenTelemetry is loaded)
        self.plugins = options.plugins or PluginCatalog()  # every plugin found, broken ones with their errors; the enabled ones are shown
        self.roles = options.roles or discover_roles(config.project_dir, enabled=config.session.roles, config=config)
        self.roles.check_names()
        self.id = session_id
        self.executor = executor
        self.store = options.store
        self.owner = options.owner
        self.conversation = Conversation()
        self._listeners = list(listeners)
        self._recorder: StoreRecorder | None = None  # records every event before the listeners see it
        if self.store is not None:
            self._recorder = StoreRecorder(self.store, session_id, compression_state=self._compression_state, working_dir=self.working_dir)
        self._model = MeteredModel(model, on_call=self._on_call, usage=options.usage_before)
        model.scope_cache(session_id)  # prompt cache keys per session and role
        self.owns_model = options.owns_model  # built for it (not passed in): it closes the model's HTTP connections
        self._notes: list[str] = []  # what the next request tells the Planner first (files loaded since the last one)
        # Set once the program running the request is going away (a server past its drain timeout):
        # the interrupt that follows fails the round as cut off, as if the process had died, not as cancelled.
        self.ending = False
        self.reset_report: CopyReport | None = None  # set on the session a reset made: what it copied over
        self.loads: list[FileLoaded] = []  # every /load, for /history and the exports
        self.variables = VariableHistory()
        project = options.experience or Experience(store=self.store, folder=config.experience_dir, settings=config.experience)
        self.experience = project.for_owner(options.owner)  # the tips its owner may see
        team = build_team(config, self.roles.enabled, self._parts(), model=self._model, live_variables=self.live_variables, emit=self._emit)
        show_tips(team, self.experience)
        self.active = team.members
        # Each role's view of the finished rounds, extended as rounds finish (a view costs a copy of every round).
        self._views: dict[str, list[Round]] = {alias: [] for alias in self.active}
        self._viewed = 0
        self._entry, self._planner = team.entry, team.planner

    @property
    def working_dir(self) -> Path:
        """The folder the session's code reads and writes files in."""
        return self.executor.working_dir

    @property
    def role_problems(self) -> list[str]:
        """One line per role left out (a broken role file, a class that failed to import, a name that is no role)."""
        return self.roles.problems

    @property
    def listeners(self) -> list[Listener]:
        """Who observes the session's events (the store's record is kept apart: it is no listener one hands on)."""
        return list(self._listeners)

    @property
    def model(self) -> ChatModel:
        """The model the session calls, without the metering that counts its calls."""
        return self._model.inner

    def _parts(self) -> SessionParts:
        """What the session's own roles are built from besides their tools."""
        return SessionParts(
            executor=self.executor,
            plugins=self.plugins.enabled,
            team=self.roles.enabled,
            checks=self.config.code_interpreter,
            max_hops=self.config.session.max_internal_hops,
            working_files=lambda: list_working_files(self.working_dir),
            confirm=self.options.confirm,
        )

    def restore(self, stored: StoredSession) -> None:
        """Take back a stored session's record: its rounds, its loads, each role's summary (by the role's key), its usage.

        A session that already answered here (a replica's copy that another replica went on with)
        drops what it built from its own rounds: it goes on as if loaded afresh, with its kernel.
        """
        self.conversation.rounds = list(stored.rounds)
        self.loads = list(stored.loads)
        # Files loaded after the last request (perhaps by another server) are announced by the next one.
        self._notes = [self._planner.file_note(load.name) for load in self.loads if load.after_round == len(self.conversation.rounds)]
        self._views, self._viewed = {alias: [] for alias in self.active}, 0
        self.variables.clear()
        for rnd in stored.rounds:
            for post in rnd.posts:
                if post.execution is not None:
                    self.variables.saw(post.execution)
        self._model.count_from(stored.usage)
        for context in self.contexts().values():
            saved = stored.compression.get(context.role)
            context.restore(CompressionState.from_dict(saved) if saved else CompressionState(), afresh=True)
        kept = stored.compression.get(TOKEN_RATIOS) or {}
        for tokenizer in self._model_tokenizers():
            tokenizer.adopt(kept)

    def token_ratios(self) -> dict[str, float]:
        """The model tokens per counted token measured so far, per model (none for models counted exactly as they count)."""
        return {key: ratio for tokenizer in self._model_tokenizers() for key, ratio in tokenizer.calibration().items()}

    def _model_tokenizers(self) -> list[ModelTokenizer]:
        """Each distinct tokenizer that counts in a model's own tokens, the roles' and their folds'."""
        found = {id(t): t for c in self.contexts().values() for t in (c.tokenizer, c.fold_tokenizer) if isinstance(t, ModelTokenizer)}
        return list(found.values())

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

    def remove_listener(self, listener: Listener) -> None:
        """Stop `listener` observing the session (one added for a single request)."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    def ask(self, text: str) -> Round:
        """Handle one user request to the end and return its round.

        A reply that cannot be repaired fails the round and the session goes on. A model error
        (unreachable, refused) fails the round and is raised. Ctrl-C (KeyboardInterrupt) cancels
        the step, fails the round, and is raised after the kernel has stopped. A request's number
        in `session.suggested_requests` asks that request: the round holds its words. With tracing on,
        the request is one trace (or continues the one the caller's context holds).
        """
        with tracing.turn(self.tracer, session_id=self.id, request=text) as span:
            rnd = self._ask(text)
            span.set({"taskweaver.round.index": rnd.index, "taskweaver.round.state": rnd.state})
            return rnd

    def _ask(self, text: str) -> Round:
        text = suggested(text, self.config.session.suggested_requests)
        views = self._role_views()
        rnd = self.conversation.start_round(text)
        self.experience.new_request()  # tips saved or deleted since the last request count from this one on
        message = "\n\n".join([*self._notes, text])
        try:
            # The round's start and the request itself are stored in one write (both are shown at once anyway).
            self._add(rnd, Post(send_from=USER, send_to=self._entry.spec.alias, message=message), first=RoundStarted(rnd))
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
            with tracing.role_reply(alias=entry.spec.alias, key=entry.spec.key):
                post = entry.role.reply(RoleRequest(rnd.posts[-1], views[entry.spec.alias], rnd, turn), entry.tools)
            if post.send_to != USER and hops >= max_hops:
                self._add(rnd, self._planner.hop_limit_post(hops=hops, last=_last_report(rnd, to=entry.spec.alias), plan=post.plan))
                return
            self._add(rnd, post)
            if post.send_to == USER:
                return
            hops += 1
            consulted = self.active[post.send_to]
            with tracing.role_reply(alias=consulted.spec.alias, key=consulted.spec.key):
                self._add(rnd, self._consult(consulted, post, rnd, views, turn))

    def _consult(self, active: TeamMember, post: Post, rnd: Round, views: dict[str, list[Round]], turn: Turn) -> Post:
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

    def note(self, text: str) -> None:
        """A line the Planner reads first with the next request (as a loaded file's note)."""
        self._notes.append(text)

    def forget_last_round(self) -> Round:
        """Take the last round out of the conversation, the roles' views and their next prompts (undo.py drops it from the store)."""
        last = self.conversation.rounds.pop()
        self._viewed = min(self._viewed, len(self.conversation.rounds))
        for alias, view in self._views.items():
            self._views[alias] = [rnd for rnd in view if rnd.id != last.id]
        for context in self.contexts().values():  # the next prompt is built afresh: no variables list kept from the undone request
            context.restore(context.state)
        # Files loaded just before it were announced in its message: the next request says so again.
        self._notes = [self._planner.file_note(load.name) for load in self.loads if load.after_round == last.index - 1] + self._notes
        return last

    def replace_model(self, model: ChatModel) -> None:
        """Call `model` from the next request on, closing the one it replaces (model_choice.py decides which)."""
        previous, self._model.inner = self._model.inner, model
        for context in self.contexts().values():  # each role's prompts are counted in its new model's tokens
            fallback = get_tokenizer(context.llm.tokenizer)
            context.count_with(model.tokenizer(context.role) or fallback, folds=model.tokenizer(f"compression_{context.role}") or fallback)
        previous.close()

    def flush_record(self) -> None:
        """Write the model-call records the store's recorder still holds (before the store is changed under it)."""
        if self._recorder is not None:
            self._recorder.flush()

    def mark_answer(self, mark: LeaseMark | None) -> None:
        """Take the lease row `mark` in the store as the next answer is stored, in the answer's own write (None: none)."""
        if self._recorder is not None:
            self._recorder.mark_answer(mark)

    def free_lease_marks(self, marks: FreedMarks, then: Callable[[], None]) -> None:
        """Delete the lease rows `marks` in the store's next write of this session (`then` is told once it has)."""
        if self._recorder is not None:
            self._recorder.free_marks(marks, then)

    @property
    def newest_event(self) -> int:
        """The id of the newest event-log entry this session wrote to the store (0: none yet)."""
        return self._recorder.newest if self._recorder is not None else 0

    def answer_marked(self, mark: LeaseMark) -> bool:
        """Whether the answer's write took `mark` (False: it is still to take, by a statement of its own)."""
        return self._recorder is not None and self._recorder.marked(mark)

    def live_variables(self) -> LiveVariables:
        """The kernel's variables now, most recently created or changed first, and names lost to restarts."""
        return self.variables.live(self.executor.variables())

    def save_experience(self) -> list[Tip]:
        """Distil this session into tips with the model and store them; ExperienceError (nothing stored) when that fails."""
        llm = self.config.llm_for(DISTILLER)  # experience.llm over llm
        tokenizer = self._model.tokenizer(DISTILLER) or get_tokenizer(llm.tokenizer)
        tips = distil(self.conversation.rounds, model=self._model, tokenizer=tokenizer, llm=llm)
        return self.experience.save(self.id, tips)

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
                self.flush_record()
                for context in self.contexts().values():
                    store.save_compression(self.id, context.role, context.state.to_dict())
                ratios = self.token_ratios()
                if ratios:  # beside the roles' summaries: a resumed session counts as this one measured
                    store.save_compression(self.id, TOKEN_RATIOS, ratios)
        finally:
            try:
                self.executor.shutdown()
            finally:
                if self.options.lock is not None:
                    self.options.lock.release()
                if store is not None and self.options.owns_store:
                    store.close()
                self._close_model()

    def _close_model(self) -> None:
        """Close the model's HTTP connections if we built the model; a model passed in is its owner's."""
        if self.owns_model:
            self.owns_model = False
            self._model.close()

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

    def _add(self, rnd: Round, post: Post, *, first: Event | None = None) -> None:
        """`post` into `rnd`, stored and shown; `first`: an event stored in the same write and shown just before it."""
        rnd.posts.append(post)
        if post.execution is not None:
            self.variables.saw(post.execution)
        self._emit(*([first] if first is not None else []), PostAdded(rnd, post))

    def _on_call(self, record: CallRecord) -> None:
        keep = self.config.store.record_prompts
        prompt = tuple({"role": m["role"], "content": m["content"]} for m in record.messages) if keep else None
        reply = record.reply if keep else None
        self._emit(
            ModelCalled(
                record.purpose,
                record.prompt_tokens,
                record.completion_tokens,
                record.latency,
                ok=record.ok,
                error=record.error,
                prompt=prompt,
                reply=reply,
                cached_tokens=record.cached_tokens,
                model=record.model,
            )
        )

    def _fail(self, rnd: Round, error: str) -> None:
        rnd.state = "failed"
        rnd.error = error
        # The store may have failed too (a full disk): the error being raised already says why.
        with contextlib.suppress(StoreError):
            self._emit(RoundEnded(rnd))

    def _emit(self, *events: Event) -> None:
        """The store records `events` first (in one write), then the listeners show them in order: what was shown is durable.

        Should the store fail, the events are still shown (nothing the user saw is hidden) and the
        failure is raised after, so the round says its record is incomplete.
        """
        try:
            if self._recorder is not None:
                self._recorder.record(*events)
        finally:
            for event in events:
                for listener in list(self._listeners):
                    listener(event)


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
