"""Prompts a server's prefix cache can keep: the order by volatility, folds at round boundaries, the
fold schedules, observation masking, fold prompts that share their start, and the variables list's tiers."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator, Sequence

import pytest
from test_compression import (  # the fixtures that lend and stop the servers SummaryModel uses
    EXAMPLES,
    SYSTEM,
    SummaryModel,
    build,
    close_wires,  # noqa: F401
    config,
    context,
    make_round,
    marks,
    memory,
    play,
    return_wires,  # noqa: F401
)

from taskweaver_lite.llm.tokens import get_tokenizer
from taskweaver_lite.memory.compression import RoleContext
from taskweaver_lite.memory.variables import LiveVariables, expand_names, render_variables
from taskweaver_lite.records.conversation import RoundMessages
from taskweaver_lite.records.execution import CellError, ExecutionResult, Variable, VariableChanges
from taskweaver_lite.records.model_calls import Message

pytestmark = pytest.mark.unit

TOKENIZER = get_tokenizer()


def with_reply(rnd: RoundMessages, text: str) -> RoundMessages:
    """The current round one call later: the model's reply and a result added to it."""
    more = (Message(role="assistant", content=text), Message(role="user", content=f"Result of {text}"))
    return RoundMessages(rnd.index, (*rnd.messages, *more), rnd.fold_pieces, rnd.requests)


def is_prefix(first: Sequence[Message], second: Sequence[Message]) -> bool:
    return list(second[: len(first)]) == list(first)


# --- order and round boundaries ----------------------------------------------------------------------


def test_a_fold_finishing_between_two_calls_of_a_round_does_not_change_the_first_calls_bytes() -> None:
    gate = threading.Event()
    model = SummaryModel(gate=gate)
    ctx = context(config(round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1}), model)
    history = [make_round(1), make_round(2)]
    ctx.round_finished(history)  # the fold of round 1 starts and hangs
    current = make_round(3)
    first = ctx.build(system=SYSTEM, examples=EXAMPLES, history=history, current=current).messages
    gate.set()
    assert ctx.wait_idle(10) and ctx.state.folded_through == 1, "precondition: the fold finished mid-round"
    second = ctx.build(system=SYSTEM, examples=EXAMPLES, history=history, current=with_reply(current, "step two")).messages
    assert is_prefix(first, second), "the round's second call must extend its first byte for byte"
    assert not memory(second), "the fold waits for the next round"
    history.append(current)
    following = ctx.build(system=SYSTEM, examples=EXAMPLES, history=history, current=make_round(4)).messages
    assert marks(memory(following)) == [1], "the next round's first request shows the fold"


def test_earlier_rounds_keep_their_detail_until_a_fold_lands_at_a_rounds_first_request() -> None:
    gate = threading.Event()
    ctx = context(config(round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1}), SummaryModel(gate=gate))
    history = [make_round(1), make_round(2)]
    ctx.build(system=SYSTEM, examples=EXAMPLES, history=[], current=history[0])
    assert ctx.detailed_from(2) == 1, "no fold since round 1: round 2's prompts show round 1 in full"
    ctx.build(system=SYSTEM, examples=EXAMPLES, history=history[:1], current=history[1])
    ctx.round_finished(history)  # the fold of round 1 starts and hangs
    ctx.build(system=SYSTEM, examples=EXAMPLES, history=history, current=make_round(3))
    gate.set()
    assert ctx.wait_idle(10) and ctx.state.folded_through == 1, "precondition: the fold finished mid-round"
    assert ctx.detailed_from(3) == 1, "a fold that lands mid-round changes nothing before the next round"
    assert ctx.detailed_from(4) == 4, "the next round's first request shows the fold: the rounds before it lose their detail then"
    history.append(make_round(3))
    ctx.build(system=SYSTEM, examples=EXAMPLES, history=history, current=make_round(4))
    assert ctx.detailed_from(4) == 4 and ctx.detailed_from(5) == 4, "rounds from the one the fold landed in keep their detail"


def test_without_a_summary_earlier_rounds_never_keep_their_detail() -> None:
    ctx = context(config(planner={"strategy": "sliding_window"}), SummaryModel())
    assert ctx.detailed_from(3) == 3


