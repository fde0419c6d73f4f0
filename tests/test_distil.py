"""A session distilled into tips: the record the model reads fits a small window, newest requests first; its reply is read tolerantly."""

from __future__ import annotations

import json
from contextlib import closing

import pytest

from taskweaver_lite.config.settings import LLMConfig
from taskweaver_lite.errors import ExperienceError
from taskweaver_lite.knowledge.distil import distil
from taskweaver_lite.llm.client import OpenAIChatModel
from taskweaver_lite.llm.tokens import get_tokenizer
from taskweaver_lite.records.conversation import Post, Round
from taskweaver_lite.records.execution import ExecutionResult
from taskweaver_lite.records.model_calls import Message
from taskweaver_lite.testing.scripted_server import ScriptedServer

pytestmark = pytest.mark.unit


def long_round(index: int) -> Round:
    """A finished request whose cell printed ~1,500 tokens."""
    printed = " ".join(f"row{index}_{n}" for n in range(700))
    cell = ExecutionResult(code="print(table)", success=True, stdout=printed)
    posts = [
        Post(send_from="User", send_to="Planner", message=f"request number {index}: summarise the sales"),
        Post(send_from="Planner", send_to="CodeInterpreter", message="Print the table."),
        Post(send_from="CodeInterpreter", send_to="Planner", message="Ran.", code="print(table)", execution=cell),
        Post(send_from="Planner", send_to="User", message=f"Answer {index}."),
    ]
    return Round(index=index, user_query=f"request number {index}", posts=posts, state="finished")


def test_the_record_of_a_long_session_fits_an_8k_window_keeping_the_newest_requests(server: ScriptedServer) -> None:
    llm = LLMConfig(api_base=server.url, api_key="k", model="scripted", context_window=8000, stream=False)
    server.enqueue("other", json.dumps({"tips": [{"kind": "Preference", "text": "  The user wants   summaries.  "}]}))
    with closing(OpenAIChatModel(llm)) as model:
        tips = distil([long_round(n) for n in range(1, 21)], model=model, tokenizer=get_tokenizer(), llm=llm)
    assert tips == [("preference", "The user wants summaries.")], "kinds are read in any letter case, text with its spaces tidied"
    request = server.requests[-1]
    sent = get_tokenizer().count_messages([Message(role=m["role"], content=m["content"]) for m in request.messages])
    assert sent + request.body["max_tokens"] <= 8000, f"prompt {sent} + reply {request.body['max_tokens']} passes the window"
    record = request.messages[-1]["content"]
    assert "request number 20" in record and "request number 1:" not in record
    assert "earlier ones left out to fit" in record


def test_a_reply_with_a_tip_of_an_unknown_kind_is_refused_and_says_which(server: ScriptedServer) -> None:
    llm = LLMConfig(api_base=server.url, api_key="k", model="scripted", context_window=8000, stream=False)
    server.enqueue("other", json.dumps({"tips": [{"kind": "gossip", "text": "x"}]}))
    with closing(OpenAIChatModel(llm)) as model, pytest.raises(ExperienceError, match="error_resolution, preference"):
        distil([long_round(1)], model=model, tokenizer=get_tokenizer(), llm=llm)
