"""Round compression: when rounds fold, what the summary holds, and that no prompt ever overflows.

Folds go through the real openai client over HTTP to the scripted server (`SummaryModel`); what a
test checks about a fold call (its messages, its `max_tokens`, its purpose) is read from the requests
the server received. One in-process stand-in stays, `BrokenOnce`, where the case cannot cross the wire.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from taskweaver_lite.config.settings import Config
from taskweaver_lite.errors import ContextOverflowError
from taskweaver_lite.llm.client import DeltaSink, ModelDefaults, OpenAIChatModel
from taskweaver_lite.llm.replies import ReplySchema
from taskweaver_lite.llm.tokens import get_tokenizer
from taskweaver_lite.memory.compression import ContextSettings, RoleContext
from taskweaver_lite.memory.summary import CompressionState
from taskweaver_lite.memory.variables import LiveVariables, expand_names
from taskweaver_lite.records.conversation import RoundMessages
from taskweaver_lite.records.execution import FoldPiece, Variable
from taskweaver_lite.records.model_calls import Completion, Message
from taskweaver_lite.testing.scripted_server import Reply, ScriptedServer, detect_role

pytestmark = pytest.mark.unit

TOKENIZER = get_tokenizer()
SYSTEM = "You are the role under test."
EXAMPLES = (Message(role="user", content="EXAMPLE question"), Message(role="assistant", content="EXAMPLE answer"))
BIG_WORD = "sales "  # one o200k token per repetition


def marks(text: str) -> list[int]:
    """The round numbers whose ROUND-n marker appears in `text`, sorted and unique."""
    return sorted({int(n) for n in re.findall(r"ROUND-(\d+)\b", text)})


def covering_summary(messages: Sequence[Message]) -> str:
    """A valid summary naming every round marker in the fold prompt (previous summary included)."""
    fold_request = next(m["content"] for m in messages if m["role"] == "user")  # not a repair turn
    covered = " ".join(f"ROUND-{n}" for n in marks(fold_request))
    return json.dumps({"ConversationSummary": f"Covers {covered}.", "Variables": []})


class SummaryModel:
    """A fold model over the wire: the real openai client (`client`) talking HTTP to a scripted server
    whose compression replies come from a function of the prompt.

    What a test checks about the calls it reads from the wire: the requests the server received
    since this model was made (their messages, `max_tokens`, and the purpose in the
    `prompt_cache_key`). `gate` holds each answer until set (a slow summariser); `entered` is set once
    a call has arrived. Servers and clients are reused across tests (a client costs ~50 ms of CPU to
    make, its TLS set-up); each model gets a pair no other model of its test uses.
    """

    def __init__(self, answer: Callable[[Sequence[Message]], str] = covering_summary, *, gate: threading.Event | None = None) -> None:
        self.entered = threading.Event()
        self.server, self.client = _WIRES.pop() if _WIRES else _wire()
        _IN_USE.append((self.server, self.client))
        self._first = len(self.server.requests)

        def respond(messages: list[dict[str, Any]]) -> str:
            self.entered.set()
            if gate is not None:
                gate.wait(10)
            return answer(messages)  # type: ignore[arg-type]

        self.server.set_default("compression", respond)

    def complete(
        self, messages: Sequence[Message], *, purpose: str, max_tokens: int | None = None, on_delta: DeltaSink | None = None, schema: ReplySchema | None = None
    ) -> Completion:
        """The real client's call (for code that takes the model itself; `context` hands the client to RoleContext)."""
        return self.client.complete(messages, purpose=purpose, max_tokens=max_tokens, on_delta=on_delta, schema=schema)

    @property
    def calls(self) -> list[tuple[str, list[Message]]]:
        """Each request that reached the server from this model: its purpose (from the cache key) and its messages."""
        return [(purpose_sent(r.body), r.messages) for r in self.server.requests[self._first :]]  # type: ignore[misc]

    @property
    def max_tokens(self) -> list[int | None]:
        """The `max_tokens` each request carried on the wire."""
        return [r.body.get("max_tokens") for r in self.server.requests[self._first :]]


def _wire() -> tuple[ScriptedServer, OpenAIChatModel]:
    server = ScriptedServer().start()
    return server, OpenAIChatModel(Config.model_validate({"llm": {"api_base": server.url, "api_key": "test"}}).llm)


_WIRES: list[tuple[ScriptedServer, OpenAIChatModel]] = []  # idle, for the next tests
_IN_USE: list[tuple[ScriptedServer, OpenAIChatModel]] = []


@pytest.fixture(autouse=True)
def return_wires() -> Iterator[None]:
    """Give the test's wires back once it ends, and stop them all after the module's last test (importers import this too)."""
    yield
    _WIRES.extend(_IN_USE)
    _IN_USE.clear()


