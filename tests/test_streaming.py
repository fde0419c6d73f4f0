"""Streamed replies over the real openai client: pieces as they come, reasoning apart, cut streams retried."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from taskweaver_lite.config.settings import LLMConfig
from taskweaver_lite.errors import LLMError
from taskweaver_lite.llm.client import OpenAIChatModel
from taskweaver_lite.records.model_calls import Delta, Message
from taskweaver_lite.testing.scripted_server import Reply, ScriptedServer, planner_reply

pytestmark = pytest.mark.unit

CALL: list[Message] = [
    {"role": "system", "content": "Answer in JSON with init_plan, plan, current_plan_step, send_to, message."},
    {"role": "user", "content": "How many rows?"},
]


@pytest.fixture
def client(server: ScriptedServer) -> Iterator[OpenAIChatModel]:
    model = OpenAIChatModel(config_for(server))
    yield model
    model.close()


def config_for(server: ScriptedServer, **changes: Any) -> LLMConfig:
    settings: dict[str, Any] = {"api_base": server.url, "api_key": "sk-test-key", "model": "m", "timeout": 5.0}
    return LLMConfig(**{**settings, **changes})


def test_a_streamed_reply_arrives_in_pieces_and_whole_with_its_usage(server: ScriptedServer, client: OpenAIChatModel) -> None:
    reply = planner_reply("There are 42 rows.", send_to="User")
    server.enqueue("planner", Reply(content=reply, chunk_chars=10))
    deltas: list[Delta] = []
    completion = client.complete(CALL, purpose="planner", on_delta=deltas.append)
    assert completion.text == reply
    assert completion.finish_reason == "stop" and completion.usage_reported and completion.completion_tokens > 0
    assert deltas[0] == Delta("start")
    assert "".join(d.text for d in deltas if d.kind == "content") == reply
    assert len([d for d in deltas if d.kind == "content"]) == -(-len(reply) // 10)
    [request] = server.requests
    assert request.body["stream"] is True and request.body["stream_options"] == {"include_usage": True}


def test_reasoning_content_is_shown_apart_and_never_part_of_the_reply(server: ScriptedServer, client: OpenAIChatModel) -> None:
    reply = planner_reply("done", send_to="User")
    server.enqueue("planner", Reply(content=reply, reasoning="Let me think {not json"))
    deltas: list[Delta] = []
    assert client.complete(CALL, purpose="planner", on_delta=deltas.append).text == reply
    assert "".join(d.text for d in deltas if d.kind == "reasoning") == "Let me think {not json"


def test_a_stream_cut_mid_json_is_retried_and_the_shown_text_is_voided(server: ScriptedServer, client: OpenAIChatModel) -> None:
    reply = planner_reply("the full answer", send_to="User")
    server.enqueue("planner", Reply(content=reply, cut_after=20, chunk_chars=8), Reply(content=reply))
    deltas: list[Delta] = []
    assert client.complete(CALL, purpose="planner", on_delta=deltas.append).text == reply
    starts = [i for i, d in enumerate(deltas) if d.kind == "start"]
    assert len(starts) == 2 and len(server.requests) == 2
    assert "".join(d.text for d in deltas[starts[0] : starts[1]]) == reply[:20]
    assert "".join(d.text for d in deltas[starts[1] :]) == reply


def test_a_stream_cut_on_every_try_fails_with_a_message_for_the_user(server: ScriptedServer) -> None:
    model = OpenAIChatModel(config_for(server, max_retries=1))
    server.set_default("planner", Reply(content=planner_reply("x"), cut_after=5))
    with pytest.raises(LLMError, match=r"broke off its streamed reply after 5 characters( \(\w+\))? \(after 1 retry\)"):
        model.complete(CALL, purpose="planner")
    model.close()


def test_with_stream_off_the_request_does_not_stream_and_no_pieces_are_sent(server: ScriptedServer) -> None:
    model = OpenAIChatModel(config_for(server, stream=False))
    server.enqueue("planner", planner_reply("hi", send_to="User"))
    deltas: list[Delta] = []
    assert model.complete(CALL, purpose="planner", on_delta=deltas.append).text == planner_reply("hi", send_to="User")
    assert deltas == [] and "stream" not in server.requests[0].body
    model.close()


def test_pieces_reach_the_caller_while_the_server_is_still_sending(server: ScriptedServer, client: OpenAIChatModel) -> None:
    gate = threading.Event()
    reply = planner_reply("first words then the rest", send_to="User")
    server.enqueue("planner", Reply(content=reply, chunk_chars=30, gate=gate, gate_after=30))
    seen = threading.Event()

    def watch(delta: Delta) -> None:
        if delta.kind == "content":
            seen.set()

    worker = threading.Thread(target=client.complete, args=(CALL,), kwargs={"purpose": "planner", "on_delta": watch})
    worker.start()
    assert seen.wait(5), "no piece arrived while the server held the rest of the reply"
    time.sleep(0.05)
    assert worker.is_alive()  # the reply is not complete yet
    gate.set()
    worker.join(5)


def test_an_endpoint_that_refuses_stream_options_is_asked_again_without_them(server: ScriptedServer, client: OpenAIChatModel) -> None:
    reply = planner_reply("fine", send_to="User")
    server.enqueue("planner", Reply(status=400, error_message="Unrecognized request argument: stream_options"), reply)
    completion = client.complete(CALL, purpose="planner")
    assert completion.text == reply and not completion.usage_reported  # no options, no usage numbers
    assert ["stream_options" in r.body for r in server.requests] == [True, False]
