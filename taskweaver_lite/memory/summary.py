"""A role's summary of its folded rounds: its state, and the fold calls that grow it.

A fold turns finished rounds into summary text with model calls held to the same window as every
other call: the request's prompt plus its `max_tokens` never pass `llm.context_window`, and its
`max_tokens` is sized to the reply it asks for (the summary cap), not to `llm.reply_reserve`.

Folds never lose a round. Rounds that do not fit one call go in several (batches packed by
tokens, oldest first); a round too big for a call on its own is cut head and tail, but keeps its
essential pieces (the user's request, the Planner's instruction, each execution's outcome). A
summary's label names exactly the rounds it saw.

Where a fold's input comes from (`<role>.fold_prompt`): by default (`role`) a fold call is the
role's own prompt as the role last sent it (system message, examples, memory, rounds, in those
bytes), cut after the last round it folds, with the request for the `ConversationSummary` as its
last message; it goes to the role's cache key or slot, so a server that holds the role's prompt
computes only that request and the reply. `separate` sends the fold prompt of its own instead
(`prompts/compression_<role>.yaml`'s system and user parts), each round cut to size.

Folds are incremental to keep them cheap: while the summary has room, a fold sends only the new
rounds and appends notes on them ("append"); when the notes would pass the summary cap, it sends
the previous summary with the new rounds and asks for one shorter summary ("merge"). The
summary's Variables are only descriptions: the list a prompt shows always comes from the kernel
(`variables.py`). For a role that sees the variables, appended notes end with a line naming the
variables the folded rounds made or changed that the kernel still holds (their types from the
kernel), so the variables list rendered before them stays valid, and byte for byte cached, until
the next merge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from taskweaver_lite.errors import ReplyFormatError, TaskWeaverError
from taskweaver_lite.llm.client import ChatModel
from taskweaver_lite.llm.replies import SUMMARY_SCHEMA, parse_reply, repair_message
from taskweaver_lite.llm.templates import load_prompt
from taskweaver_lite.llm.tokens import Tokenizer
from taskweaver_lite.memory.variables import LiveVariables, names_line
from taskweaver_lite.records.conversation import RoundMessages
from taskweaver_lite.records.events import Folded
from taskweaver_lite.records.execution import Variable
from taskweaver_lite.records.model_calls import Message

FoldStyle = Literal["rounds", "narrative"]
FoldMode = Literal["append", "merge"]
HEADING = "## Summary of earlier rounds"
# Enough fold records to explain a long session; older ones say nothing a user still needs.
MAX_LOG_ENTRIES = 100
# The summary's share of a role's prompt budget, and the variables list's (variables.py renders it).
SUMMARY_SHARE = 0.20
VARIABLES_SHARE = 0.12
# Appended notes on one batch may take this share of the summary cap; a merge asks for this share of it.
NOTES_SHARE = 0.34
MERGE_SHARE = 0.60
# Variable descriptions a CodeGenerator fold may return, and what they may cost.
MAX_DESCRIBED = 15
DESCRIPTION_TOKENS = 24
REPLY_OVERHEAD = 32  # JSON keys, quotes and brackets around the summary
# One round's text in a separate fold prompt is cut to a tenth of the role's budget (574 tokens at
# 8k), keeping its essential pieces: a summary keeps a few lines of a round, not its whole output,
# and every token of such a fold's input is computed afresh (it shares nothing with the role's prompt).
ROUND_SHARE = 10
MIN_ROUND_TOKENS = 64
# An appended note names this many of its rounds' variables with their types, this many more by
# name, and numbered runs as one entry past that.
NOTED_WITH_TYPE = 12
NOTED_BY_NAME = 60


@dataclass(frozen=True)
class CompressionState:
    """A role's summary of its folded rounds: what a saved session keeps to restore its prompts."""

    summary: str = ""
    variables: tuple[Variable, ...] = ()  # the model's descriptions of kernel variables, by name
    lost: tuple[str, ...] = ()
    folded_through: int = 0  # index of the last round in the summary; 0 = nothing folded yet
    log: tuple[Folded, ...] = ()
    named: tuple[str, ...] = ()  # variables named by the notes appended since the summary was last merged

    def to_dict(self) -> dict[str, Any]:
        """JSON shape: {summary, variables, lost, folded_through, log, named}."""
        return {
            "summary": self.summary,
            "variables": [v.to_dict() for v in self.variables],
            "lost": list(self.lost),
            "folded_through": self.folded_through,
            "log": [e.to_dict() for e in self.log],
            "named": list(self.named),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompressionState:
        """Inverse of `to_dict`."""
        return cls(
            summary=str(data.get("summary", "")),
            variables=tuple(Variable.from_dict(v) for v in data.get("variables", ())),
            lost=tuple(data.get("lost", ())),
            folded_through=int(data.get("folded_through", 0)),
            log=tuple(Folded.from_dict(e) for e in data.get("log", ())),
            named=tuple(data.get("named", ())),
        )

    def logged(self, event: Folded) -> CompressionState:
        """This state with `event` appended to the fold log."""
        return replace(self, log=(*self.log, event)[-MAX_LOG_ENTRIES:])


def render_summary(state: CompressionState) -> str:
    """The summary as prompt text under a fixed heading; '' before any fold.

    No round numbers, counts or times: the text changes only when the summary does, and a fold
    that appends notes leaves every byte before them as the server cached it.
    """
    if not state.summary and not state.folded_through:
        return ""
    lines = [f"{HEADING} (use only what the current request needs)", state.summary.strip() or "(nothing of note)"]
    # Lost variables are the variables list's to show (variables.py): it knows what was recreated since.
    return "\n".join(lines)


@dataclass(frozen=True)
class FoldLimits:
    """The token sizes of fold calls for one role, from its prompt budget and the window."""

    summary_tokens: int  # the summary's cap: its share of the role's prompt budget
    window: int  # llm.context_window: prompt + max_tokens of a fold stay within it
    margin: int  # llm.margin, kept free as for every call
    round_tokens: int  # one round's text in a fold is cut to this, keeping its essential pieces

    @classmethod
    def for_budget(cls, budget: int, *, max_summary_tokens: int, window: int, margin: int) -> FoldLimits:
        """Limits for a role whose prompts get `budget` tokens."""
        summary = max(MIN_ROUND_TOKENS, min(max_summary_tokens, int(budget * SUMMARY_SHARE)))
        return cls(summary_tokens=summary, window=window, margin=margin, round_tokens=max(MIN_ROUND_TOKENS * 4, budget // ROUND_SHARE))

    def reply_tokens(self, mode: FoldMode, *, describes_variables: bool) -> int:
        """The fold call's `max_tokens`: the summary (or notes) it asks for, plus variable descriptions."""
        return self.text_tokens(mode) + REPLY_OVERHEAD + (MAX_DESCRIBED * DESCRIPTION_TOKENS if describes_variables else 0)

    def text_tokens(self, mode: FoldMode) -> int:
        """The summary text a fold of `mode` may write: a merged summary leaves room for notes to follow."""
        share = MERGE_SHARE if mode == "merge" else NOTES_SHARE
        return max(MIN_ROUND_TOKENS, int(self.summary_tokens * share))


@dataclass(frozen=True)
class RolePrefix:
    """The start of a fold call under `<role>.fold_prompt: role`: the role's own prompt as it last sent it,
    cut after the last round the fold takes (system message, examples, memory, rounds; none it keeps)."""

    messages: tuple[Message, ...]
    skipped: int  # rounds in it, after the memory, that an earlier fold summarised since that memory was shown
    summary_shown: str  # the summary its memory shows


@dataclass(frozen=True)
class FoldResult:
    """What a fold produced: the newest state (None if no batch succeeded) and an event per batch tried."""

    state: CompressionState | None
    events: tuple[Folded, ...]


@dataclass(frozen=True)
class _Fold:
    """Who folds, how, with what."""

    role: str  # the role's key: the fold call's purpose is compression_<role>
    label: str
    prompt: str  # the fold prompt's file name under prompts/
    style: FoldStyle
    model: ChatModel
    tokenizer: Tokenizer
    limits: FoldLimits
    live: LiveVariables | None

    @property
    def describes_variables(self) -> bool:
        # Only a role whose prompt lists the kernel's variables is folded with their descriptions.
        return self.live is not None


def fold_rounds(
    previous: CompressionState,
    *,
    rounds: Sequence[RoundMessages],
    role: str,
    label: str,
    prompt: str,
    style: FoldStyle,
    model: ChatModel,
    tokenizer: Tokenizer,
    limits: FoldLimits,
    live: LiveVariables | None,
    prefix: RolePrefix | None = None,
) -> FoldResult:
    """Fold `rounds` into the summary, in as many calls as it takes; stops at the first failed call.

    With `prefix` (the role's own prompt up to the last of `rounds`) one call asks for the summary
    after it, so a server's prefix cache serves everything but the request. When that call would
    not fit the window with its reply (a reply reserve smaller than the fold's reply), the rounds
    go to the separate fold prompt instead, which cuts them to size and batches them.
    """
    fold = _Fold(role, label, prompt, style, model, tokenizer, limits, live)
    if prefix is not None:
        mode = _mode(previous, fold)
        messages = role_fold_prompt(previous, rounds=rounds, fold=fold, mode=mode, prefix=prefix)
        if tokenizer.count_messages(messages) + limits.reply_tokens(mode, describes_variables=fold.describes_variables) <= limits.window - limits.margin:
            result, event = _fold_batch(previous, rounds, fold, mode, messages)
            return FoldResult(state=result.logged(event) if result is not None else None, events=(event,))
    state: CompressionState | None = None
    events: list[Folded] = []
    pending = list(rounds)
    while pending:
        current = state or previous
        mode = _mode(current, fold)
        batch = _batch(current, pending, fold, mode)
        result, event = _fold_batch(current, batch, fold, mode, fold_prompt(current, rounds=batch, fold=fold, mode=mode))
        events.append(event)
        if result is None:
            break
        state = result.logged(event)
        pending = pending[len(batch) :]
    return FoldResult(state=state, events=tuple(events))


def _mode(state: CompressionState, fold: _Fold) -> FoldMode:
    if fold.style == "narrative" or not state.summary:
        return "merge"
    room = fold.limits.summary_tokens - fold.tokenizer.count(state.summary)
    return "append" if room >= fold.limits.text_tokens("append") else "merge"


def _room(state: CompressionState, fold: _Fold, mode: FoldMode) -> int:
    """Tokens the rounds may take in one fold call of `mode`."""
    empty = fold_prompt(state, rounds=(), fold=fold, mode=mode)
    reply = fold.limits.reply_tokens(mode, describes_variables=fold.describes_variables)
    return fold.limits.window - fold.limits.margin - reply - fold.tokenizer.count_messages(empty)


def _batch(state: CompressionState, pending: Sequence[RoundMessages], fold: _Fold, mode: FoldMode) -> list[RoundMessages]:
    """The oldest pending rounds that fit one call (at least one: it is cut to fit)."""
    room = _room(state, fold, mode)
    batch: list[RoundMessages] = []
    used = 0
    for rnd in pending:
        size = fold.tokenizer.count(round_text(rnd, limit=fold.limits.round_tokens, tokenizer=fold.tokenizer)) + 16
        if batch and used + size > room:
            break
        batch.append(rnd)
        used += size
    return batch


def _fold_batch(
    state: CompressionState, batch: Sequence[RoundMessages], fold: _Fold, mode: FoldMode, messages: list[Message]
) -> tuple[CompressionState | None, Folded]:
    """One fold call of `messages` on `batch`: the new state, or None and a failed event."""
    tokenizer = fold.tokenizer
    first, last = batch[0].index, batch[-1].index
    tokens_before = sum(tokenizer.count_messages(r.messages) for r in batch)
    max_tokens = fold.limits.reply_tokens(mode, describes_variables=fold.describes_variables)
    cap = fold.limits.text_tokens(mode)
    purpose = f"compression_{fold.role}"
    try:
        completion = fold.model.complete(messages, purpose=purpose, max_tokens=max_tokens, schema=SUMMARY_SCHEMA)
        try:
            fields = _read_summary(completion.text, tokenizer=tokenizer, cap=cap)
        except ReplyFormatError as problem:
            echo = Message(role="assistant", content=_clip(completion.text, tokenizer, cap))
            repair = [*messages, echo, Message(role="user", content=repair_message(problem, SUMMARY_SCHEMA))]
            if tokenizer.count_messages(repair) + max_tokens > fold.limits.window - fold.limits.margin:
                raise
            completion = fold.model.complete(repair, purpose=purpose, max_tokens=max_tokens, schema=SUMMARY_SCHEMA)
            # The repaired reply only has to be valid; text still too long is cut rather than lost.
            fields = _read_summary(completion.text, tokenizer=tokenizer, cap=None)
    except TaskWeaverError as exc:  # unreachable model, unusable reply: keep the rounds, retry later
        return None, Folded(fold.role, first, last, tokens_before, tokens_before, ok=False, error=_one_line(exc), label=fold.label)
    text = tokenizer.truncate_middle(fields["ConversationSummary"].strip(), cap)
    named: tuple[str, ...] = ()
    if mode == "merge":
        summary = text
    else:
        line, named = _variables_note(batch, fold.live)
        summary = "\n".join(part for part in (state.summary.rstrip(), text, line) if part).strip()
        named = tuple(dict.fromkeys((*state.named, *named)))
    described = tuple(Variable(name=v["name"], type=v["type"], description=v.get("description", "")) for v in fields.get("Variables", ()))
    new = replace(
        state,
        summary=summary,
        variables=_described(state.variables, described, fold.live),
        lost=_lost(state, fold.live),
        folded_through=last,
        named=named,
    )
    return new, Folded(fold.role, first, last, tokens_before, tokenizer.count(render_summary(new)), ok=True, label=fold.label)


def _variables_note(batch: Sequence[RoundMessages], live: LiveVariables | None) -> tuple[str, tuple[str, ...]]:
    """The line appended notes end with: the batch's variables the kernel still holds, and their names."""
    if live is None:
        return "", ()
    alive = {v.name: v for v in live.variables}
    names = tuple(dict.fromkeys(name for r in batch for name in r.variables if name in alive))
    if not names:
        return "", ()
    line = "Variables these rounds made or changed: " + ", ".join(f"{name} ({alive[name].type})" for name in names[:NOTED_WITH_TYPE])
    rest = names[NOTED_WITH_TYPE:]
    if len(rest) > NOTED_BY_NAME:  # a loop that made hundreds: numbered runs as one entry each
        line += "; and" + names_line(rest).removeprefix("Also")
    elif rest:
        line += "; and " + ", ".join(rest)
    return line, names


def _described(before: Sequence[Variable], told: Sequence[Variable], live: LiveVariables | None) -> tuple[Variable, ...]:
    """Descriptions by name, the newest winning, kept only for variables the kernel still holds."""
    if live is None:
        return ()
    alive = {v.name: v for v in live.variables}
    merged = {v.name: v for v in before}
    merged.update({v.name: v for v in told if v.description.strip()})
    return tuple(replace(v, type=alive[name].type) for name, v in merged.items() if name in alive)


def _lost(state: CompressionState, live: LiveVariables | None) -> tuple[str, ...]:
    if live is None:
        return ()
    alive = {v.name for v in live.variables}
    return tuple(dict.fromkeys(name for name in (*state.lost, *live.lost) if name not in alive))


def fold_prompt(state: CompressionState, *, rounds: Sequence[RoundMessages], fold: _Fold, mode: FoldMode) -> list[Message]:
    """The fold call's messages: the previous summary only when merging, each round cut to its limit."""
    template = load_prompt(fold.prompt)
    cap = fold.limits.text_tokens(mode)
    # The system message is the same for every fold of this role and style (the mode and the cap
    # are told last), so a server's prefix cache serves it from one fold to the next.
    system = template.render("system", style=fold.style, max_described=MAX_DESCRIBED)
    shown = [{"index": r.index, "text": round_text(r, limit=fold.limits.round_tokens, tokenizer=fold.tokenizer)} for r in rounds]
    user = template.render(
        "user",
        mode=mode,
        style=fold.style,
        max_summary_tokens=cap,
        previous_summary=state.summary if mode == "merge" else "",
        folded_through=state.folded_through,
        first_round=rounds[0].index if rounds else state.folded_through + 1,
        last_round=rounds[-1].index if rounds else state.folded_through + 1,
        lost=list(_lost(state, fold.live)),
        rounds=shown,
    )
    return [Message(role="system", content=system), Message(role="user", content=user)]


def role_fold_prompt(state: CompressionState, *, rounds: Sequence[RoundMessages], fold: _Fold, mode: FoldMode, prefix: RolePrefix) -> list[Message]:
    """The fold call that opens with the role's own prompt (`prefix`) and asks for the summary in its last message.

    The previous summary is repeated only when the memory in `prefix` shows an older one (a fold
    landed after that prompt was sent); otherwise the instruction points at the one shown.
    """
    instruction = load_prompt(fold.prompt).render(
        "instruction",
        mode=mode,
        style=fold.style,
        max_summary_tokens=fold.limits.text_tokens(mode),
        max_described=MAX_DESCRIBED,
        count=len(rounds),
        skipped=prefix.skipped,
        previous_summary=state.summary if mode == "merge" and state.summary != prefix.summary_shown else "",
        lost=list(_lost(state, fold.live)),
    )
    return [*prefix.messages, Message(role="user", content=instruction)]


def round_text(rnd: RoundMessages, *, limit: int, tokenizer: Tokenizer) -> str:
    """The round's fold text within about `limit` tokens: essential pieces whole, the rest cut head and tail."""
    pieces = rnd.fold_pieces
    full = "\n".join(p.text for p in pieces)
    if tokenizer.count(full) <= limit:
        return full
    essential = [p for p in pieces if p.essential]
    # Essential pieces stay whole unless together they pass the whole limit; then each is cut alike.
    essential_room = limit if sum(tokenizer.count(p.text) for p in essential) <= limit else limit // max(len(essential), 1)
    kept = {id(p): tokenizer.truncate_middle(p.text, essential_room) if p.essential else p.text for p in pieces}
    rest = [p for p in pieces if not p.essential]
    room = limit - sum(tokenizer.count(kept[id(p)]) + 1 for p in essential)
    for piece, text in zip(rest, tokenizer.fit([p.text for p in rest], room=max(room, 0)), strict=True):
        kept[id(piece)] = text
    return "\n".join(kept[id(p)] for p in pieces if kept[id(p)])


def _read_summary(text: str, *, tokenizer: Tokenizer, cap: int | None) -> dict[str, Any]:
    fields = parse_reply(text, SUMMARY_SCHEMA)
    if not fields["ConversationSummary"].strip():
        raise ReplyFormatError("field 'ConversationSummary' is empty; write the summary there")
    if cap is not None:
        size = tokenizer.count(fields["ConversationSummary"])
        if size > cap:
            raise ReplyFormatError(f"'ConversationSummary' has {size:,} tokens; keep it under {cap:,} tokens")
    return fields


def _clip(text: str, tokenizer: Tokenizer, cap: int) -> str:
    """A bad reply as echoed in the repair turn: no longer than a good one could be."""
    return tokenizer.truncate_middle(text, cap * 2 + REPLY_OVERHEAD)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