@pytest.fixture(autouse=True, scope="module")
def close_wires() -> Iterator[None]:
    """Close every client and stop every server the module's tests used."""
    yield
    while _WIRES:
        server, client = _WIRES.pop()
        client.close()
        server.stop()


def purpose_sent(body: dict[str, Any]) -> str:
    """The purpose a request was sent for: its `prompt_cache_key` (taskweaver-lite/<session>/<purpose>), and for a
    fold sent under its role's own key (as folds are when they may open with the role's prompt), `compression_<role>`,
    told by its first or last message asking for the summary, which no role's own call does."""
    purpose = str(body.get("prompt_cache_key", "")).rpartition("/")[2]
    ends = str(body["messages"][0].get("content") or "") + str(body["messages"][-1].get("content") or "")
    if not purpose.startswith("compression_") and "ConversationSummary" in ends:
        return f"compression_{purpose}"
    return purpose


def make_round(index: int, *, output_tokens: int = 0) -> RoundMessages:
    output = f"Result of ROUND-{index}: " + BIG_WORD * output_tokens
    messages = (
        Message(role="user", content=f"Please do step ROUND-{index}."),
        Message(role="assistant", content=f'{{"code": "print({index})"}}'),
        Message(role="user", content=output),
    )
    pieces = (FoldPiece(f"Asked ROUND-{index}", essential=True), FoldPiece(output))
    return RoundMessages(index=index, messages=messages, fold_pieces=pieces, requests=(0,))


def config(**sections: dict[str, Any]) -> Config:
    # Examples in every prompt, so the guard's handling of them shows; `until_history` has its own test.
    data: dict[str, Any] = {"round_compressor": {"retry_backoff": 0.0}, "planner": {"examples": "always"}, "code_generator": {"examples": "always"}}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return Config.model_validate(data)


LABELS = {"planner": "Planner", "code_generator": "CodeGenerator"}


def context(cfg: Config, model: SummaryModel, role: str = "planner", **kwargs: Any) -> RoleContext:
    """The role's context as a session makes it, its folds going through the real client to `model`'s server."""
    return RoleContext(ContextSettings.of(cfg, role, label=LABELS[role]), model=model.client, tokenizer=TOKENIZER, **kwargs)


def play(ctx: RoleContext, rounds: int, *, sizes: dict[int, int] | None = None) -> list[RoundMessages]:
    """Finish `rounds` rounds one by one, letting each fold complete, like a session would."""
    history: list[RoundMessages] = []
    for index in range(1, rounds + 1):
        history.append(make_round(index, output_tokens=(sizes or {}).get(index, 0)))
        ctx.round_finished(history)
        assert ctx.wait_idle(10)
    return history


def build(ctx: RoleContext, history: Sequence[RoundMessages], current_index: int | None = None, **kwargs: Any) -> Any:
    current = make_round(current_index or len(history) + 1, **kwargs)
    return ctx.build(system=SYSTEM, examples=EXAMPLES, history=history, current=current)


def text_of(messages: Sequence[Message]) -> str:
    return "\n".join(m["content"] for m in messages)


def is_memory(message: Message) -> bool:
    """The user message that carries the summary and the variables list, after the examples."""
    return message["role"] == "user" and message["content"].startswith(("## Summary of earlier rounds", "## Variables in the kernel"))


def memory(messages: Sequence[Message]) -> str:
    """The memory message's text ('' when the prompt has none)."""
    return next((m["content"] for m in messages if is_memory(m)), "")


def verbatim(messages: Sequence[Message]) -> str:
    """Everything after the system message but the memory: examples, retained rounds, the current round."""
    return text_of([m for m in messages[1:] if not is_memory(m)])


# --- when rounds fold -------------------------------------------------------------------------


