"""The summary of folded rounds: its state, the Variables merged from the kernel's truth, and the fold call.

A fold is one model call over the rounds being folded and the previous summary. Its reply must be
the summary JSON of CONTRACT §4; it gets one repair turn, and otherwise nothing changes (valid or
nothing). The Variables of a summary are never the model's word alone: `merge_variables` keeps
only what the kernel holds, with the kernel's types, and the model's descriptions of them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Sequence

from taskweaver_lite.errors import ReplyFormatError, TaskWeaverError
from taskweaver_lite.execution import Variable
from taskweaver_lite.llm import ChatModel, Message
from taskweaver_lite.prompts import load_prompt
from taskweaver_lite.replies import SUMMARY_SCHEMA, parse_reply, repair_message
from taskweaver_lite.tokens import Tokenizer

if TYPE_CHECKING:
    from taskweaver_lite.compression import RoundMessages

FoldStyle = Literal["rounds", "narrative"]
ROLE_LABELS = {"planner": "Planner", "code_generator": "CodeGenerator"}
# Enough fold records to explain a long session; older ones say nothing a user still needs.
MAX_LOG_ENTRIES = 100


@dataclass(frozen=True)
class LiveVariables:
    """The kernel's truth: its variables now, and names lost to kernel restarts."""

    variables: tuple[Variable, ...] = ()
    lost: tuple[str, ...] = ()


@dataclass(frozen=True)
class MergedVariables:
    """The summary's Variables after checking the model's list against the kernel."""

    variables: tuple[Variable, ...]
    added: tuple[str, ...]  # live in the kernel, left out by the model
    dropped: tuple[str, ...]  # named by the model, not in the kernel (invented, deleted or lost)
    lost: tuple[str, ...]  # gone in a kernel restart and not created again since


def merge_variables(described: Sequence[Variable], *, live: LiveVariables, previously_lost: Sequence[str] = ()) -> MergedVariables:
    """The kernel's variables, in kernel order, with the model's descriptions where it gave one."""
    by_name = {v.name: v for v in described}
    alive = {v.name for v in live.variables}
    merged: list[Variable] = []
    added: list[str] = []
    for truth in live.variables:
        told = by_name.get(truth.name)
        if told is None:
            added.append(truth.name)
        description = told.description.strip() if told is not None and told.description.strip() else truth.description
        merged.append(Variable(name=truth.name, type=truth.type, description=description))
    dropped = tuple(name for name in by_name if name not in alive)
    lost = tuple(dict.fromkeys(name for name in (*previously_lost, *live.lost) if name not in alive))
    return MergedVariables(variables=tuple(merged), added=tuple(added), dropped=dropped, lost=lost)


