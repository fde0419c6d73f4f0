"""Folds that open with their role's own prompt (`<role>.fold_prompt: role`, the default), read off the wire.

A fold call is the role's previous prompt, byte for byte, cut before the rounds it keeps, with the
request for the summary as its last message; it goes to the role's cache key (or llama.cpp slot).
When that would not fit the window with the fold's reply, the fold goes to the separate prompt.
Every request of a real session at an 8k window, folds included, fits the window with its reply.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from soak_session import overflows, run_soak

from taskweaver_lite.config.settings import Config
from taskweaver_lite.llm.client import OpenAIChatModel
from taskweaver_lite.llm.tokens import get_tokenizer
from taskweaver_lite.memory.compression import ContextSettings, RoleContext
from taskweaver_lite.memory.variables import LiveVariables
from taskweaver_lite.records.conversation import RoundMessages
from taskweaver_lite.records.execution import FoldPiece
from taskweaver_lite.records.model_calls import Message
from taskweaver_lite.testing.scripted_server import ScriptedRequest, ScriptedServer, code_reply, planner_reply

pytestmark = pytest.mark.unit

TOKENIZER = get_tokenizer()
SYSTEMS = {
    "planner": "You are the Planner. Reply with init_plan, plan, current_plan_step, send_to and message.",
    "code_generator": "You are the CodeGenerator. Reply with thought, reply_type and reply_content.",
}
EXAMPLES = (Message(role="user", content="EXAMPLE question"), Message(role="assistant", content="EXAMPLE answer"))
ROLE_REPLIES = {"planner": planner_reply("Next step."), "code_generator": code_reply("print(1)")}


def marks(text: str) -> set[int]:
    return {int(n) for n in re.findall(r"ROUND-(\d+)\b", text)}


def summary(messages: list[dict[str, Any]]) -> str:
    """A valid summary naming the rounds its prompt shows (the fold's input)."""
    covered = " ".join(f"ROUND-{n}" for n in sorted(marks("\n".join(str(m["content"]) for m in messages))))
    return json.dumps({"ConversationSummary": f"Covers {covered}.", "Variables": []})


def make_round(index: int, *, output_tokens: int = 10) -> RoundMessages:
    output = f"Result of ROUND-{index}: " + "sales " * output_tokens
    messages = (
        Message(role="user", content=f"Please do step ROUND-{index}."),
        Message(role="assistant", content=f'{{"code": "print({index})"}}'),
        Message(role="user", content=output),
    )
    return RoundMessages(index=index, messages=messages, fold_pieces=(FoldPiece(f"Asked ROUND-{index}", essential=True), FoldPiece(output)), requests=(0,))


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer(server_kind="openai") as srv:
        srv.set_default("compression", summary)
        for role, reply in ROLE_REPLIES.items():
            srv.set_default(role, reply)
        yield srv


def config(server: ScriptedServer, *, window: int = 8000, reserve: int | None = None, **sections: dict[str, Any]) -> Config:
    data: dict[str, Any] = {
        "llm": {"api_base": server.url, "api_key": "test", "context_window": window, "reply_reserve": reserve, "max_retries": 0},
        "round_compressor": {"retry_backoff": 0.0, "rounds_to_compress": 1, "rounds_to_retain": 1},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return Config.model_validate(data)


def play(cfg: Config, role: str, rounds: Sequence[RoundMessages]) -> None:
    """Each round as a session plays it: the role's prompt sent for the round, then the round finished and folded."""
    model = OpenAIChatModel(cfg.llm)
    try:
        model.scope_cache("test")
        live = LiveVariables if role == "code_generator" else None
        ctx = RoleContext(ContextSettings.of(cfg, role), model=model, tokenizer=TOKENIZER, live_variables=live)
        history: list[RoundMessages] = []
        for rnd in rounds:
            built = ctx.build(system=SYSTEMS[role], examples=EXAMPLES, history=history, current=rnd)
            model.complete(built.messages, purpose=role, max_tokens=200)
            history.append(rnd)
            ctx.round_finished(history)
            assert ctx.wait_idle(10)
    finally:
        model.close()


def folds_with_previous(requests: Sequence[ScriptedRequest], role: str) -> list[tuple[ScriptedRequest, ScriptedRequest]]:
    """Each fold call with the role's request sent just before it."""
    pairs, previous = [], None
    for request in requests:
        if request.role == role:
            previous = request
        elif request.role == "compression" and previous is not None:
            pairs.append((request, previous))
    return pairs


@pytest.mark.parametrize("role", ["planner", "code_generator"])
@pytest.mark.parametrize("retain", [1, 2])
def test_a_fold_is_its_roles_previous_prompt_cut_before_the_rounds_it_keeps_then_the_summary_request(server: ScriptedServer, role: str, retain: int) -> None:
    cfg = config(server, round_compressor={"rounds_to_retain": retain})
    play(cfg, role, [make_round(i) for i in range(1, 7)])
    pairs = folds_with_previous(server.requests, role)
    assert len(pairs) >= 3, f"precondition: the {role} folded several times ({len(pairs)} folds)"
    for fold, previous in pairs:
        *head, ask = fold.messages
        assert head == previous.messages[: len(head)], "the fold's prompt is not its role's previous prompt, byte for byte"
        kept = previous.messages[len(head) :]
        newest = max(marks(str(previous.messages[-1]["content"])))
        # What the role's prompt goes on with after the fold's part: the rounds the fold keeps, and only those.
        assert marks("\n".join(str(m["content"]) for m in kept)) == set(range(newest - retain + 1, newest + 1))
        assert ask["role"] == "user" and "ConversationSummary" in str(ask["content"]), "the fold's last message does not ask for the summary"
        fold_text = "\n".join(str(m["content"]) for m in fold.messages)
        assert not marks(fold_text) & set(range(newest - retain + 1, newest + 1)), "a kept round reached the fold"
        assert fold.body["prompt_cache_key"] == previous.body["prompt_cache_key"], "the fold is not sent with its role's cache key"


def test_the_folds_of_a_role_on_llama_cpp_take_the_roles_slot() -> None:
    with ScriptedServer(server_kind="llama.cpp", slots=4) as srv:
        srv.set_default("compression", summary)
        srv.set_default("planner", ROLE_REPLIES["planner"])
        play(config(srv), "planner", [make_round(i) for i in range(1, 5)])
        pairs = folds_with_previous(srv.requests, "planner")
    assert pairs, "precondition: the Planner folded"
    # The first request learns the server's kind from its reply: hints are sent from the second on.
    assert all(fold.body.get("id_slot") == previous.body.get("id_slot") == 0 for fold, previous in pairs[1:])
    assert all(fold.body.get("cache_prompt") is True for fold, _ in pairs[1:])


def test_a_separate_fold_prompt_keeps_its_own_system_message_and_cache_key(server: ScriptedServer) -> None:
    cfg = config(server, planner={"fold_prompt": "separate"})
    play(cfg, "planner", [make_round(i) for i in range(1, 5)])
    pairs = folds_with_previous(server.requests, "planner")
    assert pairs
    for fold, previous in pairs:
        assert "ConversationSummary" in str(fold.messages[0]["content"]) and "init_plan" not in str(fold.messages[0]["content"])
        assert fold.body["prompt_cache_key"].endswith("/compression_planner") and previous.body["prompt_cache_key"].endswith("/planner")


def test_a_fold_that_would_not_fit_the_window_with_its_reply_goes_to_the_separate_prompt(server: ScriptedServer) -> None:
    # A reply reserve of 256 leaves the CodeGenerator's prompt most of a 4,000-token window; a fold of
    # that prompt up to round 1 with its instruction and its reply (notes and variable descriptions,
    # about 630 tokens) would pass the window, so the separate prompt takes round 1, cut to size.
    rounds = [make_round(1, output_tokens=3_150), make_round(2, output_tokens=1)]
    play(config(server, window=4000, reserve=256), "code_generator", rounds)
    folds = [r for r in server.requests if r.role == "compression"]
    assert len(folds) == 1
    assert "ConversationSummary" in str(folds[0].messages[0]["content"]), "the fold did not fall back to the separate prompt"
    assert folds[0].body["prompt_cache_key"].endswith("/compression_code_generator"), (
        "a fold on the separate prompt shares nothing with its role's prompt but was sent with the role's cache key"
    )
    assert not overflows(server.requests, window=4000)
    # With the default reserve the same rounds fold in the role's prompt: the check above is the fit, not the rounds.
    with ScriptedServer() as roomy:
        roomy.set_default("compression", summary)
        roomy.set_default("code_generator", ROLE_REPLIES["code_generator"])
        play(config(roomy, window=4000), "code_generator", rounds)
        fold = next(r for r in roomy.requests if r.role == "compression")
    assert "reply_content" in str(fold.messages[0]["content"]) and "ConversationSummary" in str(fold.messages[-1]["content"])
    assert fold.body["prompt_cache_key"].endswith("/code_generator")


def test_a_fold_on_the_separate_prompt_never_takes_its_roles_llama_cpp_slot() -> None:
    # The same fallback as above on a llama.cpp server with four slots: in the role's slot the fold
    # would evict the role's prefix, which the role's next request needs.
    rounds = [make_round(1, output_tokens=3_150), make_round(2, output_tokens=1)]
    with ScriptedServer(server_kind="llama.cpp", slots=4) as srv:
        srv.set_default("compression", summary)
        srv.set_default("code_generator", ROLE_REPLIES["code_generator"])
        play(config(srv, window=4000, reserve=256), "code_generator", rounds)
        roles = [r for r in srv.requests if r.role == "code_generator"]
        fold = next(r for r in srv.requests if r.role == "compression")
    assert "ConversationSummary" in str(fold.messages[0]["content"]), "precondition: the fold fell back to the separate prompt"
    assert all(r.body.get("id_slot") == 1 for r in roles[1:]), "the CodeGenerator lost its slot"
    assert fold.body.get("id_slot") not in (0, 1), f"the separate fold took a role's slot: {fold.body.get('id_slot')}"


@pytest.mark.kernel
@pytest.mark.parametrize("schedule", ["rounds", "pressure"])
def test_every_request_and_fold_of_a_session_fits_the_window_at_8k(tmp_path: Path, schedule: str) -> None:
    role = {"fold_schedule": schedule}
    # The default reply reserve (a quarter of the window), as a new user has it; the soak test's own is 4,096.
    run = run_soak(tmp_path, rounds=24, window=8000, settings={"llm": {"reply_reserve": None}, "planner": role, "code_generator": role})
    assert not run.failed_rounds, run.failed_rounds
    folds = [r for r in run.requests if r.role == "compression"]
    schema_words = ("init_plan", "reply_content")  # the role's own system message names its schema
    asks_last = [r for r in folds if "ConversationSummary" in str(r.messages[-1]["content"])]
    in_role_prompt = [r for r in asks_last if any(word in str(r.messages[0]["content"]) for word in schema_words)]
    assert folds and len(in_role_prompt) == len(folds), f"{len(folds) - len(in_role_prompt)} of {len(folds)} folds went to the separate prompt"
    over = overflows(run.requests, window=8000)  # prompt as received + max_tokens as sent, per request on the wire
    assert not over, "\n".join(over[:5])