def test_the_prompt_goes_system_examples_memory_retained_rounds_current_and_the_summary_has_no_round_numbers() -> None:
    ctx = context(config(round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1}), SummaryModel(), "code_generator", live_variables=LiveVariables)
    history = play(ctx, 3)
    messages = build(ctx, history).messages
    kinds = ["system", "example", "example", "memory", "round 3", "round 3", "round 3", "current", "current", "current"]
    contents = [m["content"] for m in messages]
    assert len(contents) == len(kinds)
    assert contents[0] == SYSTEM and contents[1:3] == [m["content"] for m in EXAMPLES]
    assert contents[3].startswith("## Variables in the kernel"), "the list first: at most folds only the summary after it grows"
    assert "\n## Summary of earlier rounds (use only what the current request needs)\n" in contents[3]
    assert contents[4] == "Please do step ROUND-3." and contents[-3] == "Please do step ROUND-4."
    heading = next(line for line in contents[3].splitlines() if line.startswith("## Summary"))
    assert not any(ch.isdigit() for ch in heading), f"a heading with numbers moves the prefix at every fold: {heading!r}"


def test_appended_notes_leave_the_summary_before_them_as_it_was() -> None:
    ctx = context(config(round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1}), SummaryModel())
    history = play(ctx, 3)
    before = memory(build(ctx, history).messages)
    history = [*history, make_round(4)]
    ctx.round_finished(history)
    assert ctx.wait_idle(10)
    after = memory(build(ctx, history).messages)
    assert after.startswith(before), "an append fold extends the summary: the server keeps what it cached"


# --- fold schedules and masking ----------------------------------------------------------------------


def test_the_pressure_schedule_appends_rounds_until_the_trigger_then_folds_all_but_the_retained_at_once() -> None:
    model = SummaryModel()
    cfg = config(planner={"fold_schedule": "pressure"}, round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 2, "fold_token_trigger": 0.1})
    ctx = context(cfg, model)  # the trigger: a tenth of the 123,648-token budget, 12,364 tokens
    folded: list[int] = []
    history: list[RoundMessages] = []
    for index in range(1, 9):
        history.append(make_round(index, output_tokens=2_000))
        ctx.round_finished(history)
        assert ctx.wait_idle(10)
        folded.append(ctx.state.folded_through)
    # Rounds of ~2,000 tokens: seven unfolded pass 12,364; then all but the latest two fold in one step.
    assert folded == [0, 0, 0, 0, 0, 0, 5, 5]
    assert len(model.calls) == 1, "one fold for five rounds (they fit one call)"
    rounds_model = SummaryModel()
    rounds_schedule = context(config(round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 2, "fold_token_trigger": 0.1}), rounds_model)
    play(rounds_schedule, 8, sizes=dict.fromkeys(range(1, 9), 2_000))
    assert len(rounds_model.calls) == 6, "the rounds schedule folds every round"


def test_under_pressure_retained_rounds_over_half_the_trigger_fold_too_so_the_next_fold_is_rounds_away() -> None:
    cfg = config(planner={"fold_schedule": "pressure"}, round_compressor={"rounds_to_retain": 3, "fold_token_trigger": 0.1})
    ctx = context(cfg, SummaryModel())  # trigger 12,364 tokens; rounds of ~5,000
    folded = [ctx.state.folded_through for _ in play_each(ctx, 6, tokens=5_000)]
    # Three rounds pass the trigger; keeping all three would fold again at every round: the newest stays,
    # and the next fold waits until three rounds are unfolded again.
    assert folded == [0, 0, 2, 2, 4, 4]


def play_each(ctx: RoleContext, rounds: int, *, tokens: int) -> Iterator[int]:
    """Finish `rounds` rounds of about `tokens` tokens each, letting folds complete; yields each round's index."""
    history: list[RoundMessages] = []
    for index in range(1, rounds + 1):
        history.append(make_round(index, output_tokens=tokens))
        ctx.round_finished(history)
        assert ctx.wait_idle(10)
        yield index