@pytest.mark.parametrize("compress, retain", [(1, 1), (2, 3), (5, 10)])
def test_rounds_fold_once_compress_plus_retain_are_unfolded_keeping_the_latest_retained(compress: int, retain: int) -> None:
    model = SummaryModel()
    ctx = context(config(round_compressor={"rounds_to_compress": compress, "rounds_to_retain": retain}), model)
    history: list[RoundMessages] = []
    folded_after: list[int] = []
    for index in range(1, 3 * compress + retain + 1):
        history.append(make_round(index))
        ctx.round_finished(history)
        assert ctx.wait_idle(10)
        folded_after.append(ctx.state.folded_through)
    # Nothing folds before compress + retain rounds; then each fold takes `compress` rounds.
    expected = [max(0, (n - retain) // compress * compress) if n >= compress + retain else 0 for n in range(1, len(folded_after) + 1)]
    assert folded_after == expected
    assert len(model.calls) == 3
    prompt = build(ctx, history).messages
    assert marks(memory(prompt)) == list(range(1, 3 * compress + 1))  # the summary, after the examples
    assert marks(verbatim(prompt)) == list(range(3 * compress + 1, len(history) + 2))  # verbatim, plus current


def test_folds_append_notes_while_the_summary_has_room_then_merge_it_with_the_new_rounds() -> None:
    model = SummaryModel()
    ctx = context(config(round_compressor={"rounds_to_compress": 2, "rounds_to_retain": 1}), model)
    play(ctx, 5)
    first_summary = json.loads(covering_summary(model.calls[0][1]))["ConversationSummary"]
    second_prompt = model.calls[1][1][-1]["content"]
    assert first_summary not in second_prompt and "Rounds 1-2 are summarised already" in second_prompt
    assert ctx.state.summary == "Covers ROUND-1 ROUND-2.\nCovers ROUND-3 ROUND-4."
    # With a summary cap too small for more notes, the next fold merges: previous summary + new rounds.
    small_model = SummaryModel()
    small = context(config(round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1, "max_summary_tokens": 64}), small_model)
    play(small, 6)
    merges = [messages for _, messages in small_model.calls if "Previous summary" in messages[-1]["content"]]
    assert merges, "no fold ever merged the summary"
    assert "Write one summary that merges" in merges[0][-1]["content"]
    assert marks(small.state.summary) == [1, 2, 3, 4, 5], "a merge lost a round"


def test_a_separate_fold_prompt_speaks_the_summary_schema_and_nothing_else() -> None:
    # fold_prompt: separate (a fold opening with its role's prompt is tests/test_fold_prefix.py's).
    model = SummaryModel()
    for role in ("planner", "code_generator"):
        cfg = config(round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1}, **{role: {"fold_prompt": "separate"}})
        ctx = context(cfg, model, role, live_variables=LiveVariables)
        play(ctx, 2)
    for (purpose, messages), role in zip(model.calls, ("planner", "code_generator"), strict=True):
        assert purpose == f"compression_{role}"
        assert "ConversationSummary" in messages[0]["content"]
        assert "init_plan" not in messages[0]["content"] and "reply_content" not in messages[0]["content"]
    assert "Variables" in model.calls[1][1][0]["content"]


def test_large_rounds_fold_early_on_the_token_trigger() -> None:
    model = SummaryModel()
    cfg = config(round_compressor={"rounds_to_compress": 5, "rounds_to_retain": 3, "fold_token_trigger": 3_000})
    ctx = context(cfg, model)
    play(ctx, 3, sizes={1: 2_000, 2: 2_000})
    # Far from 5 + 3 rounds, but after round 2 the 4,000 unfolded tokens pass the trigger: round 1
    # folds, the newest stays verbatim; rounds 2-3 are then under the trigger and wait.
    assert ctx.state.folded_through == 1
    assert len(model.calls) == 1


def test_a_fold_never_blocks_building_the_next_prompt() -> None:
    gate = threading.Event()
    model = SummaryModel(gate=gate)
    ctx = context(config(round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1}), model)
    history = [make_round(1), make_round(2)]
    ctx.round_finished(history)  # returns while the model call hangs on the gate
    built = build(ctx, history)
    assert built.report.fold_running
    assert marks(text_of(built.messages)) == [1, 2, 3]  # not folded yet: everything verbatim
    gate.set()
    assert ctx.wait_idle(10)
    assert marks(memory(build(ctx, history).messages)) == [], "a fold that finished mid-round shows from the next round on"
    assert marks(memory(build(ctx, [*history, make_round(3)]).messages)) == [1]


def test_a_fold_finishing_in_the_middle_of_a_build_never_corrupts_the_prompt() -> None:
    gate = threading.Event()
    model = SummaryModel(gate=gate)
    cfg = config(round_compressor={"rounds_to_compress": 2, "rounds_to_retain": 1})
    holder: dict[str, RoleContext] = {}
    armed = threading.Event()

    def live_then_fold() -> LiveVariables:
        # Called inside build(): let the fold finish right now, before build() goes on.
        if not armed.is_set():
            return LiveVariables()
        armed.clear()
        assert model.entered.wait(10)
        gate.set()
        assert holder["ctx"].wait_idle(10)
        assert holder["ctx"].state.folded_through == 2
        return LiveVariables()

    ctx = holder["ctx"] = context(cfg, model, "code_generator", live_variables=live_then_fold)
    history = [make_round(1), make_round(2), make_round(3)]
    ctx.round_finished(history)
    armed.set()
    during = build(ctx, history)
    after = build(ctx, [*history, make_round(4)], 5)
    # Each round appears exactly once: in the summary or verbatim, never both and never neither.
    for prompt, summarised, shown in ((during, [], (1, 2, 3, 4)), (after, [1, 2], (1, 2, 3, 4, 5))):
        assert marks(memory(prompt.messages)) == summarised
        rest = verbatim(prompt.messages)
        assert marks(rest) == [n for n in shown if n not in summarised]
        assert all(rest.count(f"Please do step ROUND-{n}.") == 1 for n in marks(rest))
    assert during.report.folded_through == 0 and after.report.folded_through == 2


