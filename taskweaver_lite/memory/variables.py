"""The kernel's variables as a prompt shows them: every name, in tiers of detail, within a token cap.

The list is the kernel's truth (`LiveVariables`, from the executor's snapshot), never the model's
memory; a summary only adds its descriptions (`render_variables`' `described`). A wide kernel (hundreds of
variables) must not crowd out the conversation, yet a model cannot use a DataFrame it does not
know exists. So `render_variables` ranks the variables (names in the current request and
instruction first, then names in the retained rounds, then the most recently created or changed)
and shows them in tiers: full detail (type, shape, columns) for the first few, one line
(`name: type shape`) for the next, the names alone for the rest, and counts by type only for
what still does not fit (past a few hundred names at the usual shares).

The list is a snapshot (`VariablesList`): the role's context keeps it byte for byte until the
summary is merged or the list would mislead, so it does not move the prompt's prefix at each fold.
Variables created since are named by the retained rounds themselves ("Variables created: ...") and,
once folded, by the summary's notes.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from taskweaver_lite.llm.tokens import Tokenizer
from taskweaver_lite.records.execution import ExecutionResult, Variable

HEADING = "## Variables in the kernel"
# A snapshot is kept until the summary is merged: the notes and steps since name what they made or changed.
SNAPSHOT_NOTE = "(listed earlier; the summary's notes and the results of later steps name the variables made or changed since)"
DETAIL_LINES = 5  # the most relevant variables, with type, shape and columns
BRIEF_LINES = 12  # the next, one line each: `name: type shape`
DETAIL_CHARS = 240  # a detailed line's description at most (a wide frame's columns are cut, not the other names)
BRIEF_FACT_CHARS = 16  # a one-line entry keeps a value no longer than this (a number, a short string)
NAMED_AT_MOST = 300  # names alone for up to this many more; past them, counts by type
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class LiveVariables:
    """The kernel's truth: its variables now, most recently created or changed first, and names lost to restarts."""

    variables: tuple[Variable, ...] = ()
    lost: tuple[str, ...] = ()


class VariableHistory:
    """What a listing of the kernel does not say: which cell last made or changed each variable, and names lost to restarts."""

    def __init__(self) -> None:
        self._recency: dict[str, int] = {}  # variable name -> the last cell that created or changed it
        self._cells = 0
        self.lost: list[str] = []

    def saw(self, execution: ExecutionResult) -> None:
        """Note a cell that ran: what it made or changed, and what a kernel death took with it."""
        self._cells += 1
        for name in (*execution.changes.created, *execution.changes.changed):
            self._recency[name] = self._cells
        if execution.kernel_died:
            self.lost.extend(execution.lost_variables)

    def clear(self) -> None:
        """Forget everything: the kernel starts afresh (and is rebuilt by replay, which runs no cell through `saw`)."""
        self._recency.clear()
        self._cells, self.lost = 0, []

    def live(self, variables: Sequence[Variable]) -> LiveVariables:
        """The kernel's `variables` most recently made or changed first (its own order among equals), and the lost names not made again."""
        alive = {v.name for v in variables}
        lost = tuple(dict.fromkeys(n for n in self.lost if n not in alive))
        return LiveVariables(variables=tuple(sorted(variables, key=lambda v: -self._recency.get(v.name, 0))), lost=lost)


def mentioned_names(texts: Sequence[str]) -> list[str]:
    """Every identifier in `texts`, in order of first mention: the candidates for 'relevant'."""
    return list(dict.fromkeys(name for text in texts for name in _IDENTIFIER.findall(text)))


@dataclass(frozen=True)
class VariablesList:
    """A rendered variables list and the names it names (in any tier)."""

    text: str
    named: frozenset[str] = field(default_factory=frozenset)  # named in a line of any tier
    covered: frozenset[str] = field(default_factory=frozenset)  # every live name when rendered (named or counted)


def ranked(variables: Sequence[Variable], relevant: Sequence[str]) -> list[Variable]:
    """`variables` most relevant first: in the order of `relevant`, then the rest in their own (recency) order."""
    rank = {name: position for position, name in enumerate(dict.fromkeys(relevant))}
    return sorted(variables, key=lambda v: rank.get(v.name, len(rank)))  # stable: recency within the rest


def render_variables(
    live: LiveVariables,
    *,
    described: Sequence[Variable] = (),
    relevant: Sequence[str] = (),
    max_tokens: int,
    tokenizer: Tokenizer,
) -> VariablesList:
    """The variables list within `max_tokens`: detail, one line, names alone, then counts by type; most relevant first."""
    notes = {v.name: v.description.strip() for v in described if v.description.strip()}
    ordered = ranked(live.variables, relevant)
    alive = {v.name for v in live.variables}
    lost = [name for name in live.lost if name not in alive]
    lost_line = f"Lost in a kernel restart (recompute before use): {', '.join(lost)}" if lost else ""
    heading = f"{HEADING} ({len(ordered)})\n{SNAPSHOT_NOTE}" if ordered else HEADING
    if not ordered:
        return VariablesList("\n".join(line for line in (heading, "(none yet)", lost_line) if line))
    room = max_tokens - tokenizer.count(heading) - tokenizer.count(lost_line) - 2
    lines, shown = _lines(ordered, notes, room=room, tokenizer=tokenizer)
    if shown < len(ordered):  # some are only counted: make room for the line that counts them
        lines, shown = _lines(ordered, notes, room=room - tokenizer.count(_rest_line(ordered)) - 1, tokenizer=tokenizer)
    text = _join(heading, lines, ordered[shown:], lost_line)
    while lines and tokenizer.count(text) > max_tokens:  # joins can count a little differently from the sum
        lines.pop()
        shown = min(shown, len(lines))
        text = _join(heading, lines, ordered[shown:], lost_line)
    return VariablesList(text, frozenset(v.name for v in ordered[:shown]), frozenset(alive))