def test_a_pressure_fold_too_big_for_one_call_goes_in_batches_and_loses_no_round() -> None:
    model = SummaryModel()
    cfg = config(
        llm={"context_window": 8_000, "reply_reserve": 1_000, "margin": 0},
        planner={"fold_schedule": "pressure"},
        # The folds' model has a smaller window: a call takes about three of these rounds.
        round_compressor={"rounds_to_retain": 1, "fold_token_trigger": 0.6, "llm": {"context_window": 3_000, "reply_reserve": 500}},
    )
    ctx = context(cfg, model)
    play(ctx, 8, sizes=dict.fromkeys(range(1, 9), 600))
    assert ctx.state.folded_through == 6, "seven rounds passed the trigger: all but the latest folded in one step"
    assert len(model.calls) >= 2, "the rounds did not fit one fold call"
    seen = sorted({n for _, messages in model.calls for n in marks(messages[-1]["content"])})
    assert seen == list(range(1, ctx.state.folded_through + 1))


def masked_round(index: int) -> RoundMessages:
    result = ExecutionResult(
        code=f"df{index} = load()",
        success=True,
        stdout="\n".join(f"row {n} ROUND-{index}-OUTPUT" for n in range(200)),
        full_output_path=f"outputs/cell-{index:04d}.txt",
        changes=VariableChanges(created=(f"df{index}",)),
    )
    full = Message(role="user", content=f"Execution result:\n{result.prompt_text()}")
    short = Message(role="user", content=f"Execution result:\n{result.masked_prompt_text()}")
    ask = Message(role="user", content=f"Please do step ROUND-{index}.")
    code = Message(role="assistant", content=f'{{"reply_content": "df{index} = load()"}}')
    return RoundMessages(index, (ask, code, full), requests=(0,), masked=(ask, code, short), variables=(f"df{index}",))


def test_observation_masking_keeps_code_outcome_and_variables_and_shows_old_outputs_as_one_line_without_a_model_call() -> None:
    model = SummaryModel()
    cfg = config(code_generator={"strategy": "observation_masking"}, round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1})
    ctx = context(cfg, model, "code_generator", live_variables=LiveVariables)
    history: list[RoundMessages] = []
    for index in (1, 2, 3):
        history.append(masked_round(index))
        ctx.round_finished(history)
    assert model.calls == [], "masking calls no model"
    text = "\n".join(m["content"] for m in build(ctx, history).messages)
    for old in (1, 2):
        assert f"ROUND-{old}-OUTPUT" not in text and f"Please do step ROUND-{old}." in text
        assert f'"reply_content": "df{old} = load()"' in text, "the old round keeps its code"
        assert f"(Output omitted: 200 lines; full output in outputs/cell-{old:04d}.txt)" in text
        assert f"Variables created: df{old}" in text
    assert "ROUND-3-OUTPUT" in text, "the retained round keeps its output"


def test_a_masked_failure_keeps_its_error_line() -> None:
    failed = ExecutionResult(code="1/0", success=False, stderr="warn\n" * 50, error=CellError("ZeroDivisionError", "division by zero", "tb\n" * 20))
    masked = failed.masked_prompt_text()
    assert masked.startswith("The execution failed.\nError: ZeroDivisionError")
    assert "(Output omitted: 70 lines)" in masked and "warn" not in masked


# --- fold requests ---------------------------------------------------------------------------------------


def test_every_fold_request_of_a_role_starts_with_the_same_system_message() -> None:
    model = SummaryModel()
    cfg = config(round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1, "max_summary_tokens": 100})
    ctx = context(cfg, model, "code_generator", live_variables=LiveVariables)
    play(ctx, 7)
    systems = {messages[0]["content"] for _, messages in model.calls}
    modes = {"append" if "appended" in messages[-1]["content"] else "merge" for _, messages in model.calls}
    assert modes == {"append", "merge"}, "precondition: both kinds of fold were made"
    assert len(systems) == 1, "the fold's mode is told last, so every fold of a role shares its system message (the server caches it)"
    (system,) = systems
    assert "ConversationSummary" in system and "init_plan" not in system and "reply_content" not in system


# --- the variables list ----------------------------------------------------------------------------------


