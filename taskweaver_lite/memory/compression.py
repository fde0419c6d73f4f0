"""Round compression: each role's prompt history, folded into summaries in the background, kept in budget.

A `RoleContext` per role decides what of the conversation goes into that role's prompt. Finished
rounds fold into the role's summary by model calls in a worker thread (summary.py); `build` never
waits for a fold and uses the newest summary that is ready, with the rounds not yet folded
verbatim. The CodeGenerator's prompt also carries the kernel's variables, once, within their share
of the budget (variables.py). Whatever the strategy, the budget guard (budget.py) keeps every
prompt within `llm.context_window - llm.reply_reserve - llm.margin`, and fold calls keep prompt +
max_tokens within `llm.context_window`.

Strategies (`<role>.strategy`):
- round_compression: fold everything older than the latest `rounds_to_retain` rounds once
  `rounds_to_compress + rounds_to_retain` rounds are unfolded (TaskWeaver's rule), or earlier when
  the unfolded rounds pass `fold_token_trigger` tokens (at most half the budget, so the retained
  rounds always leave room for the current one).
- summary_buffer: the last `summary_buffer_rounds` rounds verbatim, everything older in one
  narrative summary.
- sliding_window: the newest rounds that fit, no model call.
- none: every round; only the budget guard shortens it.
`<role>.prompt_compression: false` turns the summarising strategies into sliding_window.

A context knows its role only through `ContextSettings`: the role's key (config section, store and
call-purpose name), its label on screen, its fold prompt and its own config section, with the
round compressor's settings that section overrides (`<role>.rounds_to_compress`...).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from taskweaver_lite.config import Config, LLMConfig, RoleConfig, RoundCompressorConfig, Strategy, merged_llm
from taskweaver_lite.events import Folded
from taskweaver_lite.llm.client import ChatModel, Message
from taskweaver_lite.llm.tokens import Tokenizer
from taskweaver_lite.memory.budget import PromptCost, PromptParts, ShrinkOrder, fit_prompt
from taskweaver_lite.memory.conversation import RoundMessages
from taskweaver_lite.memory.summary import VARIABLES_SHARE, CompressionState, FoldLimits, FoldResult, FoldStyle, fold_rounds, render_summary
from taskweaver_lite.memory.variables import LiveVariables, mentioned_names, render_variables


@dataclass(frozen=True)
class ContextSettings:
    """What a `RoleContext` needs to know of its role: names, fold prompt, its own section and models."""

    role: str  # the role's key: its config section, stored summary and call purpose ("planner", "code_generator", "echo")
    label: str  # its name on screen
    section: RoleConfig  # the role's own config section (strategy, prompt_compression, examples, llm, fold overrides)
    compressor: RoundCompressorConfig  # round_compressor, with the keys the role's section overrides
    llm: LLMConfig  # the role's model: its prompts fit this window
    folder: LLMConfig  # the round compressor's model: folds fit this window
    llm_key: str  # where the role's window is set, for messages: "llm" or "planner.llm"
    fold_prompt: str  # prompts/<fold_prompt>.yaml

    @classmethod
    def of(cls, config: Config, role: str, *, section: RoleConfig | None = None, label: str | None = None, fold_prompt: str | None = None) -> ContextSettings:
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
            fold_prompt=fold_prompt or f"compression_{role}",
        )

    @property
    def budget(self) -> int:
        """Tokens the role's prompts may use: its model's window minus reply reserve and margin."""
        return self.llm.context_window - self.llm.reply_reserve - self.llm.margin


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
        role_config = settings.section
        self.role = settings.role
        self.label = settings.label
        self._fold_prompt = settings.fold_prompt
        self.strategy: Strategy = role_config.strategy
        self._examples_always = role_config.examples == "always"
        if not role_config.prompt_compression and self.strategy in ("round_compression", "summary_buffer"):
            self.strategy = "sliding_window"
        self._settings = settings.compressor
        # Each role's prompts fit its own model's window; folds fit the round compressor's.
        llm, folder = settings.llm, settings.folder
        self._budget = settings.budget
        self._limits = FoldLimits.for_budget(
            self._budget,
            max_summary_tokens=settings.compressor.max_summary_tokens,
            window=folder.context_window,
            margin=folder.margin,
        )
        prefix = settings.llm_key
        self._budget_source = (
            f"{prefix}.context_window {llm.context_window:,} - {prefix}.reply_reserve {llm.reply_reserve:,} "
            f"- {prefix}.margin {llm.margin:,}"
        )
        self._model = model
        self._tokenizer = tokenizer
        self._live_variables = live_variables
        self._on_fold = on_fold
        # Guards everything below; `_state` is immutable, so a reader takes it once and is consistent.
        self._lock = threading.Condition()
        self._state = CompressionState()
        self._generation = 0  # bumped by restore(): a fold started before it is discarded
        self._worker: threading.Thread | None = None
        self._pending: tuple[RoundMessages, ...] = ()
        self._pending_live: LiveVariables | None = None
        self._failures = 0
        self._retry_at = 0.0
        self._closed = False
        self._report: ContextReport | None = None

    @property
    def state(self) -> CompressionState:
        """The current summary, its Variables, the last folded round and the fold log."""
        with self._lock:
            return self._state

    def restore(self, state: CompressionState) -> None:
        """Continue from a saved state (a resumed session); a fold still running is discarded."""
        with self._lock:
            self._state = state
            self._generation += 1
            self._failures = 0
            self._retry_at = 0.0

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

    def build(
        self, *, system: str, examples: Sequence[Message], history: Sequence[RoundMessages], current: RoundMessages, reserve: int = 0
    ) -> BuiltPrompt:
        """The prompt for this role now, within the budget less `reserve` (room for a repair turn); never waits for a fold."""
        with self._lock:
            state, running = self._state, self._worker is not None
        summarising = self.strategy in ("round_compression", "summary_buffer")
        retained = tuple(r for r in history if r.index > state.folded_through) if summarising else tuple(history)
        parts = PromptParts(
            system=system,
            summary=render_summary(state) if summarising else "",
            placement=self._settings.summary_placement,
            # Once the prompt shows a round of the role's own, its replies show the format as well as
            # the examples did: leaving them out saves their tokens in every later call.
            examples=tuple(examples) if self._examples_always or not any(r.messages for r in retained) else (),
            rounds=retained,
            current=current,
            variables=self._variables_block(state, (*retained, current)),
            variables_cap=int(self._budget * VARIABLES_SHARE),
        )
        order: ShrinkOrder = "window" if self.strategy == "sliding_window" else "standard"
        budget = self._budget - reserve
        fitted = fit_prompt(parts, tokenizer=self._tokenizer, budget=budget, order=order, budget_source=self._budget_source, who=self.label)
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
        return BuiltPrompt(messages=fitted.messages, report=report)

    def _variables_block(self, state: CompressionState, shown: Sequence[RoundMessages]) -> Callable[[int], str] | None:
        """How to render the variables list at a token cap, or None for a role without one."""
        live = self._live()
        if live is None:
            return None
        mentioned = mentioned_names([m["content"] for r in shown for m in r.messages])
        tokenizer = self._tokenizer
        return lambda cap: render_variables(live, described=state.variables, mentioned=mentioned, max_tokens=cap, tokenizer=tokenizer)

    def round_finished(self, history: Sequence[RoundMessages]) -> None:
        """Note the finished rounds; start a background fold if one is due. Returns at once."""
        if self.strategy not in ("round_compression", "summary_buffer"):
            return
        live = self._live()
        with self._lock:
            self._pending, self._pending_live = tuple(history), live
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
        settings = self._settings
        keep = settings.summary_buffer_rounds if self.strategy == "summary_buffer" else settings.rounds_to_retain
        if self.strategy == "summary_buffer":
            count_due = len(unfolded) > keep
        else:
            count_due = len(unfolded) >= settings.rounds_to_compress + keep
        fold_upto = max(len(unfolded) - keep, 0)
        trigger = min(settings.fold_token_trigger, self._budget // 2)
        if trigger:
            sizes = [self._tokenizer.count_messages(r.messages) for r in unfolded]
            kept_tokens = sum(sizes[fold_upto:])
            # Large rounds fold early: move the oldest kept rounds into the fold until the rest is
            # under the trigger, but keep the newest round verbatim.
            while kept_tokens > trigger and fold_upto < len(unfolded) - 1:
                kept_tokens -= sizes[fold_upto]
                fold_upto += 1
            if sum(sizes) > trigger and fold_upto > 0:
                count_due = True
        return tuple(unfolded[:fold_upto]) if count_due else ()

    def _start_due_fold(self) -> None:
        """Start a worker for the fold due now, if any and none is running; the lock must be held."""
        if self._closed or self._worker is not None or time.monotonic() < self._retry_at:
            return
        due = self._due(self._state, self._pending)
        if due:
            # The state `due` was chosen from, and the kernel's truth as of the newest finished round.
            job = {"due": due, "generation": self._generation, "live": self._pending_live}
            self._worker = threading.Thread(target=self._fold, args=(self._state,), kwargs=job, name=f"fold-{self.role}", daemon=True)
            self._worker.start()

    def _fold(self, previous: CompressionState, *, due: tuple[RoundMessages, ...], generation: int, live: LiveVariables | None) -> None:
        """Fold `due` in this worker thread, then start the next fold if rounds finished meanwhile."""
        try:
            result = self._attempt(previous, due=due, live=live)
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

    def _attempt(self, previous: CompressionState, *, due: tuple[RoundMessages, ...], live: LiveVariables | None) -> FoldResult:
        """One fold call; any failure, even a bug, becomes a failed event instead of killing the worker."""
        style: FoldStyle = "narrative" if self.strategy == "summary_buffer" else "rounds"
        try:
            return fold_rounds(
                previous,
                rounds=due,
                role=self.role,
                label=self.label,
                prompt=self._fold_prompt,
                style=style,
                model=self._model,
                tokenizer=self._tokenizer,
                limits=self._limits,
                live=live,
            )
        except Exception as exc:  # noqa: BLE001 - fold_rounds turns expected failures into events; this is a bug, and a worker must survive it
            error = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
            # Token counts are unknown: the attempt broke before it could report them.
            return FoldResult(state=None, events=(Folded(self.role, due[0].index, due[-1].index, 0, 0, ok=False, error=error, label=self.label),))