def test_rounds_finished_while_a_fold_reports_are_folded_when_it_ends() -> None:
    reporting, release = threading.Event(), threading.Event()

    def slow_report(event: Any) -> None:
        # Like a session writing the fold to its store: round 3 finishes meanwhile.
        reporting.set()
        assert release.wait(10)

    model = SummaryModel()
    ctx = context(config(round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1}), model, on_fold=slow_report)
    history = [make_round(1), make_round(2)]
    ctx.round_finished(history)
    assert reporting.wait(10)
    history.append(make_round(3))
    ctx.round_finished(history)  # the fold of round 1 is still running: it has to pick round 2 up
    release.set()
    assert ctx.wait_idle(10)
    assert ctx.state.folded_through == 2
    # The second fold appends notes on round 2 alone: the summary had room for them.
    assert [marks(messages[-1]["content"]) for _, messages in model.calls] == [[1], [2]]


def test_empty_rounds_never_trigger_a_fold_and_are_covered_by_the_next_one() -> None:
    model = SummaryModel()
    ctx = context(config(round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1}), model, "code_generator", live_variables=LiveVariables)
    empty = {1, 3, 4, 6, 7}  # chat-only rounds: the CodeGenerator took no part
    history: list[RoundMessages] = []
    for index in range(1, 8):
        history.append(RoundMessages(index, ()) if index in empty else make_round(index))
        ctx.round_finished(history)
        assert ctx.wait_idle(10)
    # Only rounds 2 and 5 have messages: one fold, of round 2, once round 5 made it due.
    assert len(model.calls) == 1
    assert marks(model.calls[0][1][-1]["content"]) == [2]
    assert ctx.state.folded_through == 2
    prompt = build(ctx, history).messages
    assert marks(memory(prompt)) == [2]
    assert marks(verbatim(prompt)) == [5, 8]  # round 5 verbatim, then the current round


# --- valid or nothing ---------------------------------------------------------------------------


def test_an_invalid_summary_gets_one_repair_then_falls_back_and_is_not_retried_on_the_next_prompt() -> None:
    model = SummaryModel(lambda messages: "I summarised it for you: the user asked things.")
    cfg = config(round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1, "retry_backoff": 3600})
    events: list[Any] = []
    ctx = context(cfg, model, on_fold=events.append)
    history = play(ctx, 2)
    assert len(model.calls) == 2  # the reply and one repair turn
    assert "could not be used" in model.calls[1][1][-1]["content"]
    assert ctx.state.folded_through == 0 and ctx.state.summary == ""
    assert [e.ok for e in events] == [False] and "verbatim" in events[0].describe()
    # The rounds stay verbatim, and neither prompts nor the next rounds retry inside the backoff.
    prompt = build(ctx, history)
    assert marks(text_of(prompt.messages)) == [1, 2, 3]
    history.append(make_round(3))
    ctx.round_finished(history)
    assert ctx.wait_idle(10)
    assert len(model.calls) == 2


def test_a_failed_fold_is_retried_after_the_backoff_and_then_succeeds() -> None:
    replies = iter(["not json", "still not json"])
    model = SummaryModel(lambda messages: next(replies, None) or covering_summary(messages))
    ctx = context(config(round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1, "retry_backoff": 0.0}), model)
    play(ctx, 3)
    assert ctx.state.folded_through == 2
    assert [e.ok for e in ctx.state.log] == [False, True]


class BrokenOnce(ModelDefaults):
    """A model that raises a plain bug once, then answers through `inner`.

    An in-process stand-in on purpose: the behaviour under test is an exception that is not an
    `LLMError` (a bug in our code on the call path); over HTTP the client would turn any server
    failure into an `LLMError` and retry it, so the wire cannot produce this case.
    """

    def __init__(self, inner: SummaryModel) -> None:
        self.inner = inner
        self.raised = False

    def complete(
        self, messages: Sequence[Message], *, purpose: str, max_tokens: int | None = None, on_delta: DeltaSink | None = None, schema: ReplySchema | None = None
    ) -> Completion:
        if not self.raised:
            self.raised = True
            raise RuntimeError("summariser bug\nsecond line")
        return self.inner.complete(messages, purpose=purpose, max_tokens=max_tokens, on_delta=on_delta, schema=schema)


def test_an_unexpected_error_in_a_fold_is_a_failed_fold_not_a_thread_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    uncaught: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", uncaught.append)
    model = SummaryModel()
    events: list[Any] = []
    cfg = config(round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1})
    ctx = RoleContext(ContextSettings.of(cfg, "planner", label="Planner"), model=BrokenOnce(model), tokenizer=TOKENIZER, on_fold=events.append)
    play(ctx, 3)
    assert uncaught == []
    assert [e.ok for e in events] == [False, True]
    assert events[0].error == "RuntimeError: summariser bug second line"
    assert "could not fold round 1 (RuntimeError: summariser bug second line)" in events[0].describe()
    # Not retried in a loop: the next round's fold (after the backoff) is the only other call.
    assert len(model.calls) == 1
    assert ctx.state.folded_through == 2 and [e.ok for e in ctx.state.log] == [False, True]