def soak_like(count: int) -> LiveVariables:
    """`count` variables named like a long analysis names them (r0001_count, r0001_items, ...), and one wide frame."""
    kinds = (
        ("count", "int", "12"),
        ("items", "list", "length 12"),
        ("frame", "pandas.DataFrame", "shape (4, 2); columns: a int64, b float64"),
        ("meta", "dict", "length 3"),
    )
    made = [Variable(f"r{n:04d}_{suffix}", kind, description) for n in range(1, count // 4 + 1) for suffix, kind, description in kinds]
    wide = Variable("X_train", "pandas.DataFrame", "shape (800, 40); columns: " + ", ".join(f"feature_{i} float64" for i in range(40)))
    return LiveVariables(tuple(reversed([*made, wide])))


@pytest.mark.parametrize("count", [40, 120, 200])
def test_every_live_name_is_named_within_the_share_while_the_kernel_holds_up_to_200(count: int) -> None:
    live = soak_like(count)
    listed = render_variables(live, relevant=["r0003_frame"], max_tokens=int(3_648 * 0.12), tokenizer=TOKENIZER)
    names = {v.name for v in live.variables}
    assert TOKENIZER.count(listed.text) <= int(3_648 * 0.12)
    assert listed.named == names, f"{len(names - listed.named)} of {len(names)} live names are not named"
    lines = listed.text.splitlines()
    assert lines[2].startswith("- r0003_frame (pandas.DataFrame): shape (4, 2)"), "the name in the request comes first, in full detail"
    also = expand_names(next(line for line in lines if line.startswith("Also")))
    assert set(also) | {line.split(" ")[1].rstrip(":") for line in lines if line.startswith("- ")} == names


def test_a_wide_frame_does_not_take_the_share_from_the_other_names() -> None:
    live = soak_like(40)
    listed = render_variables(live, relevant=["X_train"], max_tokens=200, tokenizer=TOKENIZER)
    assert "X_train" in listed.named and len(listed.named) == len(live.variables), listed.text


def test_the_variables_list_stays_byte_identical_between_folds_and_names_new_variables_through_their_rounds() -> None:
    live = {"now": soak_like(8)}
    cfg = config(code_generator={"fold_schedule": "pressure"}, round_compressor={"rounds_to_retain": 1})
    ctx = context(cfg, SummaryModel(), "code_generator", live_variables=lambda: live["now"])
    history: list[RoundMessages] = []
    lists: list[str] = []
    for index in range(1, 5):
        step = RoundMessages(index, (Message(role="user", content=f"step {index}"),), requests=(0,))
        lists.append(memory(ctx.build(system=SYSTEM, examples=EXAMPLES, history=history, current=step).messages))
        # The round's code makes a variable; its result says so, and the round keeps that line.
        live["now"] = LiveVariables((*live["now"].variables, Variable(f"new{index}", "int", "1")))
        said = Message(role="user", content=f"Variables created: new{index}")
        history.append(RoundMessages(index, (*step.messages, said), requests=(0,), variables=(f"new{index}",)))
        ctx.round_finished(history)
        assert ctx.wait_idle(10)
    assert ctx.state.folded_through == 0, "precondition: no fold under pressure"
    assert len(set(lists)) == 1, "no fold, no new list: the variables made since are named by their rounds"
    assert json.dumps(lists[0]).count("new") == 0


def test_append_folds_keep_the_variables_list_and_their_notes_name_the_folded_rounds_variables_until_a_merge() -> None:
    live = {"now": soak_like(8)}
    notes = itertools.count(1)

    def answer(messages: Sequence[Message]) -> str:  # notes long enough that the summary merges within a few folds
        return json.dumps({"ConversationSummary": f"Note {next(notes)}: " + "findings " * 60, "Variables": []})

    cfg = config(llm={"context_window": 8000, "reply_reserve": 4096}, round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1})
    ctx = context(cfg, SummaryModel(answer), "code_generator", live_variables=lambda: live["now"])
    history: list[RoundMessages] = []
    seen: list[tuple[str, str, tuple[str, ...]]] = []  # (the list, the summary, the live names) at each round's first request
    for index in range(1, 12):
        step = RoundMessages(index, (Message(role="user", content=f"step {index}"),), requests=(0,))
        text = memory(ctx.build(system=SYSTEM, examples=EXAMPLES, history=history, current=step).messages)
        listed, _, summary = text.partition("\n\n## Summary of earlier rounds")
        seen.append((listed, summary, tuple(v.name for v in live["now"].variables)))
        live["now"] = LiveVariables((Variable(f"new{index}", "int", "1"), *live["now"].variables))
        said = Message(role="user", content=f"Variables created: new{index}")
        history.append(RoundMessages(index, (*step.messages, said), requests=(0,), variables=(f"new{index}",)))
        ctx.round_finished(history)
        assert ctx.wait_idle(10)
    appended = [i for i in range(1, len(seen)) if seen[i - 1][1] and seen[i][1].startswith(seen[i - 1][1])]
    merged = [i for i in range(1, len(seen)) if seen[i - 1][1] and not seen[i][1].startswith(seen[i - 1][1])]
    assert len(appended) >= 3 and merged, f"precondition: append folds and a merge happened (appended {appended}, merged {merged})"
    for i in appended:
        assert seen[i][0] == seen[i - 1][0], f"an append fold (round {i + 1}) re-rendered the variables list before the summary"
        folded = f"new{i - 1}"
        assert f"{folded} (int)" in seen[i][1], f"the notes of round {i + 1}'s summary do not name {folded}, made by the folded round"
    for i in merged:
        assert seen[i][0] != seen[i - 1][0], "a merge rewrote the summary, so the list before it is rendered again"
        assert f"- new{i - 1}" in seen[i][0] or f"new{i - 1}" in seen[i][0], "the list rendered at a merge names what the notes named"
    for listed, summary, names in seen:
        missing = [name for name in names if name not in listed and name not in summary and not name.startswith("new")]
        assert not missing, f"live variables named nowhere in the memory: {missing}"


@pytest.mark.parametrize("strategy", ["sliding_window", "none", "observation_masking"])
def test_under_pressure_rounds_kept_whole_leave_the_window_in_steps_not_one_per_round(strategy: str) -> None:
    def kept_prefixes(schedule: str) -> int:
        cfg = config(
            llm={"context_window": 4_000, "reply_reserve": 500, "margin": 0},
            planner={"strategy": strategy, "fold_schedule": schedule, "examples": "until_history"},
            round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1, "fold_token_trigger": 0},
        )
        ctx = context(cfg, SummaryModel())
        history: list[RoundMessages] = []
        prompts = []
        for index in range(1, 31):
            prompts.append(build(ctx, history).messages)
            history.append(make_round(index, output_tokens=400))
            ctx.round_finished(history)
        # A prompt whose history (all but the current round's three messages) the next one starts with.
        return sum(is_prefix(a[:-3], b) for a, b in itertools.pairwise(prompts[10:]))

    stepped, sliding = kept_prefixes("pressure"), kept_prefixes("rounds")
    assert stepped >= 12, f"under pressure most prompts start with the one before ({stepped} of 19)"
    assert stepped > sliding, f"the rounds schedule drops a round at every call once the window is full ({sliding} of 19)"


