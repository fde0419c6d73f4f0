"""Prompts counted in the model's own tokens: exactly where the server tells, calibrated elsewhere, no miss hidden.

The scripted server plays a model whose tokenizer makes `token_ratio` times o200k's tokens of every
text: as llama.cpp's server (`/props`, `/tokenize`, `/apply-template`, ChatML), as vLLM (`/tokenize`),
or as any other OpenAI-compatible server, which says its count only in each reply's usage.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers import IdleExecutor, make_project

from taskweaver_lite.config.file import load_config
from taskweaver_lite.config.settings import Config, LLMConfig
from taskweaver_lite.llm.client import OpenAIChatModel
from taskweaver_lite.llm.counting import CAUTIOUS_RATIO, RATIOS_FILE, ModelTokenizer, RatioBook
from taskweaver_lite.llm.tokens import get_tokenizer
from taskweaver_lite.memory.compression import ContextSettings, RoleContext
from taskweaver_lite.records.conversation import RoundMessages
from taskweaver_lite.records.model_calls import Message
from taskweaver_lite.session.workspace import Workspace
from taskweaver_lite.testing.scripted_server import ScriptedServer, chatml, planner_reply, summary_reply, text_reply

pytestmark = pytest.mark.unit

O200K = get_tokenizer()
PROMPT = (
    Message(role="system", content="You are the Planner. Answer in JSON. " * 20),
    Message(role="user", content="region,units,revenue\nnorth,1204,88123.50\nsouth,998,70211.25\n" * 12),
    Message(role="assistant", content='{"response": {"message": "Loaded 24 rows.", "send_to": "User"}}'),
    Message(role="user", content="Which region grew fastest between 2021 and 2023?"),
)


@pytest.fixture
def models() -> Iterator[list[OpenAIChatModel]]:
    """Clients a test makes, closed after it."""
    made: list[OpenAIChatModel] = []
    yield made
    for model in made:
        model.close()


def client(made: list[OpenAIChatModel], server: ScriptedServer, *, book: RatioBook | None = None, **llm: Any) -> OpenAIChatModel:
    settings = {"api_base": server.url, "api_key": "k", "model": "local-model", "max_retries": 0, "timeout": 10, "stream": False, **llm}
    model = OpenAIChatModel(LLMConfig.model_validate(settings), ratios=book)
    made.append(model)
    return model


@pytest.mark.parametrize("kind", ["llama.cpp", "vllm"])
def test_a_server_that_tells_counts_every_prompt_exactly_with_its_template(kind: str, models: list[OpenAIChatModel]) -> None:
    with ScriptedServer(server_kind=kind, token_ratio=1.3) as server:  # type: ignore[arg-type]
        # llama.cpp is found by its GET /props; vLLM is named (local discovery names it too).
        counter = client(models, server, server_kind="vllm" if kind == "vllm" else "auto").counter
        for prompt in (PROMPT, PROMPT[:1], PROMPT[:2], (PROMPT[1], PROMPT[3])):
            exact = server.prompt_tokens([dict(m) for m in prompt])
            ours = counter.count_messages(prompt)
            assert exact <= ours <= exact + 2, f"{kind}: we count {ours} where the server counts {exact} ({len(prompt)} messages)"
        assert counter.mode == kind and counter.ratio == 1.0
        assert counter.describe() == f"the server's own tokenizer ({'llama.cpp' if kind == 'llama.cpp' else 'vLLM'})"
        assert counter.count_messages(PROMPT) > 1.25 * O200K.count_messages(PROMPT), "precondition: this model makes more tokens than o200k"


def test_a_prompt_costs_a_round_trip_per_text_not_yet_seen_never_one_per_message(models: list[OpenAIChatModel]) -> None:
    with ScriptedServer(server_kind="llama.cpp") as server:
        counter = client(models, server).counter
        counter.count_messages(PROMPT)
        assert counter.server is not None
        before = counter.server.requests
        for _ in range(20):
            counter.count_messages(PROMPT)
        assert counter.server.requests == before, "texts counted once are remembered"
        counter.count_messages([*PROMPT, Message(role="user", content="A new request.")])
        assert counter.server.requests == before + 1


def test_a_llama_cpp_server_found_by_its_replies_counts_from_then_on(models: list[OpenAIChatModel]) -> None:
    with ScriptedServer(server_kind="llama.cpp", token_ratio=1.3) as server:
        server.set_default("other", text_reply("hi"))
        model = client(models, server, server_kind="other")  # told nothing that says llama.cpp: no probe
        assert model.counter.mode == "o200k_base"
        model.complete(list(PROMPT), purpose="planner")  # the reply carries llama.cpp's timings
        assert model.counter.mode == "llama.cpp"
        exact = server.prompt_tokens([dict(m) for m in PROMPT])
        assert exact <= model.counter.count_messages(PROMPT) <= exact + 2


def test_another_model_starts_cautious_and_then_follows_the_worst_ratio_its_replies_show(models: list[OpenAIChatModel]) -> None:
    with ScriptedServer(token_ratio=1.2) as server:
        server.set_default("other", text_reply("hi"))
        model = client(models, server)
        assert model.counter.ratio == CAUTIOUS_RATIO, "an unmeasured model that is not OpenAI's is counted cautiously"
        assert model.counter.describe() == "o200k_base times 1.300, a cautious start until a reply measures it"
        model.complete(list(PROMPT), purpose="planner")
        assert model.counter.ratio == pytest.approx(1.2, abs=0.01)
        assert model.counter.describe().endswith(", calibrated on the server's replies")
        assert model.counter.count_messages(PROMPT) >= server.prompt_tokens([dict(m) for m in PROMPT])
        server.token_ratio = 1.1  # a prompt that tokenizes better does not lower the ratio
        model.complete(list(PROMPT), purpose="planner")
        assert model.counter.ratio == pytest.approx(1.2, abs=0.01)


def test_a_server_said_to_count_that_does_not_is_one_warning_and_counting_goes_on_cautiously(
    models: list[OpenAIChatModel], caplog: pytest.LogCaptureFixture
) -> None:
    with ScriptedServer() as server, caplog.at_level(logging.WARNING, logger="taskweaver_lite.llm.counting"):
        counter = client(models, server, server_kind="llama.cpp").counter  # it has no /tokenize
        first, again = counter.count_messages(PROMPT), counter.count_messages(PROMPT)
    assert (counter.mode, counter.ratio) == ("o200k_base", CAUTIOUS_RATIO)
    assert first == again >= O200K.count_messages(PROMPT) * CAUTIOUS_RATIO
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "did not count a prompt (HTTP 404)" in said[0] and "cautiously" in said[0], said


def test_openai_models_are_counted_with_o200k_from_the_start(models: list[OpenAIChatModel]) -> None:
    with ScriptedServer() as server:
        for name in ("gpt-4o-mini", "o3-mini"):
            counter = client(models, server, model=name).counter
            assert (counter.mode, counter.ratio) == ("o200k_base", 1.0)
            assert counter.count_messages(PROMPT) == O200K.count_messages(PROMPT)


def test_llm_tokenizer_alone_when_asked_counts_as_before_and_learns_nothing(models: list[OpenAIChatModel]) -> None:
    with ScriptedServer(server_kind="llama.cpp", token_ratio=1.5) as server:
        server.set_default("other", text_reply("hi"))
        model = client(models, server, token_counting="tokenizer")
        model.complete(list(PROMPT), purpose="planner")
        assert (model.counter.mode, model.counter.ratio) == ("o200k_base", 1.0)
        assert model.counter.count_messages(PROMPT) == O200K.count_messages(PROMPT)


def test_a_request_the_server_counts_over_its_budget_is_one_warning_with_the_figures_and_the_next_prompts_shrink(
    models: list[OpenAIChatModel], caplog: pytest.LogCaptureFixture
) -> None:
    with ScriptedServer(token_ratio=1.7) as server:
        server.set_default("other", text_reply("hi"))
        model = client(models, server, context_window=1100, reply_reserve=300, margin=0)
        counter = model.counter
        budget = 1100 - 300
        before = counter.count_messages(PROMPT)
        assert before <= budget, "precondition: by the cautious count the prompt fits"
        server_count = server.prompt_tokens([dict(m) for m in PROMPT])
        assert server_count > budget, "precondition: the server counts it over"
        with caplog.at_level(logging.WARNING, logger="taskweaver_lite.llm.counting"):
            model.complete(list(PROMPT), purpose="planner")
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, warnings
        said = warnings[0]
        assert f"{server_count:,} prompt tokens" in said and f"the {budget:,} its budget allowed" in said and f"our count was {before:,}" in said
        assert counter.count_messages(PROMPT) >= server_count, "the next count of the same prompt is the server's at least: it shrinks"


def test_the_worst_ratio_is_kept_for_later_sessions_and_a_new_client_starts_from_it(tmp_path: Path, models: list[OpenAIChatModel]) -> None:
    book_path = tmp_path / RATIOS_FILE
    with ScriptedServer(token_ratio=1.45) as server:
        server.set_default("other", text_reply("hi"))
        client(models, server, book=RatioBook(book_path)).complete(list(PROMPT), purpose="planner")
        kept = json.loads(book_path.read_text())
        assert [round(v, 2) for v in kept.values()] == [1.45] and all("local-model" in key for key in kept)
        later = client(models, server, book=RatioBook(book_path)).counter
        assert later.ratio == pytest.approx(1.45, abs=0.01), "a later session starts measured, not cautious"


def test_a_ratio_kept_with_a_session_is_taken_back_when_worse(models: list[OpenAIChatModel]) -> None:
    with ScriptedServer(token_ratio=1.1) as server:
        server.set_default("other", text_reply("hi"))
        first = client(models, server)
        first.counter.adopt({first.counter.key + " o200k_base": 1.5})
        assert first.counter.ratio == 1.5
        assert first.counter.calibration() == {first.counter.key + " o200k_base": 1.5}


# --- the guard keeps every request within the window by the server's count -------------------------


def big_round(index: int) -> RoundMessages:
    csv = "".join(f"{index},{n},{n * 37 % 1000}.{n % 100:02d},2023-0{n % 9 + 1}-1{n % 10}\n" for n in range(90))
    return RoundMessages(
        index,
        (
            Message(role="user", content=f"ROUND-{index}: summarise the sales file for round {index}."),
            Message(role="assistant", content=f'{{"response": {{"code": "print(df.head(90).to_csv())", "round": {index}}}}}'),
            Message(role="user", content=f"The code printed:\n{csv}"),
        ),
        requests=(0,),
    )


def fold_answer(messages: Sequence[Any]) -> str:
    rounds = sorted({int(word.split("-")[1].rstrip(":.,")) for m in messages for word in str(m["content"]).split() if word.startswith("ROUND-")})
    return summary_reply(f"Covered rounds {', '.join(map(str, rounds))}: each summarised its sales file.")


@pytest.mark.parametrize("kind", ["llama.cpp", "openai"])
def test_every_request_folds_included_fits_the_window_by_the_servers_count(kind: str, models: list[OpenAIChatModel]) -> None:
    window = 8000
    with ScriptedServer(server_kind=kind, token_ratio=1.3) as server:  # type: ignore[arg-type]
        server.set_default("other", text_reply("ok"))
        server.set_default("compression", fold_answer)
        cfg = Config.model_validate(
            {
                "llm": {"api_base": server.url, "api_key": "k", "model": "local-model", "context_window": window, "stream": False, "max_retries": 0},
                "round_compressor": {"rounds_to_compress": 2, "rounds_to_retain": 3, "retry_backoff": 0.0},
                "planner": {"examples": "always"},
            }
        )
        model = client(models, server, context_window=window)
        ctx = RoleContext(ContextSettings.of(cfg, "planner", label="Planner"), model=model, tokenizer=model.counter)
        history: list[RoundMessages] = []
        for index in range(1, 25):
            current = big_round(index)
            built = ctx.build(system="You are the Planner. " * 200, examples=(), history=history, current=current)
            model.complete(list(built.messages), purpose="planner")
            history.append(current)
            ctx.round_finished(history)
            assert ctx.wait_idle(30)
        requests = server.requests
        assert any(r.role == "compression" for r in requests), "precondition: rounds were folded"
        over = []
        for number, request in enumerate(requests):
            counted = server.prompt_tokens(request.messages)
            if counted + int(request.body["max_tokens"]) > window:
                over.append(f"request {number} ({request.role}): {counted:,} + max_tokens {request.body['max_tokens']:,} > {window:,}")
        assert not over, over
        largest = max(server.prompt_tokens(r.messages) + int(r.body["max_tokens"]) for r in requests)
        assert largest > 0.85 * window, f"precondition: prompts come near the window ({largest:,})"
        assert isinstance(ctx.tokenizer, ModelTokenizer)


def test_the_scripted_server_counts_chatml_as_its_template_renders_it() -> None:
    text = chatml([{"role": "system", "content": "a"}, {"role": "user", "content": "b"}])
    assert text == "<|im_start|>system\na<|im_end|>\n<|im_start|>user\nb<|im_end|>\n<|im_start|>assistant\n"


# --- kept with the session and across sessions ------------------------------------------------------


def test_a_sessions_measured_ratio_is_kept_with_it_and_in_the_state_folder_for_the_next(tmp_path: Path) -> None:
    with ScriptedServer(token_ratio=1.4) as server:
        server.set_default("planner", planner_reply("Hello.", send_to="User"))
        project = make_project(tmp_path, server.url)
        with Workspace(load_config(project)) as workspace:
            session = workspace.new_session(executor=IdleExecutor)
            try:
                assert session.ask("hi").state == "finished"
                assert [round(r, 2) for r in session.token_ratios().values()] == [1.4]
            finally:
                session.close()
        kept = project / RATIOS_FILE
        assert [round(r, 2) for r in json.loads(kept.read_text()).values()] == [1.4], "later sessions start from it"
        kept.unlink()  # another machine: only the session's own record has it
        with Workspace(load_config(project)) as workspace:
            fresh = workspace.new_session(executor=IdleExecutor)
            resumed, _ = workspace.resume_session(session.id, executor=IdleExecutor)
            try:
                fresh_counter = fresh.contexts()["planner"].tokenizer
                assert isinstance(fresh_counter, ModelTokenizer) and fresh_counter.ratio == CAUTIOUS_RATIO, "a new session has nothing kept"
                resumed_counter = resumed.contexts()["planner"].tokenizer
                assert isinstance(resumed_counter, ModelTokenizer) and round(resumed_counter.ratio, 2) == 1.4
            finally:
                fresh.close()
                resumed.close()