def test_a_repaired_summary_is_used() -> None:
    replies = iter(['```json\n{"Summary": "wrong key"}\n```'])
    model = SummaryModel(lambda messages: next(replies, None) or covering_summary(messages))
    ctx = context(config(round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1}), model)
    play(ctx, 2)
    assert len(model.calls) == 2
    assert ctx.state.summary == "Covers ROUND-1."


def test_a_summary_over_the_size_limit_is_sent_back_to_be_shortened() -> None:
    long_summary = json.dumps({"ConversationSummary": "detail " * 500})
    replies = iter([long_summary])
    model = SummaryModel(lambda messages: next(replies, None) or covering_summary(messages))
    ctx = context(config(round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1, "max_summary_tokens": 200}), model)
    play(ctx, 2)
    # A first (merging) fold may write 60% of the cap, leaving room for appended notes.
    assert "keep it under 120 tokens" in model.calls[1][1][-1]["content"]
    assert ctx.state.summary == "Covers ROUND-1."


# --- Variables are the kernel's truth -------------------------------------------------------------

DF = Variable("df", "pandas.DataFrame", "DataFrame 100 rows x 3 columns (region, month, sales)")
TOTAL = Variable("total", "float", "1234.5")
MODEL = Variable("model", "sklearn.linear_model.LinearRegression", "fitted")


def test_the_code_generator_summary_carries_the_merged_variables_and_the_lost_state() -> None:
    answer = json.dumps(
        {
            "ConversationSummary": "Loaded the sales data; the kernel restarted.",
            "Variables": [
                {"name": "df", "type": "list", "description": "monthly sales by region"},
                {"name": "imaginary", "type": "int", "description": "never existed"},
                {"name": "model", "type": "LinearRegression", "description": "fit on df"},
            ],
        }
    )
    live = LiveVariables((DF, TOTAL), lost=("model",))
    cfg = config(round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1})
    ctx = context(cfg, SummaryModel(lambda m: answer), "code_generator", live_variables=lambda: live)
    history = play(ctx, 2)
    assert ctx.state.variables == (Variable("df", "pandas.DataFrame", "monthly sales by region"),)
    assert ctx.state.lost == ("model",)
    system = memory(build(ctx, history).messages)
    assert "- df (pandas.DataFrame): DataFrame 100 rows x 3 columns (region, month, sales) [monthly sales by region]" in system
    assert "- total (float): 1234.5" in system
    assert "imaginary" not in system
    assert system.count("Lost in a kernel restart (recompute before use): model") == 1


# --- the budget guard ------------------------------------------------------------------------------


def small_window(strategy: str = "round_compression", window: int = 4_000, **compressor: Any) -> Config:
    return config(
        llm={"context_window": window, "reply_reserve": 500, "margin": 0},
        planner={"strategy": strategy},
        round_compressor={"fold_token_trigger": 0, **compressor},
    )


def test_a_giant_output_in_a_retained_round_is_cut_head_and_tail_and_the_prompt_fits() -> None:
    ctx = context(small_window(), SummaryModel())
    history = [make_round(1), make_round(2, output_tokens=20_000), make_round(3)]
    built = build(ctx, history)
    assert built.report.cost.total <= 3_500 == built.report.budget
    assert TOKENIZER.count_messages(built.messages) == built.report.cost.total
    assert built.report.cost.rounds_kept == (1, 2, 3) and built.report.cost.messages_cut == 1
    assert "Result of ROUND-2: sales" in text_of(built.messages) and "tokens left out here" in text_of(built.messages)
    assert not built.report.cost.examples_left_out


def test_a_giant_output_in_the_current_round_is_cut_but_its_last_message_stays_verbatim() -> None:
    ctx = context(small_window(), SummaryModel())
    current = make_round(2, output_tokens=20_000)
    last = Message(role="user", content="Now plot ROUND-2 as a bar chart.")
    current = RoundMessages(2, (*current.messages, Message(role="assistant", content="{}"), last), current.fold_pieces, requests=(0, 4))
    built = ctx.build(system=SYSTEM, examples=EXAMPLES, history=[make_round(1)], current=current)
    assert built.report.cost.total <= built.report.budget
    assert built.messages[-1] == last and built.messages[-5]["content"] == "Please do step ROUND-2."
    # The current round's output is cut before any retained round or the examples give way.
    assert built.report.cost.rounds_kept == (1,) and not built.report.cost.examples_left_out
    assert "tokens left out here" in built.messages[-3]["content"]


