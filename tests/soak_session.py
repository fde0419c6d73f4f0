"""A long scripted session at a small window: the soak that `test_soak.py` asserts on and the bench measures.

`run_soak` drives the real `Session` (real kernel, real openai client) against the scripted server
for many rounds. The scripted model is realistic and hostile on purpose:

- every user request carries a unique marker (REQ-0001, ...) in the middle of its text, where a
  fold that cuts a round head and tail loses it;
- the Planner delegates one step per request and answers once the CodeInterpreter has reported;
- the CodeGenerator writes real Python that leaves four variables per round in the kernel (an int,
  a list, a small DataFrame, a dict), every fifth round prints a few hundred lines, and every
  seventh round first fails loudly (about 4,000 characters of warnings on stderr, then an error
  raised from nested calls) and is fixed on the retry;
- the summary model names every REQ marker it saw and describes at most 20 variables.

The checks (`overflows`, `summary_gaps`, `unreachable_rounds`, `variables_problems`) return what
went wrong, each naming the request or round; the test asserts they are empty, the bench counts.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from helpers import make_project

from taskweaver_lite.config.file import load_config
from taskweaver_lite.errors import TaskWeaverError
from taskweaver_lite.llm.tokens import Tokenizer, get_tokenizer
from taskweaver_lite.memory.summary import VARIABLES_SHARE
from taskweaver_lite.records.events import Event, Listener, ModelCalled
from taskweaver_lite.records.model_calls import Message
from taskweaver_lite.session.assembly import open_session
from taskweaver_lite.session.session import Session
from taskweaver_lite.testing.scripted_server import ScriptedRequest, ScriptedServer, code_reply, planner_reply

SUMMARY_HEADING = "## Summary of earlier rounds"
VARIABLES_HEADING = "Variables in the kernel"
ROLES = ("planner", "code_generator")
FAIL_EVERY = 7
LONG_OUTPUT_EVERY = 5
MAX_DESCRIBED = 20
FOLD_WAIT_SECONDS = 60.0

_MARKER = re.compile(r"REQ-(\d{4})(?: to REQ-(\d{4}))?")
_OWN_NAME = re.compile(r"\br\d{4}_(?:count|items|frame|meta)\b")
_LISTED = re.compile(r"^- ([A-Za-z_]\w*) \(", re.MULTILINE)
_TYPES = {"count": "int", "items": "list", "frame": "pandas.DataFrame", "meta": "dict"}


def marker(n: int) -> str:
    """The unique marker of round `n`'s request."""
    return f"REQ-{n:04d}"


def markers_in(text: str) -> set[int]:
    """Round numbers named in `text`, single (REQ-0007) or as a range (REQ-0001 to REQ-0040)."""
    found: set[int] = set()
    for first, last in _MARKER.findall(text):
        found.update(range(int(first), int(last or first) + 1))
    return found


def user_request(n: int) -> str:
    """Round `n`'s request; the marker sits mid-text, so a fold that keeps only head and tail loses it."""
    return (
        "Continuing the same analysis with the conventions we agreed on earlier (small frames, short "
        f"printed reports, no plots), here is request {marker(n)}: build this round's numbers, keep them "
        "in the kernel for later requests, and tell me their totals."
    )


def planner_step(n: int) -> str:
    """The Planner's step for round `n`, naming the marker."""
    p = f"r{n:04d}"
    return (
        f"Using the kernel's earlier results where useful, for request {marker(n)} create {p}_count, "
        f"{p}_items, {p}_frame and {p}_meta, then print a short report of their totals."
    )


def planner_answer(n: int) -> str:
    """The Planner's answer to round `n` (the marker early, so a tail-only cut misses it)."""
    return f"Request {marker(n)} is done: its count, items, frame and meta are in the kernel, and the report above shows their totals."


def needed_name(n: int) -> str | None:
    """The earlier variable round `n`'s code reads (a count from a round well back), or None in the first rounds."""
    if n <= 3:
        return None
    back = 2 + (n * 7) % min(n - 2, 60)  # from 2 to 61 rounds back, spread over the session
    return f"r{n - back:04d}_count"


def cell_code(n: int, *, failing: bool = False) -> str:
    """Real Python for round `n`: four new variables (one from an earlier round's), sometimes a long printout; or a noisy failure."""
    if failing:
        return _noisy_failure(n)
    p = f"r{n:04d}"
    earlier = needed_name(n)
    lines = [
        "import pandas as pd",
        f"{p}_count = {n} * 3" + (f" + 0 * {earlier}" if earlier else ""),
        f"{p}_items = [i * {n} for i in range(12)]",
        f"{p}_frame = pd.DataFrame({{'a': range(4), 'b': [x * {n} / 2 for x in range(4)]}})",
        f"{p}_meta = {{'request': '{marker(n)}', 'rows': len({p}_frame), 'total': sum({p}_items)}}",
        f"print('report for {marker(n)}')",
        f"print('count', {p}_count, 'items total', sum({p}_items), 'frame total', float({p}_frame['b'].sum()))",
    ]
    if n % LONG_OUTPUT_EVERY == 0:
        lines.append(f"for i in range(300):\n    print(f'row {{i:3d}}: value {{i * {n}}} share {{i / 300:.3f}}')")
    return "\n".join(lines)