def _lines(ordered: Sequence[Variable], notes: dict[str, str], *, room: int, tokenizer: Tokenizer) -> tuple[list[str], int]:
    """The tiers' lines within `room` tokens, and how many variables they name (a prefix of `ordered`).

    Names come first: as many as fit are named (numbered runs share an entry). Then, most relevant
    first, a variable moves up to a line of its own (full detail for the first few, `name: type
    shape` for the next) while the whole still fits, so no wide DataFrame takes the others' room.
    """
    candidates = [v.name for v in ordered[:NAMED_AT_MOST]]
    low, high = 0, len(candidates)
    while low < high:  # the most names whose line fits: a binary search, the line is counted whole
        middle = (low + high + 1) // 2
        if tokenizer.count(names_line(candidates[:middle])) + 1 <= room:
            low = middle
        else:
            high = middle - 1
    lines: list[str] = []
    used = 0
    for variable in ordered[: min(low, DETAIL_LINES + BRIEF_LINES)]:
        line = _line(variable, notes.get(variable.name, "")) if len(lines) < DETAIL_LINES else _brief(variable)
        rest = candidates[len(lines) + 1 : low]
        cost = tokenizer.count(line) + 1
        if used + cost + (tokenizer.count(names_line(rest)) + 1 if rest else 0) > room:
            break
        lines.append(line)
        used += cost
    rest = candidates[len(lines) : low]
    return [*lines, *([names_line(rest)] if rest else [])], low


_NUMBERED = re.compile(r"^(.*?)(\d+)(\D*)$")
_RUN = 3  # numbered names from this many in a row on share one entry


def names_line(names: Sequence[str]) -> str:
    """'Also: a, b, df{1-4}, r{0001-0003}_meta': names in name order, runs of numbered names (same width) as one entry."""
    groups: dict[tuple[str, int, str], list[int]] = {}
    entries: list[str] = []
    for name in names:
        match = _NUMBERED.match(name)
        if match:
            groups.setdefault((match[1], len(match[2]), match[3]), []).append(int(match[2]))
        else:
            entries.append(name)
    for (prefix, width, suffix), numbers in groups.items():
        for first, last in _runs(sorted(numbers)):
            if last - first + 1 >= _RUN:
                entries.append(f"{prefix}{{{first:0{width}d}-{last:0{width}d}}}{suffix}")
            else:
                entries += [f"{prefix}{n:0{width}d}{suffix}" for n in range(first, last + 1) if f"{prefix}{n:0{width}d}{suffix}" in names]
    legend = " (x{1-3} stands for x1, x2, x3)" if any("{" in entry for entry in entries) else ""
    return f"Also{legend}: " + ", ".join(sorted(entries))


def expand_names(line: str) -> list[str]:
    """The names a `names_line` names (its runs spelled out): for checks that every name is there."""
    body = line.partition(": ")[2]
    found: list[str] = []
    for entry in body.split(", "):
        run = re.fullmatch(r"(.*?)\{(\d+)-(\d+)\}(.*)", entry)
        if run is None:
            found.append(entry)
            continue
        width = len(run[2])
        found += [f"{run[1]}{n:0{width}d}{run[4]}" for n in range(int(run[2]), int(run[3]) + 1)]
    return found


def _runs(numbers: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive numbers as (first, last) pairs."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        elif not runs or n != runs[-1][1]:
            runs.append([n, n])
    return [(a, b) for a, b in runs]


def _join(heading: str, lines: Sequence[str], rest: Sequence[Variable], lost_line: str) -> str:
    return "\n".join([heading, *lines, *([_rest_line(rest)] if rest else []), *([lost_line] if lost_line else [])])


def _line(variable: Variable, note: str) -> str:
    described = variable.description if len(variable.description) <= DETAIL_CHARS else variable.description[: DETAIL_CHARS - 3] + "..."
    line = f"- {variable.name} ({variable.type}): {described}"
    return f"{line} [{note}]" if note and note != variable.description else line


def _brief(variable: Variable) -> str:
    """`name: type shape`: a frame's or array's shape, a collection's length, a short value; nothing longer."""
    fact = variable.description.partition(";")[0].partition(", dtype")[0].partition(": ")[0].strip()
    if not fact.startswith(("shape", "length")) and len(fact) > BRIEF_FACT_CHARS:
        fact = ""
    return f"- {variable.name}: {variable.type} {fact}".rstrip()


def _rest_line(rest: Sequence[Variable]) -> str:
    counts = Counter(v.type for v in rest)
    by_type = ", ".join(f"{count} {kind}" for kind, count in counts.most_common())
    return (
        f"... and {len(rest)} more not named here ({by_type}). They exist in the kernel: list them with code "
        "when a step needs them (for example `[n for n in dir() if not n.startswith('_')]`)."
    )