def test_in_a_tiny_window_examples_then_the_oldest_whole_rounds_give_way() -> None:
    ctx = context(small_window(window=1_100), SummaryModel())
    history = [make_round(n, output_tokens=150) for n in range(1, 8)]
    built = build(ctx, history)
    assert built.report.cost.total <= 600
    assert built.report.cost.examples_left_out
    assert built.report.cost.rounds_dropped == tuple(range(1, 1 + len(built.report.cost.rounds_dropped)))
    kept = built.report.cost.rounds_kept
    for index in kept:  # kept rounds are whole: request, code and result together
        assert f"Please do step ROUND-{index}." in text_of(built.messages) and f"Result of ROUND-{index}" in text_of(built.messages)


def test_the_guard_holds_for_every_strategy() -> None:
    history = [make_round(n, output_tokens=400) for n in range(1, 30)]
    for strategy in ("round_compression", "summary_buffer", "sliding_window", "none"):
        built = build(context(small_window(strategy), SummaryModel()), history)
        assert built.report.cost.total <= built.report.budget, strategy
        assert built.report.cost.rounds_kept[-1] == 29, strategy


def test_a_request_too_big_for_the_window_is_never_cut_but_refused_with_the_numbers() -> None:
    ctx = context(small_window(), SummaryModel())
    pasted = RoundMessages(2, (Message(role="user", content="Analyse this: " + BIG_WORD * 9_000 + "END OF PASTE"),), requests=(0,))
    with pytest.raises(ContextOverflowError, match="make the request shorter"):
        ctx.build(system=SYSTEM, examples=EXAMPLES, history=[make_round(1)], current=pasted)


def test_a_current_round_that_cannot_fit_raises_a_plain_overflow_error_with_the_numbers() -> None:
    ctx = context(small_window(window=1_100), SummaryModel())
    current = RoundMessages(1, (Message(role="user", content="x " * 2_000),), requests=(0,))
    with pytest.raises(ContextOverflowError) as raised:
        ctx.build(system="rules " * 600, examples=EXAMPLES, history=[], current=current)
    message = str(raised.value)
    assert "its instructions and the current request need" in message
    assert "budget is 600 tokens (llm.context_window 1,100 - llm.reply_reserve 500 - llm.margin 0)" in message


# --- strategies, placement, switches ---------------------------------------------------------------


def test_sliding_window_never_calls_the_model_and_keeps_the_newest_rounds_that_fit() -> None:
    model = SummaryModel()
    ctx = context(small_window("sliding_window"), model)
    history = play(ctx, 20, sizes=dict.fromkeys(range(1, 21), 300))
    built = build(ctx, history)
    assert model.calls == []
    assert built.report.cost.messages_cut == 0 and not built.report.cost.examples_left_out
    assert built.report.cost.rounds_kept == tuple(range(21 - len(built.report.cost.rounds_kept), 21))


def test_summary_buffer_keeps_the_last_n_rounds_verbatim_and_one_narrative_of_the_rest() -> None:
    model = SummaryModel()
    ctx = context(config(planner={"strategy": "summary_buffer"}, round_compressor={"summary_buffer_rounds": 3}), model)
    history = play(ctx, 6)
    assert ctx.state.folded_through == 3
    assert "third person" in model.calls[0][1][0]["content"]
    built = build(ctx, history)
    assert marks(memory(built.messages)) == [1, 2, 3]
    assert built.report.cost.rounds_kept == (4, 5, 6)


def test_strategy_none_shows_every_round_and_never_calls_the_model() -> None:
    model = SummaryModel()
    ctx = context(config(planner={"strategy": "none"}), model)
    history = play(ctx, 12)
    assert model.calls == []
    assert build(ctx, history).report.cost.rounds_kept == tuple(range(1, 13))


def test_compression_off_for_one_role_leaves_the_other_folding() -> None:
    model = SummaryModel()
    cfg = config(planner={"prompt_compression": False}, round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1})
    planner = context(cfg, model, "planner")
    coder = context(cfg, model, "code_generator", live_variables=LiveVariables)
    play(planner, 4)
    play(coder, 4)
    assert planner.strategy == "sliding_window" and planner.state.folded_through == 0
    assert coder.state.folded_through == 3
    assert {purpose for purpose, _ in model.calls} == {"compression_code_generator"}


def test_the_summary_sits_in_its_own_user_message_after_the_examples_and_before_the_rounds() -> None:
    ctx = context(config(round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1}), SummaryModel())
    history = play(ctx, 2)
    messages = build(ctx, history).messages
    assert messages[0]["content"] == SYSTEM
    assert [m["content"] for m in messages[1:3]] == [m["content"] for m in EXAMPLES]
    assert messages[3]["role"] == "user" and messages[3]["content"].startswith("## Summary of earlier rounds (use only what the current request needs)\n")
    assert "use only what the current request needs" in messages[3]["content"]
    assert messages[4]["content"] == "Please do step ROUND-2.", "the retained round follows the summary"