def _noisy_failure(n: int) -> str:
    """A grid search whose fits all fail: ~4,000 characters of warnings on stderr, then a nested raise."""
    return "\n".join(
        [
            "import sys",
            "for k in range(70):",
            "    print(f'_validation.py:378: FitFailedWarning: fit {k} of 70 failed', file=sys.stderr)",
            "def _check_alpha(params):",
            "    raise ValueError(f\"Invalid parameter 'alpha' for estimator Ridge: {params}\")",
            "def _fit_one(params):",
            "    return _check_alpha(params)",
            "def _grid_search(grid):",
            "    return [_fit_one(p) for p in grid]",
            f"_grid_search([{{'alpha': a, 'request': '{marker(n)}'}} for a in (0.1, 1.0, 10.0)])",
        ]
    )


def _all_text(messages: Sequence[dict[str, Any]]) -> str:
    return "\n".join(str(m.get("content") or "") for m in messages)


class SoakModel:
    """The scripted responders for the three roles; they read the prompt and remember per round what they did."""

    def __init__(self) -> None:
        self._planner_calls: Counter[int] = Counter()
        self._coder_calls: Counter[int] = Counter()

    def install(self, server: ScriptedServer) -> None:
        """Answer every role on `server` from this model."""
        server.set_default("planner", self.planner)
        server.set_default("code_generator", self.code_generator)
        server.set_default("compression", self.compression)

    def planner(self, messages: list[dict[str, Any]]) -> str:
        """Delegate the current request's step once; after the CodeInterpreter has reported, answer."""
        # The newest marker in the prompt is the current request's: summaries and history name older ones.
        n = max(markers_in(_all_text(messages)))
        self._planner_calls[n] += 1
        if self._planner_calls[n] == 1:
            return planner_reply(planner_step(n), plan="1. build the numbers\n2. report them")
        return planner_reply(planner_answer(n), send_to="User", plan="1. build the numbers\n2. report them", current_plan_step="2. report them")

    def code_generator(self, messages: list[dict[str, Any]]) -> str:
        """Code for the current step; every FAIL_EVERY-th request's first attempt fails loudly."""
        n = max(markers_in(_all_text(messages)))
        self._coder_calls[n] += 1
        failing = n % FAIL_EVERY == 0 and self._coder_calls[n] == 1
        return code_reply(f"# {marker(n)}\n" + cell_code(n, failing=failing))

    def compression(self, messages: list[dict[str, Any]]) -> str:
        """A short valid summary naming every REQ marker of its input, and up to MAX_DESCRIBED variables.

        Notes to append cover the rounds to fold, as asked: not the summary a fold that opens with its
        role's prompt shows above them (a fold of its own is sent no summary when it appends)."""
        appending = "appended" in str(messages[-1].get("content"))
        text = _all_text([m for m in messages if not (appending and SUMMARY_HEADING in str(m.get("content")))])
        seen = sorted(markers_in(text))
        newest = seen[-3:]
        lines = [f"Requests {_ranges(seen)}: each built its r<n>_count, _items, _frame and _meta and reported totals."] if seen else []
        lines += [f"{marker(n)}: done; every {FAIL_EVERY}th request's grid search failed once and was fixed." for n in newest]
        reply: dict[str, Any] = {"ConversationSummary": "\n".join(lines) or "Nothing of note yet."}
        # The message that asks for the summary: the system message, or the last one of a fold that opens with its role's prompt.
        asks = next((str(m.get("content")) for m in (messages[-1], messages[0]) if "ConversationSummary" in str(m.get("content"))), "")
        if "Variables" in asks:  # the CodeGenerator's fold asks for descriptions; the Planner's does not
            names = list(dict.fromkeys(_OWN_NAME.findall(text)))[-MAX_DESCRIBED:]
            reply["Variables"] = [{"name": v, "type": _TYPES[v.split("_", 1)[1]], "description": f"made for {marker(int(v[1:5]))}"} for v in names]
        return json.dumps(reply)


def _ranges(numbers: Sequence[int]) -> str:
    """REQ-0001 to REQ-0004, REQ-0007: consecutive numbers as ranges, so a summary stays short."""
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(marker(a) if a == b else f"{marker(a)} to {marker(b)}" for a, b in spans)


