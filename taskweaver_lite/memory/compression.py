"""Round compression: each role's prompt history, folded into summaries in the background, kept in budget.

A `RoleContext` per role decides what of the conversation goes into that role's prompt. Finished
rounds fold into the role's summary by model calls in a worker thread (summary.py); `build` never
waits for a fold. Whatever the strategy, the budget guard (budget.py) keeps every prompt within
`llm.context_window - llm.reply_reserve - llm.margin`, and fold calls keep prompt + max_tokens
within `llm.context_window`.

Prompt order, by volatility. A model server (llama.cpp's slots, vLLM's and SGLang's prefix caches,
OpenAI's prompt caching) skips the prefix a prompt shares with one it has seen, so every part sits
after everything that changes less often than it does:

1. the system instructions (with the plugin descriptions), then the examples: fixed;
2. the memory (one user message): the variables list, a snapshot, then the summary under a fixed
   heading (no round numbers, counts or times). A fold that appends notes leaves every earlier
   byte as it was, the list included: the notes name the variables their rounds made. Only a
   merge (the summary rewritten) or a list that would mislead renders the list again;
3. the retained rounds, each rendered once (roles/role.py): a round shown as current is byte for
   byte the retained round of every later prompt until a fold lands; a role's leaner view of
   earlier rounds (the Planner's, without code) takes over only then, when the memory before it
   changed anyway (`detailed_from`);
4. the current round, the only part that changes every call.

A fold lands at a round boundary: the state a round's first request used serves every call of
that round, so within a round each call extends the one before it byte for byte; a fold that
finishes mid-round is picked up by the next round's first request. The variables list is rendered
again then only when the summary was merged, or when it would leave a live variable unnamed or
name one the kernel no longer holds (one created since shows in its round's "Variables created"
line while that round is retained, and in the summary's notes once folded).

Strategies (`<role>.strategy`), with `<role>.fold_schedule` (schedule.py) saying when rounds leave:
- round_compression: fold everything older than the latest `rounds_to_retain` rounds into the
  summary (schedule `rounds`: as `rounds_to_compress + rounds_to_retain` gather, TaskWeaver's
  rule; `pressure`: only when the unfolded rounds pass `fold_token_trigger`).
- summary_buffer: the last `summary_buffer_rounds` rounds verbatim, everything older in one
  narrative summary.
- observation_masking: old rounds keep their code, outcome line and variables; what their code
  printed becomes a one-line placeholder naming the full output's file. No model call.
- sliding_window: the newest rounds that fit, no model call.
- none: every round; only the budget guard shortens it.
`<role>.prompt_compression: false` turns the summarising strategies into sliding_window. Where rounds
are kept whole (sliding_window, none, observation_masking), `fold_schedule: pressure` makes them
leave in steps too: when the guard must drop rounds, the oldest go until those left take half of
what fitted, and the prompt's start then stays put for several rounds instead of moving each call.

A context knows its role only through `ContextSettings`: the role's key (config section, store and
call-purpose name), its label on screen, its fold prompt and its own config section, with the
round compressor's settings that section overrides (`<role>.rounds_to_compress`...).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from taskweaver_lite.config.settings import Config, LLMConfig, RoleConfig, RoundCompressorConfig, Strategy, merged_llm
from taskweaver_lite.llm.client import ChatModel
from taskweaver_lite.llm.tokens import Tokenizer
from taskweaver_lite.memory.budget import PromptCost, PromptParts, ShrinkOrder, fit_prompt
from taskweaver_lite.memory.schedule import Schedule
from taskweaver_lite.memory.summary import (
    VARIABLES_SHARE,
    CompressionState,
    FoldLimits,
    FoldResult,
    FoldStyle,
    RolePrefix,
    fold_rounds,
    render_summary,
)
from taskweaver_lite.memory.variables import LiveVariables, VariablesList, mentioned_names, render_variables
from taskweaver_lite.records.conversation import RoundMessages
from taskweaver_lite.records.events import Folded
from taskweaver_lite.records.model_calls import Message
from taskweaver_lite.telemetry import tracing

SUMMARISING: tuple[Strategy, ...] = ("round_compression", "summary_buffer")


@dataclass(frozen=True)
class ContextSettings:
    """What a `RoleContext` needs to know of its role: names, fold template, its own section and models."""

    role: str  # the role's key: its config section, stored summary and call purpose ("planner", "code_generator", "echo")
    label: str  # its name on screen
    section: RoleConfig  # the role's own config section (strategy, prompt_compression, examples, llm, fold overrides)
    compressor: RoundCompressorConfig  # round_compressor, with the keys the role's section overrides
    llm: LLMConfig  # the role's model: its prompts fit this window
    folder: LLMConfig  # the round compressor's model: folds fit this window
    llm_key: str  # where the role's window is set, for messages: "llm" or "planner.llm"
    fold_template: str  # prompts/<fold_template>.yaml

    @classmethod
    def of(cls, config: Config, role: str, *, section: RoleConfig | None = None, label: str | None = None, fold_template: str | None = None) -> ContextSettings:
        """The settings of `role` in `config`; `section` replaces `config.<role>` (a project role's merged settings)."""
        own = section if section is not None else config.role_section(role)
        llm = merged_llm(config.llm, own.llm)
        overrides = {key: value for key in ("rounds_to_compress", "rounds_to_retain") if (value := getattr(own, key)) is not None}
        return cls(
            role=role,
            label=label or role,
            section=own,
            compressor=config.round_compressor.model_copy(update=overrides),
            llm=llm,
            folder=config.llm_for("round_compressor"),
            llm_key="llm" if llm == config.llm else f"{role}.llm",
            fold_template=fold_template or f"compression_{role}",
        )

    @property
    def budget(self) -> int:
        """Tokens the role's prompts may use: its model's window minus reply reserve and margin."""
        return self.llm.context_window - self.llm.reply_reserve - self.llm.margin

    @property
    def budget_source(self) -> str:
        """How the budget is made, naming the settings: for messages about a prompt too big."""
        key, llm = self.llm_key, self.llm
        return f"{key}.context_window {llm.context_window:,} - {key}.reply_reserve {llm.reply_reserve:,} - {key}.margin {llm.margin:,}"

    @property
    def strategy(self) -> Strategy:
        """The role's strategy; a summarising one with `prompt_compression: false` is a sliding window."""
        chosen = self.section.strategy
        return "sliding_window" if not self.section.prompt_compression and chosen in SUMMARISING else chosen

    def schedule(self) -> Schedule:
        """When this role's rounds fold (or leave, for strategies that keep rounds whole)."""
        buffer = self.strategy == "summary_buffer"
        keep = self.compressor.summary_buffer_rounds if buffer else self.compressor.rounds_to_retain
        return Schedule.for_role(self.section.fold_schedule, settings=self.compressor, budget=self.budget, keep=keep, buffer=buffer)

    @property
    def folds_share_prompt(self) -> bool:
        """Whether folds open with the role's own prompt (`fold_prompt: role`): only where the round
        compressor's model is the role's, since another server or model holds nothing of it."""
        same = (self.folder.api_base, self.folder.model) == (self.llm.api_base, self.llm.model)
        return self.section.fold_prompt == "role" and same

    def fold_limits(self) -> FoldLimits:
        """The sizes of this role's fold calls: its prompts fit its own model's window, folds the round compressor's."""
        return FoldLimits.for_budget(
            self.budget, max_summary_tokens=self.compressor.max_summary_tokens, window=self.folder.context_window, margin=self.folder.margin
        )


@dataclass(frozen=True)
class ContextReport:
    """Where a role's last prompt spent its tokens, against the budget (for /context)."""

    role: str
    label: str
    strategy: Strategy
    budget: int
    folded_through: int
    fold_running: bool
    cost: PromptCost

    def to_dict(self) -> dict[str, Any]:
        """JSON shape: the fields by name, the cost's fields inline."""
        head = {"role": self.role, "label": self.label, "strategy": self.strategy, "budget": self.budget}
        return {**head, "folded_through": self.folded_through, "fold_running": self.fold_running, **asdict(self.cost)}

    def parts(self) -> dict[str, int]:
        """Tokens per part, in prompt order."""
        cost = self.cost
        return {
            "system": cost.system,
            "summary": cost.summary,
            "variables": cost.variables,
            "examples": cost.examples,
            "retained rounds": cost.retained_rounds,
            "current round": cost.current_round,
        }


@dataclass(frozen=True)
class _Sent:
    """A role's prompt as last built: its messages, where each kept earlier round ends, the state it showed."""

    messages: tuple[Message, ...]
    round_ends: dict[int, int]
    shown: CompressionState


@dataclass(frozen=True)
class BuiltPrompt:
    """The messages to send and what they cost."""

    messages: tuple[Message, ...]
    report: ContextReport


class RoleContext:
    """One role's prompt history: its summary state, its background folds, and its budget guard."""

    def __init__(
        self,
        settings: ContextSettings,
        *,
        model: ChatModel,
        tokenizer: Tokenizer,
        live_variables: Callable[[], LiveVariables] | None = None,
        on_fold: Callable[[Folded], None] | None = None,
    ) -> None:
        """`live_variables` gives the kernel's truth; with it the prompt lists the variables (the CodeGenerator's)."""
        self.role = settings.role
        self.label = settings.label
        self.llm = settings.llm  # the model this role's prompts are sent to (its window sizes the budget)
        self.strategy: Strategy = settings.strategy
        self._fold_template = settings.fold_template
        self._share_prompt = settings.folds_share_prompt
        self._examples_always = settings.section.examples == "always"
        self._settings = settings.compressor
        self._budget = settings.budget
        self._budget_source = settings.budget_source
        self._schedule = settings.schedule()
        self._limits = settings.fold_limits()
        self._model = model
        self._tokenizer = tokenizer
        # Fold calls go to the round compressor's model: counted in its tokens (the role's, when it is the same model).
        self._fold_tokenizer = model.tokenizer(f"compression_{self.role}") or tokenizer
        self._live_variables = live_variables
        self._on_fold = on_fold
        if self._share_prompt:  # a fold that opens with the role's prompt meets it in the role's cache key or slot
            model.share_cache(f"compression_{self.role}", self.role)
        # Guards everything below; `_state` is immutable, so a reader takes it once and is consistent.
        self._lock = threading.Condition()
        self._state = CompressionState()
        self._generation = 0  # bumped by restore(): a fold started before it is discarded
        self._worker: threading.Thread | None = None
        self._pending: tuple[RoundMessages, ...] = ()
        self._pending_live: LiveVariables | None = None
        self._fold_in_trace = self._fold  # `_fold`, in the context of the request whose rounds are pending (tracing.carried)
        self._failures = 0
        self._retry_at = 0.0
        self._closed = False
        self._report: ContextReport | None = None
        self._sent: _Sent | None = None  # the prompt last built, the start of the next fold under fold_prompt: role
        self._shown_round: int | None = None
        self._shown, self._variables, self._window_start = self._state, None, 0
        self._variables_under = ""  # the summary the variables snapshot was rendered with
        self._landed_at = 0  # the round whose first request showed `_shown` first

    # What the prompts of the round in progress show: the state as of its first request (`_shown`), the
    # variables list rendered then (`_variables`, rendered again at a merge or when it would mislead),
    # and, for rounds kept whole under the pressure schedule, the first round still shown (`_window_start`);
    # `_landed_at`: the round whose first request showed `_shown` first (its memory broke the prefix).
    _shown: CompressionState
    _variables: VariablesList | None
    _window_start: int

    @property
    def state(self) -> CompressionState:
        """The current summary, its Variables, the last folded round and the fold log."""
        with self._lock:
            return self._state

    def restore(self, state: CompressionState, *, afresh: bool = False) -> None:
        """Continue from a saved state (a resumed session); a fold still running is discarded.

        `afresh`: also forget how earlier prompts were laid out (the variables list, the window's
        start), as a context built for a freshly loaded session would: rounds another server added
        are shown exactly as loading the session would show them.
        """
        with self._lock:
            self._state = state
            self._shown_round = None
            self._sent = None
            self._generation += 1
            self._failures = 0
            self._retry_at = 0.0
            if afresh:
                self._pending, self._pending_live, self._report = (), None, None
                self._shown, self._variables, self._window_start = state, None, 0
                self._variables_under, self._landed_at = "", 0

    def report(self) -> ContextReport | None:
        """Tokens per part of the last prompt built, against the budget."""
        with self._lock:
            return self._report

    @property
    def budget(self) -> int:
        """Tokens this role's prompts may use."""
        return self._budget

    @property
    def lists_variables(self) -> bool:
        """Whether this role's prompt lists the kernel's variables (the code-running role's)."""
        return self._live_variables is not None

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer every count of this role's prompts is made with."""
        return self._tokenizer

    @property
    def fold_tokenizer(self) -> Tokenizer:
        """The tokenizer this role's fold calls are counted with (the round compressor's model's)."""
        return self._fold_tokenizer

    def count_with(self, tokenizer: Tokenizer, *, folds: Tokenizer | None = None) -> None:
        """Count this role's prompts with `tokenizer` from the next one on (its model changed), its folds with `folds`."""
        self._tokenizer = tokenizer
        self._fold_tokenizer = folds or tokenizer

    def build(self, *, system: str, examples: Sequence[Message], history: Sequence[RoundMessages], current: RoundMessages, reserve: int = 0) -> BuiltPrompt:
        """The prompt for this role now, within the budget less `reserve` (room for a repair turn); never waits for a fold."""
        state, running, landed = self._adopt(current.index)
        summarising = self.strategy in SUMMARISING
        retained = self._retained(state, history)
        # Under pressure, rounds kept whole leave in steps (`_drop_in_one_step`), never cut message by message.
        stepped = not summarising and self._schedule.kind == "pressure"
        order: ShrinkOrder = "window" if self.strategy == "sliding_window" or stepped else "standard"
        fit = functools.partial(
            fit_prompt, tokenizer=self._tokenizer, budget=self._budget - reserve, order=order, budget_source=self._budget_source, who=self.label
        )
        parts = PromptParts(
            system=system,
            summary=render_summary(state) if summarising else "",
            placement=self._settings.summary_placement,
            examples=self._examples_for(examples, retained),
            rounds=retained,
            current=current,
            variables=self._variables_block(state, retained, current, landed=landed),
            variables_cap=int(self._budget * VARIABLES_SHARE),
        )
        fitted = fit(parts)
        dropped = bool(fitted.cost.rounds_dropped)
        if dropped and stepped:
            retained = self._drop_in_one_step(retained, fitted.cost.rounds_kept)
            parts = replace(parts, rounds=retained, examples=self._examples_for(examples, retained))
            fitted = fit(parts)
        if dropped and self._unnamed(retained, fitted.cost.rounds_kept, current, named=state.named):
            # Rounds left the prompt whose variables the list leaves unnamed: name them now.
            fitted = fit(replace(parts, variables=self._variables_block(state, retained, current, landed=landed, force=True)))
        report = ContextReport(
            role=self.role,
            label=self.label,
            strategy=self.strategy,
            budget=self._budget,
            folded_through=state.folded_through,
            fold_running=running,
            cost=fitted.cost,
        )
        with self._lock:
            self._report = report
            self._sent = _Sent(fitted.messages, dict(fitted.round_ends), state)
        return BuiltPrompt(messages=fitted.messages, report=report)

    def _retained(self, state: CompressionState, history: Sequence[RoundMessages]) -> tuple[RoundMessages, ...]:
        """The earlier rounds this round's prompts show: unfolded ones, masked ones masked, none before the window's start."""
        if self.strategy in SUMMARISING:
            return tuple(r for r in history if r.index > state.folded_through)
        shown = (r for r in history if r.index >= self._window_start)
        if self.strategy == "observation_masking":
            # Masked rounds keep their messages' roles and order: only what the code printed is shorter.
            return tuple(RoundMessages(r.index, r.masked_messages, variables=r.variables) if r.index <= state.folded_through else r for r in shown)
        return tuple(shown)

    def _examples_for(self, examples: Sequence[Message], retained: Sequence[RoundMessages]) -> tuple[Message, ...]:
        # Once the prompt shows a round of the role's own, its replies show the format as well as
        # the examples did: leaving them out saves their tokens in every later call.
        return tuple(examples) if self._examples_always or not any(r.messages for r in retained) else ()

    def _drop_in_one_step(self, retained: Sequence[RoundMessages], kept: Sequence[int]) -> tuple[RoundMessages, ...]:
        """Pressure schedule, rounds kept whole (no summary): the guard had to drop rounds; drop until those
        left take half of what fitted, so the prompt's start stays put for several rounds, not one."""
        fitted = [r for r in retained if r.index in set(kept)]
        sizes = [self._tokenizer.count_messages(r.messages) for r in fitted]
        room, start = sum(sizes) // 2, 0
        while start < len(fitted) - 1 and sum(sizes[start:]) > room:
            start += 1
        with self._lock:
            self._window_start = fitted[start].index if fitted else self._window_start
        return tuple(fitted[start:])

    def _adopt(self, round_index: int) -> tuple[CompressionState, bool, bool]:
        """The state this round's prompts show, whether a fold runs, and whether a new state landed just now."""
        with self._lock:
            landed = False
            if round_index != self._shown_round:
                landed = self._shown_round is None or self._state is not self._shown
                self._shown_round, self._shown = round_index, self._state
                self._landed_at = round_index if landed else self._landed_at
            return self._shown, self._worker is not None, landed

    def detailed_from(self, round_index: int) -> int:
        """The oldest earlier round that round `round_index`'s prompts show in full detail (a role's `render_round`).

        A fold that lands rewrites the prompt from the memory on, so the rounds shown then may drop their
        detail (the Planner's code) at no cost to the cache; rounds that finish after it keep theirs
        until the next fold lands, so that between folds each prompt extends the one before it byte
        for byte. Strategies without a summary show earlier rounds without detail, as always.
        """
        with self._lock:
            if self.strategy not in SUMMARISING:
                return round_index
            if round_index != self._shown_round and (self._shown_round is None or self._state is not self._shown):
                return round_index  # a new state lands at this round's first request
            return self._landed_at

    def _variables_block(
        self, state: CompressionState, retained: Sequence[RoundMessages], current: RoundMessages, *, landed: bool, force: bool = False
    ) -> Callable[[int], str] | None:
        """How to render the variables list at a token cap, or None for a role without one.

        The snapshot stays as it is while every live name is in it, in a retained round's own lines
        or in the summary's notes, and while the summary only grew after it (`landed`: a fold
        landed); otherwise it is rendered again, most relevant first.
        """
        live = self._live()
        if live is None:
            return None
        cap = int(self._budget * VARIABLES_SHARE)
        snapshot = self._variables
        merged = landed and not state.summary.startswith(self._variables_under)
        stale = snapshot is None or force or merged or self._unnamed(retained, tuple(r.index for r in retained), current, named=state.named, live=live)
        if stale:
            texts = [m["content"] for r in (current, *reversed(retained)) for m in r.messages]
            relevant = mentioned_names(texts)
            snapshot = render_variables(live, described=state.variables, relevant=relevant, max_tokens=cap, tokenizer=self._tokenizer)
            with self._lock:
                self._variables, self._variables_under = snapshot, state.summary
        assert snapshot is not None
        fixed, tokenizer = snapshot, self._tokenizer

        def render(limit: int) -> str:
            if tokenizer.count(fixed.text) <= limit:
                return fixed.text
            return render_variables(live, described=state.variables, max_tokens=limit, tokenizer=tokenizer).text

        return render

    def _unnamed(
        self,
        retained: Sequence[RoundMessages],
        kept: Sequence[int],
        current: RoundMessages,
        *,
        named: Sequence[str] = (),
        live: LiveVariables | None = None,
    ) -> bool:
        """Whether the snapshot misleads: a live variable it did not cover and neither a kept round nor
        the summary's notes (`named`) name, or one it lists that is gone."""
        live = live if live is not None else self._live()
        snapshot = self._variables
        if live is None or snapshot is None:
            return live is not None
        names = {v.name for v in live.variables}
        if names and not snapshot.covered:
            return True  # a list made while the kernel was empty says nothing worth keeping
        shown = set(kept)
        in_rounds = {name for r in retained if r.index in shown for name in r.variables} | set(current.variables) | set(named)
        return bool(names - snapshot.covered - in_rounds) or bool(snapshot.covered - names)

    def round_finished(self, history: Sequence[RoundMessages]) -> None:
        """Note the finished rounds; start a background fold if one is due. Returns at once."""
        if self.strategy == "observation_masking":
            self._mask(history)
            return
        if self.strategy not in SUMMARISING:
            return
        live = self._live()
        with self._lock:
            self._pending, self._pending_live = tuple(history), live
            self._fold_in_trace = tracing.carried(self._fold)  # a fold of these rounds belongs to the request that finished them
            self._start_due_fold()  # if a fold is running, it starts the next one when it ends

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no fold is running or due to start; False if `timeout` passed first."""
        with self._lock:
            return self._lock.wait_for(lambda: self._worker is None, timeout)

    def close(self) -> None:
        """Start no more folds; a fold still running finishes on its own and is discarded."""
        with self._lock:
            self._closed = True
            self._generation += 1

    def _live(self) -> LiveVariables | None:
        return self._live_variables() if self._live_variables is not None else None

    def _due(self, state: CompressionState, history: Sequence[RoundMessages]) -> tuple[RoundMessages, ...]:
        """The rounds to fold now, oldest first; empty when no fold is due."""
        # Rounds this role took no part in (a chat-only round for the CodeGenerator) cost nothing to
        # keep, so they neither count towards a fold nor go into one; a fold past them covers them.
        unfolded = [r for r in history if r.index > state.folded_through and r.messages]
        return self._schedule.due(unfolded, self._tokenizer)

    def _mask(self, history: Sequence[RoundMessages]) -> None:
        """Observation masking: the rounds the schedule lets go are shown masked from the next round on."""
        with self._lock:
            due = self._due(self._state, history)
            if due:
                self._state = replace(self._state, folded_through=due[-1].index)

    def _start_due_fold(self) -> None:
        """Start a worker for the fold due now, if any and none is running; the lock must be held."""
        if self._closed or self._worker is not None or time.monotonic() < self._retry_at:
            return
        due = self._due(self._state, self._pending)
        if due:
            # The state `due` was chosen from, and the kernel's truth as of the newest finished round.
            job = {"due": due, "generation": self._generation, "live": self._pending_live, "prefix": self._role_prefix(due)}
            self._worker = threading.Thread(target=self._fold_in_trace, args=(self._state,), kwargs=job, name=f"fold-{self.role}", daemon=True)
            self._worker.start()

    def _role_prefix(self, due: Sequence[RoundMessages]) -> RolePrefix | None:
        """The role's last prompt cut after the last of `due`, or None for the separate fold prompt: under
        `fold_prompt: separate`, before any prompt was built, or when a round of `due` is not among the
        earlier rounds that prompt showed (the guard dropped it, or it was the round in progress)."""
        sent = self._sent
        if not self._share_prompt or sent is None or any(r.index not in sent.round_ends for r in due):
            return None
        # Rounds that prompt showed before the first folded one: summarised since its memory was shown.
        skipped = sum(1 for index in sent.round_ends if index < due[0].index)
        return RolePrefix(messages=sent.messages[: sent.round_ends[due[-1].index]], skipped=skipped, summary_shown=sent.shown.summary)

    def _fold(
        self,
        previous: CompressionState,
        *,
        due: tuple[RoundMessages, ...],
        generation: int,
        live: LiveVariables | None,
        prefix: RolePrefix | None,
    ) -> None:
        """Fold `due` in this worker thread, then start the next fold if rounds finished meanwhile."""
        try:
            with tracing.fold(role=self.role, first_round=due[0].index, last_round=due[-1].index) as traced:
                result = self._attempt(previous, due=due, live=live, prefix=prefix)
                traced.finished(result.events)
            failed = next((e for e in result.events if not e.ok), None)
            with self._lock:
                if generation != self._generation:
                    return  # restored or closed meanwhile: this result belongs to another state
                if result.state is not None:
                    self._state = result.state  # the batches that succeeded count, even if a later one failed
                if failed is None:
                    self._failures, self._retry_at = 0, 0.0
                else:
                    self._state = self._state.logged(failed)
                    self._failures += 1
                    self._retry_at = time.monotonic() + self._settings.retry_backoff * 2 ** (self._failures - 1)
            if self._on_fold is not None:
                for event in result.events:
                    self._on_fold(event)  # from this worker thread
        finally:
            with self._lock:
                self._worker = None
                # Rounds that finished while this fold ran (or on_fold ran) found it busy and left the
                # check to us. After a failure only a later round retries, so a broken model is not
                # called in a loop.
                if not self._failures:
                    self._start_due_fold()
                self._lock.notify_all()

    def _attempt(self, previous: CompressionState, *, due: tuple[RoundMessages, ...], live: LiveVariables | None, prefix: RolePrefix | None) -> FoldResult:
        """One fold call; any failure, even a bug, becomes a failed event instead of killing the worker."""
        style: FoldStyle = "narrative" if self.strategy == "summary_buffer" else "rounds"
        try:
            return fold_rounds(
                previous,
                rounds=due,
                role=self.role,
                label=self.label,
                prompt=self._fold_template,
                style=style,
                model=self._model,
                tokenizer=self._fold_tokenizer,
                limits=self._limits,
                live=live,
                prefix=prefix,
            )
        except Exception as exc:  # noqa: BLE001 - fold_rounds turns expected failures into events; this is a bug, and a worker must survive it
            error = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
            # Token counts are unknown: the attempt broke before it could report them.
            return FoldResult(state=None, events=(Folded(self.role, due[0].index, due[-1].index, 0, 0, ok=False, error=error, label=self.label),))