def test_summary_placement_system_keeps_the_summary_inside_the_system_message() -> None:
    ctx = context(config(round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1, "summary_placement": "system"}), SummaryModel())
    history = play(ctx, 2)
    messages = build(ctx, history).messages
    assert messages[0]["content"].startswith(SYSTEM + "\n\n## Summary of earlier rounds (")
    assert not memory(messages)


def test_the_state_round_trips_through_json_and_restores_the_prompt() -> None:
    ctx = context(config(round_compressor={"rounds_to_compress": 2, "rounds_to_retain": 1}), SummaryModel())
    history = play(ctx, 5)
    saved = json.loads(json.dumps(ctx.state.to_dict()))
    restored = context(config(round_compressor={"rounds_to_compress": 2, "rounds_to_retain": 1}), SummaryModel())
    restored.restore(CompressionState.from_dict(saved))
    assert restored.state == ctx.state
    assert build(restored, history).messages == build(ctx, history).messages


def test_the_report_accounts_for_every_part_of_the_prompt() -> None:
    ctx = context(config(round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1}), SummaryModel())
    history = play(ctx, 3)
    built = build(ctx, history)
    report = ctx.report()
    assert report is built.report and report.folded_through == 2
    assert abs(sum(report.parts().values()) - report.cost.total) <= 2  # joins may merge a token
    assert report.cost.summary > 0 and report.cost.examples > 0 and report.cost.retained_rounds > 0 and report.cost.current_round > 0


# --- over the real wire ----------------------------------------------------------------------------


def test_folds_go_over_http_to_an_openai_compatible_server_for_both_roles_at_once() -> None:
    both_in_flight = threading.Barrier(2, timeout=10)

    def answer_when_both_asked(messages: list[dict[str, Any]]) -> str:
        both_in_flight.wait()  # breaks, failing the fold, if the two folds ran one after the other
        return covering_summary(messages)  # type: ignore[arg-type]

    with contextlib.ExitStack() as stack, ScriptedServer() as server:
        server.set_default("compression", answer_when_both_asked)
        cfg = config(llm={"api_base": server.url, "api_key": "test"}, round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1})
        model = stack.enter_context(contextlib.closing(OpenAIChatModel(cfg.llm)))
        planner = RoleContext(ContextSettings.of(cfg, "planner"), model=model, tokenizer=TOKENIZER)
        coder = RoleContext(ContextSettings.of(cfg, "code_generator"), model=model, tokenizer=TOKENIZER, live_variables=lambda: LiveVariables((DF,)))
        history = [make_round(1), make_round(2)]
        planner.round_finished(history)
        coder.round_finished(history)
        assert planner.wait_idle(10) and coder.wait_idle(10)
        assert [detect_role(r.messages) for r in server.requests] == ["compression", "compression"]
    assert planner.state.summary == coder.state.summary == "Covers ROUND-1."
    assert coder.state.variables == ()  # the summary described none; the prompt still lists df from the kernel


def test_a_fold_that_meets_a_server_error_keeps_the_rounds_verbatim_and_says_why() -> None:
    with ScriptedServer() as server:
        server.set_default("compression", Reply(status=500, error_message="the summariser is down"))
        cfg = config(llm={"api_base": server.url, "api_key": "test", "max_retries": 0}, round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1})
        events: list[Any] = []
        with contextlib.closing(OpenAIChatModel(cfg.llm)) as model:
            ctx = RoleContext(ContextSettings.of(cfg, "planner"), model=model, tokenizer=TOKENIZER, on_fold=events.append)
            history = play(ctx, 2)
    assert ctx.state.folded_through == 0 and not events[0].ok
    assert "summariser is down" in (events[0].error or "")
    assert marks(text_of(build(ctx, history).messages)) == [1, 2, 3]


# --- an 8k window (a local model's usual size): issue A, B and C ------------------------------------


def window_8k(**compressor: Any) -> Config:
    """llm.context_window 8000 with a 4,096 reply reserve (set: the default is 2,000) and 256 margin: a 3,648-token budget."""
    return config(llm={"context_window": 8_000, "reply_reserve": 4_096}, round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1, **compressor})


def many_variables(count: int) -> LiveVariables:
    kinds = ("int", "list", "pandas.DataFrame", "dict")
    return LiveVariables(tuple(Variable(f"v{n}", kinds[n % 4], f"value number {n} of the analysis") for n in range(count)))


def test_at_8k_a_huge_traceback_in_the_current_round_is_cut_and_the_summary_stays() -> None:
    ctx = context(window_8k(), SummaryModel(), "code_generator", live_variables=lambda: many_variables(40))
    history = play(ctx, 3)
    assert ctx.state.folded_through == 2
    current = make_round(4, output_tokens=20_000)  # a grid search's warnings and traceback, say
    built = ctx.build(system=SYSTEM, examples=EXAMPLES, history=history, current=current)
    system = memory(built.messages)
    assert "## Summary of earlier rounds" in system and marks(system) == [1, 2], "the summary was dropped for the traceback"
    assert built.report.cost.total <= built.report.budget == 3_648
    assert built.messages[-3]["content"] == "Please do step ROUND-4.", "the request must stay verbatim"
    assert "tokens left out here" in built.messages[-1]["content"]