@pytest.mark.parametrize("strategy", ["sliding_window", "none", "round_compression"])
def test_when_the_guard_drops_rounds_the_list_names_the_variables_they_named(strategy: str) -> None:
    live = {"now": LiveVariables()}
    # round_compression keeping 20 rounds: the guard, not a fold, makes room.
    compressor = {"fold_token_trigger": 0, "rounds_to_compress": 20, "rounds_to_retain": 20}
    cfg = config(llm={"context_window": 8000}, code_generator={"strategy": strategy, "examples": "until_history"}, round_compressor=compressor)
    ctx = context(cfg, SummaryModel(), "code_generator", live_variables=lambda: live["now"])
    history: list[RoundMessages] = []
    dropped = False
    for index in range(1, 16):
        made = (f"made{index}_a", f"made{index}_b")
        step = RoundMessages(index, (Message(role="user", content=f"step {index} " + "words " * 600),), requests=(0,))
        built = ctx.build(system=SYSTEM, examples=EXAMPLES, history=history, current=step)
        dropped = dropped or bool(built.report.cost.rounds_dropped)
        text = "\n".join(m["content"] for m in built.messages)
        unnamed = [v.name for v in live["now"].variables if v.name not in text]
        assert not unnamed, f"round {index}: rounds left the prompt and the variables they made are named nowhere: {unnamed[:4]}"
        live["now"] = LiveVariables((*(Variable(name, "int", "1") for name in made), *live["now"].variables))
        said = Message(role="user", content="Variables created: " + ", ".join(made))
        history.append(RoundMessages(index, (*step.messages, said), requests=(0,), variables=made))
        ctx.round_finished(history)
        assert ctx.wait_idle(10)
    assert dropped, "precondition: the guard dropped rounds"