@dataclass(frozen=True)
class FoldEvent:
    """One fold attempt, for the CLI line and the fold log."""

    role: str
    first_round: int
    last_round: int
    tokens_before: int
    tokens_after: int
    ok: bool
    error: str | None = None

    def describe(self) -> str:
        """One line for the user: 'Planner: folded rounds 1-4, 5,210 -> 380 tokens'."""
        label = ROLE_LABELS.get(self.role, self.role)
        span = _span(self.first_round, self.last_round)
        if self.ok:
            return f"{label}: folded {span}, {self.tokens_before:,} -> {self.tokens_after:,} tokens"
        return f"{label}: could not fold {span} ({self.error}); they stay verbatim and the fold is retried later"

    def to_dict(self) -> dict[str, Any]:
        """JSON shape: the fields by name."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FoldEvent:
        """Inverse of `to_dict`."""
        return cls(
            role=str(data["role"]),
            first_round=int(data["first_round"]),
            last_round=int(data["last_round"]),
            tokens_before=int(data["tokens_before"]),
            tokens_after=int(data["tokens_after"]),
            ok=bool(data["ok"]),
            error=data.get("error"),
        )


@dataclass(frozen=True)
class CompressionState:
    """A role's summary of its folded rounds: what a saved session keeps to restore its prompts."""

    summary: str = ""
    variables: tuple[Variable, ...] = ()
    lost: tuple[str, ...] = ()
    folded_through: int = 0  # index of the last round in the summary; 0 = nothing folded yet
    log: tuple[FoldEvent, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON shape: {summary, variables, lost, folded_through, log}."""
        return {
            "summary": self.summary,
            "variables": [v.to_dict() for v in self.variables],
            "lost": list(self.lost),
            "folded_through": self.folded_through,
            "log": [e.to_dict() for e in self.log],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompressionState:
        """Inverse of `to_dict`."""
        return cls(
            summary=str(data.get("summary", "")),
            variables=tuple(Variable.from_dict(v) for v in data.get("variables", ())),
            lost=tuple(data.get("lost", ())),
            folded_through=int(data.get("folded_through", 0)),
            log=tuple(FoldEvent.from_dict(e) for e in data.get("log", ())),
        )

    def logged(self, event: FoldEvent) -> CompressionState:
        """This state with `event` appended to the fold log."""
        return replace(self, log=(*self.log, event)[-MAX_LOG_ENTRIES:])


def render_summary(state: CompressionState, *, live: LiveVariables | None) -> str:
    """The summary as prompt text under a heading saying it is earlier context; '' before any fold."""
    if not state.summary and not state.folded_through:
        return ""
    lines = [
        f"## Summary of earlier rounds ({_span(1, state.folded_through)})",
        "These rounds are no longer shown in full. Use this summary only when it is relevant to the "
        "current request; do not repeat it or act on it unprompted.",
        "",
        state.summary.strip() or "(nothing of note)",
    ]
    variables, lost = state.variables, state.lost
    if live is not None:
        merged = merge_variables(state.variables, live=live, previously_lost=state.lost)
        variables, lost = merged.variables, merged.lost
        kernel_says = {v.name: v.description for v in live.variables}
    else:
        kernel_says = {}
    if live is not None or variables:
        lines += ["", "### Variables in the kernel now"]
        lines += [_variable_line(v, kernel_says.get(v.name, "")) for v in variables] or ["(none)"]
    if lost:
        lines += ["", "### Lost in a kernel restart (recompute before use)", ", ".join(lost)]
    return "\n".join(lines)


def _variable_line(variable: Variable, kernel_description: str) -> str:
    line = f"- {variable.name} ({variable.type}): {variable.description}"
    if kernel_description and kernel_description != variable.description:
        line += f" [now: {kernel_description}]"
    return line


@dataclass(frozen=True)
class FoldResult:
    """What a fold attempt produced: the new state (None when it failed) and its event."""

    state: CompressionState | None
    event: FoldEvent


def fold_rounds(
    previous: CompressionState,
    *,
    rounds: Sequence[RoundMessages],
    role: str,
    style: FoldStyle,
    model: ChatModel,
    tokenizer: Tokenizer,
    budget: int,
    max_summary_tokens: int,
    live: LiveVariables | None,
) -> FoldResult:
    """Fold `rounds` and the previous summary into a new summary with one model call (plus one repair)."""
    first, last = rounds[0].index, rounds[-1].index
    tokens_before = sum(tokenizer.count_messages(r.messages) for r in rounds) + tokenizer.count(render_summary(previous, live=live))
    messages = fold_prompt(previous, rounds=rounds, role=role, style=style, tokenizer=tokenizer, budget=budget, max_summary_tokens=max_summary_tokens, live=live)
    purpose = f"compression_{role}"
    try:
        completion = model.complete(messages, purpose=purpose)
        try:
            fields = _read_summary(completion.text, tokenizer=tokenizer, max_summary_tokens=max_summary_tokens)
        except ReplyFormatError as problem:
            repair = [*messages, Message(role="assistant", content=completion.text), Message(role="user", content=repair_message(problem, SUMMARY_SCHEMA))]
            completion = model.complete(repair, purpose=purpose)
            # The repaired reply only has to be valid; a summary still too long is cut rather than lost.
            fields = _read_summary(completion.text, tokenizer=tokenizer, max_summary_tokens=None)
    except TaskWeaverError as exc:  # unreachable model, unusable reply: keep the rounds, retry later
        event = FoldEvent(role, first, last, tokens_before, tokens_before, ok=False, error=_one_line(exc))
        return FoldResult(state=None, event=event)
    summary = tokenizer.truncate_middle(fields["ConversationSummary"].strip(), max_summary_tokens)
    described = tuple(Variable(name=v["name"], type=v["type"], description=v.get("description", "")) for v in fields.get("Variables", ()))
    if live is not None:
        merged = merge_variables(described, live=live, previously_lost=previous.lost)
        variables, lost = merged.variables, merged.lost
    else:
        variables, lost = (), ()
    state = replace(previous, summary=summary, variables=variables, lost=lost, folded_through=last)
    event = FoldEvent(role, first, last, tokens_before, tokenizer.count(render_summary(state, live=live)), ok=True)
    return FoldResult(state=state.logged(event), event=event)


def fold_prompt(
    previous: CompressionState,
    *,
    rounds: Sequence[RoundMessages],
    role: str,
    style: FoldStyle,
    tokenizer: Tokenizer,
    budget: int,
    max_summary_tokens: int,
    live: LiveVariables | None,
) -> list[Message]:
    """The fold call's messages; round texts are cut (head and tail kept) so the call fits `budget`."""
    template = load_prompt(f"compression_{role}")
    system = template.render("system", style=style, max_summary_tokens=max_summary_tokens)
    values: dict[str, Any] = {
        "style": style,
        "previous_summary": previous.summary,
        "folded_through": previous.folded_through,
        "first_round": rounds[0].index,
        "last_round": rounds[-1].index,
    }
    if role == "code_generator":
        values["previous_variables"] = json.dumps([v.to_dict() for v in previous.variables], ensure_ascii=False)
        values["kernel_variables"] = json.dumps([v.to_dict() for v in (live.variables if live else ())], ensure_ascii=False)
        values["lost"] = list(dict.fromkeys((*previous.lost, *(live.lost if live else ()))))
    frame = template.render("user", rounds=[], **values)
    room = budget - tokenizer.count_messages([Message(role="system", content=system), Message(role="user", content=frame)]) - max_summary_tokens
    texts = fit_texts([r.summary_text for r in rounds], room=max(room, len(rounds) * 16), tokenizer=tokenizer)
    shown = [{"index": r.index, "text": text} for r, text in zip(rounds, texts)]
    return [Message(role="system", content=system), Message(role="user", content=template.render("user", rounds=shown, **values))]


def fit_texts(texts: Sequence[str], *, room: int, tokenizer: Tokenizer) -> list[str]:
    """Cut the longest texts first so that together they take at most about `room` tokens."""
    sizes = [tokenizer.count(t) for t in texts]
    if sum(sizes) <= room:
        return list(texts)
    # Water-filling: small texts stay whole, the big ones share what is left equally.
    cap, remaining, pending = 0, room, sorted(range(len(texts)), key=lambda i: sizes[i])
    for position, i in enumerate(pending):
        share = remaining // (len(pending) - position)
        if sizes[i] > share:
            cap = share
            break
        remaining -= sizes[i]
    return [tokenizer.truncate_middle(t, cap) if size > cap else t for t, size in zip(texts, sizes)]


def _read_summary(text: str, *, tokenizer: Tokenizer, max_summary_tokens: int | None) -> dict[str, Any]:
    fields = parse_reply(text, SUMMARY_SCHEMA)
    if not fields["ConversationSummary"].strip():
        raise ReplyFormatError("field 'ConversationSummary' is empty; write the summary there")
    if max_summary_tokens is not None:
        size = tokenizer.count(fields["ConversationSummary"])
        if size > max_summary_tokens:
            raise ReplyFormatError(f"'ConversationSummary' has {size:,} tokens; keep it under {max_summary_tokens:,} tokens")
    return fields


def _span(first: int, last: int) -> str:
    return f"round {first}" if first == last else f"rounds {first}-{last}"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
