"""The scripted OpenAI-compatible server: role detection, per-role queues, responders, defaults,
loud failures when the script runs out, and the HTTP details the SDK relies on."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from taskweaver_lite.config.settings import LLMConfig
from taskweaver_lite.errors import LLMError, LLMUnreachableError
from taskweaver_lite.llm.client import OpenAIChatModel
from taskweaver_lite.llm.replies import CODE_GENERATOR_SCHEMA, PLANNER_SCHEMA, SUMMARY_SCHEMA, parse_reply
from taskweaver_lite.records.model_calls import Message
from taskweaver_lite.testing.scripted_server import (
    Reply,
    ScriptedServer,
    code_reply,
    detect_role,
    last_user_text,
    planner_reply,
    summary_reply,
    text_reply,
)

pytestmark = pytest.mark.unit

PLANNER_SYSTEM = "You are the Planner. Reply with init_plan, plan, current_plan_step, send_to, message."
CODER_SYSTEM = "You write Python. Reply with thought, reply_type and reply_content."
SUMMARY_SYSTEM = 'Summarise the rounds as {"ConversationSummary": ..., "Variables": [...]}.'


def call(system: str, user: str) -> list[Message]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


@pytest.fixture
def model(server: ScriptedServer) -> Iterator[OpenAIChatModel]:
    client = OpenAIChatModel(LLMConfig(api_base=server.url, timeout=5.0, max_retries=0))
    yield client
    client.close()


def post(server: ScriptedServer, body: dict[str, Any]) -> urllib.request.Request:
    return urllib.request.Request(
        f"{server.url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )


def test_role_is_read_from_the_schema_words_of_the_system_message() -> None:
    assert detect_role(call(PLANNER_SYSTEM, "hi")) == "planner"
    assert detect_role(call(CODER_SYSTEM, "hi")) == "code_generator"
    assert detect_role(call(SUMMARY_SYSTEM, "hi")) == "compression"
    assert detect_role(call("You are a helpful assistant.", "hi")) == "other"
    parts = [{"role": "system", "content": [{"type": "text", "text": "use reply_content"}]}]
    assert detect_role(parts) == "code_generator"


def test_each_role_answers_from_its_own_queue_in_order(server: ScriptedServer, model: OpenAIChatModel) -> None:
    server.enqueue("planner", "first plan", "second plan")
    server.enqueue("code_generator", "the code")
    assert model.complete(call(CODER_SYSTEM, "write it"), purpose="code_generator").text == "the code"
    assert model.complete(call(PLANNER_SYSTEM, "go"), purpose="planner").text == "first plan"
    assert model.complete(call(PLANNER_SYSTEM, "go on"), purpose="planner").text == "second plan"
    assert [request.role for request in server.requests] == ["code_generator", "planner", "planner"]
    assert server.requests[2].messages == call(PLANNER_SYSTEM, "go on")
    assert server.remaining("planner") == 0


def test_responder_reads_the_prompt_it_answers(server: ScriptedServer, model: OpenAIChatModel) -> None:
    server.enqueue("planner", lambda messages: planner_reply(f"you said: {last_user_text(messages)}", send_to="User"))
    reply = model.complete(call(PLANNER_SYSTEM, "the total is 42"), purpose="planner").text
    assert parse_reply(reply, PLANNER_SCHEMA)["message"] == "you said: the total is 42"


def test_default_responder_answers_once_the_queue_is_empty(server: ScriptedServer, model: OpenAIChatModel) -> None:
    server.enqueue("compression", summary_reply("queued"))
    server.set_default("compression", lambda messages: summary_reply("default"))
    texts = [model.complete(call(SUMMARY_SYSTEM, "rounds"), purpose="compression").text for _ in range(3)]
    assert texts == [summary_reply("queued"), summary_reply("default"), summary_reply("default")]


def test_running_out_of_script_fails_loudly_naming_the_role(server: ScriptedServer, model: OpenAIChatModel) -> None:
    with pytest.raises(LLMError, match=r"HTTP 500: scripted server: no reply queued for role 'code_generator'"):
        model.complete(call(CODER_SYSTEM, "plot it"), purpose="code_generator")


def test_responder_that_raises_fails_loudly(server: ScriptedServer, model: OpenAIChatModel) -> None:
    def broken(messages: list[dict[str, Any]]) -> str:
        raise KeyError("plan")

    server.enqueue("planner", broken)
    with pytest.raises(LLMError, match=r"the responder for role 'planner' raised KeyError\('plan'\)"):
        model.complete(call(PLANNER_SYSTEM, "go"), purpose="planner")


def test_unknown_role_name_is_refused_when_scripting() -> None:
    with pytest.raises(ValueError, match=r"unknown role 'Planner'"):
        ScriptedServer().enqueue("Planner", "x")


def test_error_replies_ask_the_client_to_retry_after_ten_milliseconds(server: ScriptedServer) -> None:
    server.enqueue("planner", Reply(status=429, error_message="slow down"))
    request = post(server, {"model": "m", "messages": call(PLANNER_SYSTEM, "go")})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=5)
    assert caught.value.code == 429
    with caught.value as error:
        assert error.headers["retry-after-ms"] == "10"
        assert json.loads(error.read())["error"]["message"] == "slow down"


def stream_events(server: ScriptedServer, body: dict[str, Any]) -> list[str]:
    with urllib.request.urlopen(post(server, body), timeout=5) as response:
        assert response.headers["Content-Type"] == "text/event-stream"
        try:
            text = response.read().decode("utf-8")
        except http.client.IncompleteRead as cut:  # a cut stream: the connection closed before the last chunk
            text = cut.partial.decode("utf-8")
    return [line.removeprefix("data: ") for line in text.split("\n\n") if line]


def test_streaming_requests_get_reasoning_then_content_in_chunks_then_usage_and_done(server: ScriptedServer) -> None:
    server.enqueue("planner", Reply(content="abcdefghij", reasoning="hmm", chunk_chars=4))
    body = {"model": "m", "stream": True, "stream_options": {"include_usage": True}, "messages": call(PLANNER_SYSTEM, "go")}
    events = stream_events(server, body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert [d.get("reasoning_content") for d in deltas if "reasoning_content" in d] == ["hmm"]
    assert [d["content"] for d in deltas if d.get("content")] == ["abcd", "efgh", "ij"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] > 0


def test_a_cut_stream_ends_mid_reply_without_a_finish_or_done(server: ScriptedServer) -> None:
    server.enqueue("planner", Reply(content="abcdefghij", chunk_chars=4, cut_after=6))
    events = stream_events(server, {"model": "m", "stream": True, "messages": call(PLANNER_SYSTEM, "go")})
    chunks = [json.loads(event) for event in events]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "abcdef"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)


def test_models_endpoint_lists_the_served_model() -> None:
    with ScriptedServer(model="qwen2.5-coder", api_key="local-key") as server:
        request = urllib.request.Request(f"{server.url}/models", headers={"Authorization": "Bearer local-key"})
        with urllib.request.urlopen(request, timeout=5) as response:
            listing = json.loads(response.read())
        assert [entry["id"] for entry in listing["data"]] == ["qwen2.5-coder"]
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(f"{server.url}/models", timeout=5)
        with caught.value as error:
            assert error.code == 401


def test_usage_in_replies_grows_with_prompt_and_reply_length(server: ScriptedServer, model: OpenAIChatModel) -> None:
    server.enqueue("other", "short", "a much longer reply than the first one")
    small = model.complete(call("system", "hi"), purpose="other")
    large = model.complete(call("system", "hi " * 400), purpose="other")
    assert large.prompt_tokens > small.prompt_tokens + 250
    assert large.completion_tokens > small.completion_tokens


def test_stopped_server_is_down_even_for_a_client_with_a_kept_alive_connection(server: ScriptedServer, model: OpenAIChatModel) -> None:
    server.enqueue("planner", "first", "never sent")
    assert model.complete(call(PLANNER_SYSTEM, "go"), purpose="planner").text == "first"
    server.stop()
    with pytest.raises(LLMUnreachableError, match=r"cannot reach the model endpoint at 127\.0\.0\.1:"):
        model.complete(call(PLANNER_SYSTEM, "go on"), purpose="planner")


def test_reply_helpers_build_json_the_product_schemas_accept() -> None:
    plan = parse_reply(planner_reply("Load sales.csv", plan="1. load\n2. report"), PLANNER_SCHEMA)
    assert plan == {
        "init_plan": "1. load\n2. report",
        "plan": "1. load\n2. report",
        "current_plan_step": "1. load",
        "send_to": "CodeInterpreter",
        "message": "Load sales.csv",
    }
    code = parse_reply(code_reply("print(1)"), CODE_GENERATOR_SCHEMA)
    assert (code["reply_type"], code["reply_content"]) == ("python", "print(1)")
    text = parse_reply(text_reply("No code needed."), CODE_GENERATOR_SCHEMA)
    assert (text["reply_type"], text["reply_content"]) == ("text", "No code needed.")
    variables = [{"name": "df", "type": "DataFrame", "description": "the sales table"}]
    assert parse_reply(summary_reply("Loaded the data.", variables), SUMMARY_SCHEMA) == {
        "ConversationSummary": "Loaded the data.",
        "Variables": variables,
    }
    assert "Variables" not in json.loads(summary_reply("Loaded the data."))


def test_streams_are_chunked_on_a_connection_kept_for_the_next_request(server: ScriptedServer) -> None:
    # As OpenAI and vLLM stream: the SDK's pool reuses the connection instead of opening one per call.
    server.set_default("planner", Reply(content="abcdefghij", chunk_chars=4))
    connection = http.client.HTTPConnection("127.0.0.1", int(server.url.rsplit(":", 1)[1].split("/")[0]), timeout=5)
    body = json.dumps({"model": "m", "stream": True, "messages": call(PLANNER_SYSTEM, "go")})
    for _ in range(2):
        connection.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.getheader("Transfer-Encoding") == "chunked"
        assert response.read().decode("utf-8").rstrip().endswith("data: [DONE]")
        assert not response.will_close
    connection.close()
