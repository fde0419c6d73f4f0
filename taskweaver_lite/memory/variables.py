"""The kernel's variables as a prompt shows them: one list, most relevant first, within a token cap.

The list is the kernel's truth (`LiveVariables`, from the executor's snapshot), never the model's
memory; a summary only adds its descriptions (`merge_variables`). A wide kernel (hundreds of
variables) must not crowd out the conversation, so `render_variables` shows as many lines as fit
its share of the prompt: variables named in the rounds on show first, then the most recently
created or changed, and the rest as counts by type with a note that code can list them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from taskweaver_lite.execution import Variable
from taskweaver_lite.llm.tokens import Tokenizer

HEADING = "## Variables in the kernel now"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class LiveVariables:
    """The kernel's truth: its variables now, most recently created or changed first, and names lost to restarts."""

    variables: tuple[Variable, ...] = ()
    lost: tuple[str, ...] = ()


@dataclass(frozen=True)
class MergedVariables:
    """A summary's described variables checked against the kernel."""

    variables: tuple[Variable, ...]
    added: tuple[str, ...]  # live in the kernel, not described by the model
    dropped: tuple[str, ...]  # described by the model, not in the kernel (invented, deleted or lost)
    lost: tuple[str, ...]  # gone in a kernel restart and not created again since


def merge_variables(described: Sequence[Variable], *, live: LiveVariables, previously_lost: Sequence[str] = ()) -> MergedVariables:
    """The kernel's variables, in the kernel's order and with its types, with the model's descriptions where it gave one."""
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


def mentioned_names(texts: Sequence[str]) -> set[str]:
    """Every identifier in `texts`: the candidates for 'named in the rounds on show'."""
    return {name for text in texts for name in _IDENTIFIER.findall(text)}


def render_variables(
    live: LiveVariables,
    *,
    described: Sequence[Variable] = (),
    mentioned: set[str] | frozenset[str] = frozenset(),
    max_tokens: int,
    tokenizer: Tokenizer,
) -> str:
    """The variables block within `max_tokens`: named ones first, then newest, the rest counted by type."""
    notes = {v.name: v.description.strip() for v in described if v.description.strip()}
    ordered = sorted(live.variables, key=lambda v: v.name not in mentioned)  # stable: recency order within each group
    lost = [name for name in live.lost if name not in {v.name for v in live.variables}]
    lost_line = f"Lost in a kernel restart (recompute before use): {', '.join(lost)}" if lost else ""
    heading = f"{HEADING} ({len(ordered)})" if ordered else HEADING
    if not ordered:
        return "\n".join(line for line in (heading, "(none yet)", lost_line) if line)
    fixed = tokenizer.count(heading) + tokenizer.count(lost_line) + 2
    lines: list[str] = []
    used = fixed + tokenizer.count(_rest_line(ordered)) + 1
    for variable in ordered:
        line = _line(variable, notes.get(variable.name, ""))
        cost = tokenizer.count(line) + 1
        if used + cost > max_tokens:
            break
        lines.append(line)
        used += cost
    rest = ordered[len(lines) :]
    text = "\n".join([heading, *lines, *([_rest_line(rest)] if rest else []), *([lost_line] if lost_line else [])])
    while lines and tokenizer.count(text) > max_tokens:  # joins can count a little differently from the sum
        lines.pop()
        rest = ordered[len(lines) :]
        text = "\n".join([heading, *lines, _rest_line(rest), *([lost_line] if lost_line else [])])
    return text


def _line(variable: Variable, note: str) -> str:
    line = f"- {variable.name} ({variable.type}): {variable.description}"
    return f"{line} [{note}]" if note and note != variable.description else line


def _rest_line(rest: Sequence[Variable]) -> str:
    counts = Counter(v.type for v in rest)
    by_type = ", ".join(f"{count} {kind}" for kind, count in counts.most_common())
    return (
        f"... and {len(rest)} more not listed here ({by_type}). They exist in the kernel: list them with code "
        "when a step needs them (for example `[n for n in dir() if not n.startswith('_')]`)."
    )