def test_at_8k_with_500_variables_each_is_listed_at_most_once_within_its_share() -> None:
    # The summary describes v3 with a stale type: the kernel's (dict) must win in the detailed line.
    describe = json.dumps({"ConversationSummary": "Built many values.", "Variables": [{"name": "v3", "type": "int", "description": "the third value"}]})
    live = many_variables(500)
    ctx = context(window_8k(), SummaryModel(lambda m: describe), "code_generator", live_variables=lambda: live)
    history = play(ctx, 3)
    current = RoundMessages(4, (Message(role="user", content="Plot v499 against v3."),), requests=(0,))
    built = ctx.build(system=SYSTEM, examples=EXAMPLES, history=history, current=current)
    system = memory(built.messages)
    lines = [line for line in system.splitlines() if line.startswith("- v")]
    names = [line.split(" ")[1].rstrip(":") for line in lines]
    also = expand_names(next(line for line in system.splitlines() if line.startswith("Also")))
    assert len(names + also) == len(set(names + also)), "a variable is listed twice"
    assert system.count("## Variables in the kernel") == 1
    assert set(names[:2]) == {"v3", "v499"}, "variables named in the request come first"
    detailed = [line.split(" ")[1] for line in lines if " (" in line]
    assert "v3" in detailed, "precondition: a variable named in the request is listed in detail"
    assert "- v3 (dict): value number 3 of the analysis [the third value]" in system, "the kernel's type and value, the summary's words"
    assert len(names) + len(also) >= 60, "past the detailed few, variables take one line or just their name"
    assert len(names + also) >= 300, "numbered names share entries: a few hundred are named within the share"
    assert "200 more not named here" in system and "list them with code" in system, "past a few hundred, counts by type"
    assert built.report.cost.variables <= int(3_648 * 0.15) + 8
    assert "## Summary of earlier rounds" in system


def test_at_8k_every_fold_request_fits_the_window_and_no_round_goes_unseen() -> None:
    gate = threading.Event()
    model = SummaryModel(gate=gate)
    ctx = context(window_8k(), model, "code_generator", live_variables=lambda: many_variables(300))
    history: list[RoundMessages] = []
    for index in range(1, 9):  # a slow summariser: seven big rounds pile up behind the first fold
        history.append(make_round(index, output_tokens=2_500))
        ctx.round_finished(history)
    gate.set()
    assert ctx.wait_idle(20)
    ctx.round_finished(history)
    assert ctx.wait_idle(20)
    assert ctx.state.folded_through == 7
    seen: set[int] = set()
    for (_, messages), max_tokens in zip(model.calls, model.max_tokens, strict=True):  # as received by the server
        assert max_tokens is not None and max_tokens < 4_096, "a fold's max_tokens is sized to the summary, not the reply reserve"
        assert TOKENIZER.count_messages(messages) + max_tokens <= 8_000 - 256, "a fold request is over the window"
        seen |= {n for n in marks(messages[-1]["content"]) if f"Asked ROUND-{n}" in messages[-1]["content"]}
    assert seen == set(range(1, 8)), "a folded round never reached a fold's input"
    assert marks(memory(build(ctx, history).messages)) == list(range(1, 8))


def test_a_round_too_big_for_a_fold_keeps_its_request_instruction_and_outcome() -> None:
    from taskweaver_lite.memory.summary import round_text

    pieces = (
        FoldPiece("User: which region grew fastest?", essential=True),
        FoldPiece("Planner to CodeInterpreter: compute growth by region", essential=True),
        FoldPiece("Code:\n" + "x = 1\n" * 2_000),
        FoldPiece("The execution failed.", essential=True),
        FoldPiece("Error: ValueError: all 70 fits failed", essential=True),
        FoldPiece("Stderr:\n" + "FitFailedWarning: fit failed\n" * 3_000),
    )
    text = round_text(RoundMessages(9, (), pieces), limit=300, tokenizer=TOKENIZER)
    assert TOKENIZER.count(text) <= 320
    for piece in pieces:
        if piece.essential:
            assert piece.text in text
    assert "tokens left out here" in text


def test_examples_are_shown_until_the_prompt_has_a_round_of_the_roles_own() -> None:
    ctx = context(config(planner={"examples": "until_history"}), SummaryModel())
    first = build(ctx, [])
    assert "EXAMPLE question" in text_of(first.messages) and first.report.cost.examples > 0
    later = build(ctx, [make_round(1)])
    assert "EXAMPLE" not in text_of(later.messages) and later.report.cost.examples == 0
    assert not later.report.cost.examples_left_out, "not offered is not 'left out to fit'"