@dataclass(frozen=True)
class SoakRun:
    """What a soak session sent and left behind, for the checks."""

    window: int
    budget: int
    rounds: int
    requests: tuple[ScriptedRequest, ...]
    # role -> number of requests sent before the role's first successful fold; its later prompts must carry a summary
    folded_after: dict[str, int]
    fold_prompts: dict[str, tuple[str, ...]]  # role -> the text of each of its fold calls (from ModelCalled events)
    variables: int  # user variables in the kernel at the end
    failed_rounds: tuple[tuple[int, str], ...]
    seconds: float
    tokenizer: str = "o200k_base"

    def prompts(self, role: str) -> list[tuple[int, ScriptedRequest]]:
        """The role's requests with their position among all requests."""
        return [(i, r) for i, r in enumerate(self.requests) if r.role == role]


@dataclass
class FoldRecorder:
    """Keeps the prompt of every fold call, by role, from the session's ModelCalled events."""

    prompts: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def __call__(self, event: Event) -> None:
        if isinstance(event, ModelCalled) and event.purpose.startswith("compression") and event.prompt is not None:
            role = event.purpose.removeprefix("compression_")
            self.prompts[role].append(_all_text(event.prompt))


def open_soak_session(
    root: Path,
    server: ScriptedServer,
    *,
    window: int = 8000,
    compression: bool = True,
    listeners: Sequence[Listener] = (),
    settings: Mapping[str, Mapping[str, Any]] | None = None,
) -> Session:
    """A Session on a fresh project at `window` tokens, folding every round but the latest (1, 1), folds retried at once.

    `settings` adds to the config sections (the bench's strategies and schedules: planner.strategy...)."""
    sections: dict[str, dict[str, Any]] = {
        "llm": {"context_window": window, "reply_reserve": 4096, "margin": 256},
        "round_compressor": {"rounds_to_compress": 1, "rounds_to_retain": 1, "retry_backoff": 0},
        "store": {"record_prompts": True},  # fold prompts reach the listeners only when prompts are recorded
    }
    for name, values in (settings or {}).items():
        sections.setdefault(name, {}).update(values)
    overrides = [] if compression else ["planner.prompt_compression=false", "code_generator.prompt_compression=false"]
    return open_session(load_config(make_project(root, server.url, **sections), overrides), listeners=listeners)


def wait_for_folds(session: Session, *, after_round: int) -> None:
    """Let background folds finish before the next request, so which prompt follows which fold is fixed."""
    for context in session.contexts().values():
        if not context.wait_idle(timeout=FOLD_WAIT_SECONDS):
            raise AssertionError(f"the {context.role} fold after round {after_round} did not finish within {FOLD_WAIT_SECONDS:.0f} s")


def folded_through(session: Session) -> dict[str, int]:
    """Per role, the last round its summary covers (0: nothing folded yet)."""
    return {str(context.role): context.state.folded_through for context in session.contexts().values()}


def run_soak(
    root: Path,
    *,
    rounds: int,
    window: int = 8000,
    compression: bool = True,
    settings: Mapping[str, Mapping[str, Any]] | None = None,
    server_options: Mapping[str, Any] | None = None,
) -> SoakRun:
    """Drive `rounds` requests through a real Session at `window` tokens and return what was sent.

    `server_options`: how the scripted server plays its model (`ScriptedServer`'s keywords: how it counts tokens...)."""
    folds = FoldRecorder()
    failed: list[tuple[int, str]] = []
    folded_after: dict[str, int] = {}
    started = time.perf_counter()
    with ScriptedServer(**(server_options or {})) as server:
        SoakModel().install(server)
        with open_soak_session(root, server, window=window, compression=compression, listeners=[folds], settings=settings) as session:
            for n in range(1, rounds + 1):
                try:
                    rnd = session.ask(user_request(n))
                    if rnd.state != "finished":
                        failed.append((n, rnd.error or rnd.state))
                except TaskWeaverError as exc:  # an oversize prompt or a refused call: count it, go on
                    failed.append((n, f"{type(exc).__name__}: {exc}"))
                wait_for_folds(session, after_round=n)
                for role in (role for role, through in folded_through(session).items() if through > 0):
                    folded_after.setdefault(role, len(server.requests))
            variables = len(session.live_variables().variables)
            llm = session.config.llm
        requests = tuple(server.requests)
    return SoakRun(
        window=window,
        # The definition, computed here so the checks do not lean on the code under test.
        budget=llm.context_window - llm.reply_reserve - llm.margin,
        rounds=rounds,
        requests=requests,
        folded_after=folded_after,
        fold_prompts={role: tuple(texts) for role, texts in folds.prompts.items()},
        variables=variables,
        failed_rounds=tuple(failed),
        seconds=time.perf_counter() - started,
        tokenizer=llm.tokenizer,
    )


def overflows(requests: Sequence[ScriptedRequest], *, window: int, tokenizer: str = "o200k_base") -> list[str]:
    """Requests whose prompt plus max_tokens pass the window (or that leave max_tokens unset)."""
    counter = get_tokenizer(tokenizer)
    found = []
    for i, request in enumerate(requests):
        prompt = prompt_tokens(request, counter)
        reply = request.body.get("max_tokens")
        if reply is None:
            found.append(f"request {i} ({request.role}) sent no max_tokens")
        elif prompt + reply > window:
            found.append(f"request {i} ({request.role}): prompt {prompt:,} + max_tokens {reply:,} > window {window:,}")
    return found


def has_summary(request: ScriptedRequest) -> bool:
    """Whether the prompt carries the summary block, in the system message or a user message."""
    return any(SUMMARY_HEADING in str(m.get("content") or "") for m in request.messages if m.get("role") in ("system", "user"))


def summary_gaps(run: SoakRun) -> list[str]:
    """Role prompts sent after the role's first successful fold without the summary; a role that never folded."""
    gaps = []
    for role in ROLES:
        after = run.folded_after.get(role)
        if after is None:
            gaps.append(f"the {role} never folded a round in {run.rounds} rounds")
            continue
        gaps += [f"{role} request {i} (of {len(run.requests)}) has no summary" for i, r in run.prompts(role) if i >= after and not has_summary(r)]
    return gaps


def summary_fraction(run: SoakRun) -> float:
    """The share of role prompts after each role's first fold that carry the summary."""
    due = [r for role in ROLES for i, r in run.prompts(role) if i >= run.folded_after.get(role, len(run.requests))]
    return sum(has_summary(r) for r in due) / len(due) if due else 0.0


def unreachable_rounds(run: SoakRun) -> dict[str, list[int]]:
    """Per role, the rounds whose marker is in none of its fold inputs and not in its last prompt."""
    lost: dict[str, list[int]] = {}
    for role in ROLES:
        prompts = run.prompts(role)
        last = _all_text(prompts[-1][1].messages) if prompts else ""
        seen = set(markers_in(last))
        for text in run.fold_prompts.get(role, ()):
            seen |= markers_in(text)
        missing = [n for n in range(1, run.rounds + 1) if n not in seen]
        if missing:
            lost[role] = missing
    return lost


def variables_problems(requests: Sequence[ScriptedRequest], *, budget: int, tokenizer: str = "o200k_base") -> list[str]:
    """CodeGenerator prompts that list a variable twice, hold no list or several, or a list over its share."""
    counter = get_tokenizer(tokenizer)
    share = int(budget * VARIABLES_SHARE)
    problems = []
    for i, request in enumerate(requests):
        if request.role != "code_generator":
            continue
        twice = sorted(name for name, count in Counter(_LISTED.findall(_all_text(request.messages))).items() if count > 1)
        if twice:
            problems.append(f"code_generator request {i} lists {len(twice)} variables twice (e.g. {', '.join(twice[:3])})")
        blocks = [block for m in request.messages for block in variables_blocks(str(m.get("content") or ""))]
        if len(blocks) != 1:
            problems.append(f"code_generator request {i} has {len(blocks)} variables lists, not one")
        for block in blocks:
            size = counter.count(block)
            if size > share:
                problems.append(f"code_generator request {i}: the variables list takes {size:,} tokens, over its share {share:,}")
    return problems


def variables_blocks(content: str) -> list[str]:
    """Each variables list in one message: from its heading to the next heading or the message's end."""
    blocks: list[list[str]] = []
    inside = False
    for line in content.splitlines():
        if line.startswith("#"):
            inside = VARIABLES_HEADING in line
            if inside:
                blocks.append([])
        if inside:
            blocks[-1].append(line)
    return ["\n".join(block) for block in blocks]


def total_prompt_tokens(run: SoakRun) -> int:
    """Tokens of every prompt sent, role calls and folds together."""
    tokenizer = get_tokenizer(run.tokenizer)
    return sum(prompt_tokens(r, tokenizer) for r in run.requests)


def prompt_tokens(request: ScriptedRequest, tokenizer: Tokenizer) -> int:
    """Tokens of the prompt as sent, counted the way the package counts its own prompts."""
    # The recorded messages are the JSON the server received: role and content, the shape of Message.
    return tokenizer.count_messages(cast("list[Message]", request.messages))


def fold_calls(run: SoakRun) -> int:
    """How many fold calls the session made."""
    return sum(1 for r in run.requests if r.role == "compression")
