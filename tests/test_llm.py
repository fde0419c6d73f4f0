"""The openai-SDK client against the scripted server: replies, usage, retries, and one clear error
per failure (wrong key, unreachable host, timeout, unknown model, rate limit...), hostile servers
included: cut-off and odd bodies, dripped replies, long Retry-After, credentials in the address."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from taskweaver_lite.config.settings import LLMConfig
from taskweaver_lite.errors import (
    LLMAuthError,
    LLMContextTooLongError,
    LLMError,
    LLMModelNotFoundError,
    LLMRateLimitError,
    LLMUnreachableError,
)
from taskweaver_lite.llm.client import DeltaSink, MeteredModel, ModelDefaults, OpenAIChatModel, RoutedModel
from taskweaver_lite.llm.replies import PLANNER_SCHEMA, ReplySchema, json_schema
from taskweaver_lite.records.model_calls import CallRecord, Completion, Message, Usage
from taskweaver_lite.testing.scripted_server import Reply, ScriptedServer, last_user_text, planner_reply

pytestmark = pytest.mark.unit

KEY = "sk-test-0123456789"
MODEL = "scripted-model"
PLANNER_CALL: list[Message] = [
    {"role": "system", "content": "Answer in JSON with init_plan, plan, current_plan_step, send_to, message."},
    {"role": "user", "content": "How many rows does sales.csv have?"},
]


@pytest.fixture(autouse=True)
def _no_openai_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer(model=MODEL, api_key=KEY) as running:
        yield running


class Recorded:
    """The client as a session uses it: metered, each call's record kept for the test to read."""

    def __init__(self, client: OpenAIChatModel, on_call: Callable[[CallRecord], None] | None = None) -> None:
        self.client = client
        self.calls: list[CallRecord] = []
        self._also = on_call
        self._meter = MeteredModel(client, on_call=self._seen)

    def _seen(self, record: CallRecord) -> None:
        self.calls.append(record)
        if self._also is not None:
            self._also(record)

    def complete(
        self, messages: Sequence[Message], *, purpose: str, max_tokens: int | None = None, on_delta: DeltaSink | None = None, schema: ReplySchema | None = None
    ) -> Completion:
        return self._meter.complete(messages, purpose=purpose, max_tokens=max_tokens, on_delta=on_delta, schema=schema)

    def usage(self) -> Usage:
        return self._meter.usage()


ModelFactory = Callable[..., Recorded]


@pytest.fixture
def make_model() -> Iterator[ModelFactory]:
    made: list[OpenAIChatModel] = []

    def make(config: LLMConfig, **kwargs: Any) -> Recorded:
        made.append(OpenAIChatModel(config))
        return Recorded(made[-1], **kwargs)

    yield make
    for model in made:
        model.close()


def config_for(server: ScriptedServer, **changes: Any) -> LLMConfig:
    settings: dict[str, Any] = {"api_base": server.url, "api_key": KEY, "model": MODEL, "timeout": 5.0}
    settings.update(changes)
    return LLMConfig(**settings)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_reply_text_and_token_usage_are_recorded_per_call(server: ScriptedServer, make_model: ModelFactory) -> None:
    seen: list[CallRecord] = []
    model = make_model(config_for(server), on_call=seen.append)
    server.enqueue("planner", planner_reply("There are 42 rows.", send_to="User"))

    completion = model.complete(PLANNER_CALL, purpose="planner")

    assert completion.text == planner_reply("There are 42 rows.", send_to="User")
    assert completion.finish_reason == "stop"
    assert completion.prompt_tokens > 0 and completion.completion_tokens > 0
    [record] = seen
    assert model.calls == [record]
    assert (record.purpose, record.ok, record.error, record.usage_reported) == ("planner", True, None, True)
    assert record.messages == tuple(PLANNER_CALL)
    assert record.reply == completion.text
    assert (record.prompt_tokens, record.completion_tokens) == (completion.prompt_tokens, completion.completion_tokens)
    totals = model.usage()
    assert (totals.calls, totals.failed_calls) == (1, 0)
    assert totals.total_tokens == completion.prompt_tokens + completion.completion_tokens


def test_request_carries_the_model_the_messages_and_the_reply_schema(server: ScriptedServer, make_model: ModelFactory) -> None:
    server.enqueue("planner", planner_reply("hi", send_to="User"))
    make_model(config_for(server)).complete(PLANNER_CALL, purpose="planner", schema=PLANNER_SCHEMA)
    [request] = server.requests
    assert request.role == "planner"
    assert request.body["model"] == MODEL
    assert request.messages == PLANNER_CALL
    assert request.body["response_format"] == {"type": "json_schema", "json_schema": {"name": "Planner", "strict": True, "schema": json_schema(PLANNER_SCHEMA)}}


def test_json_mode_off_sends_no_response_format(server: ScriptedServer, make_model: ModelFactory) -> None:
    server.enqueue("planner", planner_reply("hi", send_to="User"))
    make_model(config_for(server, json_mode=False)).complete(PLANNER_CALL, purpose="planner", schema=PLANNER_SCHEMA)
    assert "response_format" not in server.requests[0].body


def test_rate_limited_request_is_retried_then_succeeds(server: ScriptedServer, make_model: ModelFactory) -> None:
    model = make_model(config_for(server, max_retries=2))
    server.enqueue("planner", Reply(status=429), planner_reply("done", send_to="User"))
    assert model.complete(PLANNER_CALL, purpose="planner").text == planner_reply("done", send_to="User")
    assert len(server.requests) == 2
    assert [record.ok for record in model.calls] == [True]


def test_server_error_is_retried_then_succeeds(server: ScriptedServer, make_model: ModelFactory) -> None:
    model = make_model(config_for(server, max_retries=2))
    server.enqueue("planner", Reply(status=500), Reply(status=503), planner_reply("done", send_to="User"))
    assert model.complete(PLANNER_CALL, purpose="planner").text == planner_reply("done", send_to="User")
    assert len(server.requests) == 3


def test_rate_limit_that_outlasts_the_retries_raises_rate_limit_error(server: ScriptedServer, make_model: ModelFactory) -> None:
    model = make_model(config_for(server, max_retries=1))
    server.enqueue("planner", *[Reply(status=429, error_message="Slow down")] * 2)
    with pytest.raises(LLMRateLimitError, match=r"HTTP 429, after 1 retry\): Slow down"):
        model.complete(PLANNER_CALL, purpose="planner")
    [record] = model.calls
    assert not record.ok and record.error is not None and "429" in record.error
    assert model.usage().failed_calls == 1


def test_closed_port_raises_unreachable_naming_the_host(make_model: ModelFactory) -> None:
    port = closed_port()
    model = make_model(LLMConfig(api_base=f"http://127.0.0.1:{port}/v1", timeout=2.0, max_retries=0))
    with pytest.raises(LLMUnreachableError) as caught:
        model.complete(PLANNER_CALL, purpose="planner")
    assert f"127.0.0.1:{port}" in str(caught.value)
    assert "connection refused" in str(caught.value)


def test_reply_slower_than_the_timeout_raises_unreachable_saying_it_timed_out(server: ScriptedServer, make_model: ModelFactory) -> None:
    model = make_model(config_for(server, timeout=0.3, max_retries=0))
    server.enqueue("planner", Reply(content=planner_reply("late"), delay=3.0))
    with pytest.raises(LLMUnreachableError, match=r"did not answer within 0.3 s \(with retries off\)"):
        model.complete(PLANNER_CALL, purpose="planner")


def test_wrong_key_raises_auth_error_without_showing_the_key(server: ScriptedServer, make_model: ModelFactory) -> None:
    wrong = "sk-wrong-9876543210"
    model = make_model(config_for(server, api_key=wrong, max_retries=0))
    with pytest.raises(LLMAuthError) as caught:
        model.complete(PLANNER_CALL, purpose="planner")
    message = str(caught.value)
    host = server.url.removeprefix("http://").removesuffix("/v1")
    assert message == f"the API key was refused by {host}; check llm.api_key in taskweaver_config.yaml or the OPENAI_API_KEY environment variable"
    assert wrong not in message and wrong not in (model.calls[0].error or "")


def test_missing_key_for_the_openai_endpoint_names_both_ways_to_give_it() -> None:
    with pytest.raises(LLMAuthError) as caught:
        OpenAIChatModel(LLMConfig())
    assert "llm.api_key" in str(caught.value) and "OPENAI_API_KEY" in str(caught.value)


def test_local_server_needs_no_key(make_model: ModelFactory) -> None:
    with ScriptedServer() as keyless:
        keyless.enqueue("planner", planner_reply("hi", send_to="User"))
        model = make_model(LLMConfig(api_base=keyless.url, max_retries=0))
        assert model.complete(PLANNER_CALL, purpose="planner").text == planner_reply("hi", send_to="User")


def test_base_url_and_key_come_from_the_environment_when_not_configured(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch, make_model: ModelFactory
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    server.enqueue("planner", planner_reply("hi", send_to="User"))
    model = make_model(LLMConfig(model=MODEL, max_retries=0))
    assert model.complete(PLANNER_CALL, purpose="planner").text == planner_reply("hi", send_to="User")


def test_unknown_model_raises_model_not_found_naming_the_model(server: ScriptedServer, make_model: ModelFactory) -> None:
    model = make_model(config_for(server, model="llama-9000"))
    with pytest.raises(LLMModelNotFoundError, match=r"the model 'llama-9000' is not served by 127\.0\.0\.1:"):
        model.complete(PLANNER_CALL, purpose="planner")


def test_api_base_without_v1_raises_a_hint_about_the_path(server: ScriptedServer, make_model: ModelFactory) -> None:
    model = make_model(config_for(server, api_base=server.url.removesuffix("/v1"), max_retries=0))
    with pytest.raises(LLMError, match=r"check llm\.api_base.* \(for most servers it ends in /v1\)") as caught:
        model.complete(PLANNER_CALL, purpose="planner")
    assert not isinstance(caught.value, LLMModelNotFoundError)


def test_prompt_over_the_context_window_raises_context_too_long(server: ScriptedServer, make_model: ModelFactory) -> None:
    model = make_model(config_for(server))
    server.enqueue(
        "planner",
        Reply(status=400, error_message="This model's maximum context length is 8192 tokens, you sent 9000."),
    )
    with pytest.raises(LLMContextTooLongError, match=r"maximum context length is 8192 tokens.*llm\.context_window"):
        model.complete(PLANNER_CALL, purpose="planner")


def test_endpoint_rejecting_response_format_is_asked_again_with_less_and_that_is_remembered(server: ScriptedServer, make_model: ModelFactory) -> None:
    model = make_model(config_for(server, max_retries=0, json_mode=True))  # the older name of structured: auto
    refusal = Reply(status=400, error_message="response_format of type json_schema is not supported")
    server.enqueue("planner", refusal, planner_reply("first", send_to="User"), planner_reply("second", send_to="User"))
    assert model.complete(PLANNER_CALL, purpose="planner", schema=PLANNER_SCHEMA).text == planner_reply("first", send_to="User")
    assert model.complete(PLANNER_CALL, purpose="planner", schema=PLANNER_SCHEMA).text == planner_reply("second", send_to="User")
    sent = [request.body.get("response_format", {}).get("type") for request in server.requests]
    assert sent == ["json_schema", "json_object", "json_object"]


def test_endpoint_rejecting_response_format_even_without_it_suggests_turning_structured_off(server: ScriptedServer, make_model: ModelFactory) -> None:
    model = make_model(config_for(server, max_retries=0))
    refusal = Reply(status=400, error_message="response_format of type json_object is not supported")
    server.enqueue("planner", refusal, refusal, refusal)
    with pytest.raises(LLMError, match=r"--set llm\.structured=off"):
        model.complete(PLANNER_CALL, purpose="planner", schema=PLANNER_SCHEMA)


def test_other_http_errors_name_the_status_and_the_server_message(server: ScriptedServer, make_model: ModelFactory) -> None:
    model = make_model(config_for(server))
    server.enqueue("planner", Reply(status=422, error_message="temperature must be <= 2"))
    with pytest.raises(LLMError, match=r"answered HTTP 422: temperature must be <= 2$"):
        model.complete(PLANNER_CALL, purpose="planner")


def test_key_echoed_back_by_the_server_is_masked(server: ScriptedServer, make_model: ModelFactory) -> None:
    model = make_model(config_for(server))
    server.enqueue("planner", Reply(status=400, error_message=f"bad request from {KEY}"))
    with pytest.raises(LLMError) as caught:
        model.complete(PLANNER_CALL, purpose="planner")
    assert KEY not in str(caught.value) and "bad request from ***" in str(caught.value)


def test_reply_without_usage_counts_zero_tokens_and_is_marked(server: ScriptedServer, make_model: ModelFactory) -> None:
    model = make_model(config_for(server))
    server.enqueue("planner", Reply(content=planner_reply("hi", send_to="User"), include_usage=False))
    completion = model.complete(PLANNER_CALL, purpose="planner")
    assert (completion.prompt_tokens, completion.completion_tokens) == (0, 0)
    assert model.calls[0].usage_reported is False
    assert model.usage().calls_without_usage == 1


def test_truncated_reply_reports_finish_reason_length(server: ScriptedServer, make_model: ModelFactory) -> None:
    model = make_model(config_for(server))
    server.enqueue("planner", Reply(content='{"response": {"init_plan": "1. lo', finish_reason="length"))
    assert model.complete(PLANNER_CALL, purpose="planner").finish_reason == "length"


def test_concurrent_calls_from_threads_are_all_answered_and_recorded(server: ScriptedServer, make_model: ModelFactory) -> None:
    server.set_default("planner", lambda messages: planner_reply(last_user_text(messages), send_to="User"))
    model = make_model(config_for(server))
    answers: dict[int, str] = {}

    def ask(number: int) -> None:
        call: list[Message] = [PLANNER_CALL[0], {"role": "user", "content": f"question {number}"}]
        answers[number] = model.complete(call, purpose=f"compression_{number}").text

    threads = [threading.Thread(target=ask, args=(number,)) for number in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert answers == {n: planner_reply(f"question {n}", send_to="User") for n in range(8)}
    assert sorted(record.purpose for record in model.calls) == sorted(f"compression_{n}" for n in range(8))
    totals = model.usage()
    assert totals.calls == 8
    assert totals.prompt_tokens == sum(record.prompt_tokens for record in model.calls)


@pytest.mark.cli  # a fresh interpreter, started as a command: not the quick tier
def test_importing_the_module_does_not_import_the_sdk() -> None:
    code = "import sys, taskweaver_lite.llm.client; print('openai' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def completion_body(message: object, *, usage: object = None) -> str:
    """A chat completion body as a server might send it, with any `message` and `usage`."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
    if message is not None:
        choice["message"] = message
    body: dict[str, Any] = {"id": "x", "object": "chat.completion", "choices": [choice]}
    if usage is not None:
        body["usage"] = usage
    return json.dumps(body)


def test_a_reply_body_cut_off_is_retried_like_a_server_error(server: ScriptedServer, make_model: ModelFactory) -> None:
    model = make_model(config_for(server, max_retries=2))
    server.enqueue("planner", Reply(raw_body='{"choices": ['), planner_reply("done", send_to="User"))
    assert model.complete(PLANNER_CALL, purpose="planner").text == planner_reply("done", send_to="User")
    assert len(server.requests) == 2


def test_a_reply_body_cut_off_every_time_ends_in_one_line_naming_the_host(server: ScriptedServer, make_model: ModelFactory) -> None:
    model = make_model(config_for(server, max_retries=1))
    server.enqueue("planner", *[Reply(raw_body='{"choices": [')] * 2)
    with pytest.raises(LLMError) as caught:
        model.complete(PLANNER_CALL, purpose="planner")
    message = str(caught.value)
    assert "127.0.0.1:" in message and "not valid JSON (cut off?)" in message and "after 1 retry" in message
    assert "\n" not in message and len(server.requests) == 2
    assert model.calls[0].error == message


def test_content_sent_as_a_list_of_text_parts_is_joined(server: ScriptedServer, make_model: ModelFactory) -> None:
    model = make_model(config_for(server))
    server.enqueue("planner", Reply(content_parts=('{"response": ', '{"message": "hi"}}')))
    assert model.complete(PLANNER_CALL, purpose="planner").text == '{"response": {"message": "hi"}}'


def test_usage_numbers_sent_as_strings_are_read_and_unreadable_ones_tolerated(server: ScriptedServer, make_model: ModelFactory) -> None:
    model = make_model(config_for(server))
    message = {"role": "assistant", "content": "hi"}
    server.enqueue(
        "planner",
        Reply(raw_body=completion_body(message, usage={"prompt_tokens": "12", "completion_tokens": "3"})),
        Reply(raw_body=completion_body(message, usage={"prompt_tokens": "many", "completion_tokens": None})),
    )
    first = model.complete(PLANNER_CALL, purpose="planner")
    second = model.complete(PLANNER_CALL, purpose="planner")
    assert (first.prompt_tokens, first.completion_tokens, first.usage_reported) == (12, 3, True)
    assert (second.text, second.prompt_tokens, second.usage_reported) == ("hi", 0, False)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (None, "first choice has no message"),
        ("just a string", "first choice has no message"),
        ({"role": "assistant", "content": 42}, "message content that is int, not text"),
        ({"role": "assistant", "content": {"text": "hi"}}, "message content that is dict, not text"),
    ],
)
def test_a_choice_without_a_message_or_text_content_is_one_clear_line_not_retried(
    server: ScriptedServer, make_model: ModelFactory, message: object, expected: str
) -> None:
    model = make_model(config_for(server, max_retries=2))
    server.enqueue("planner", Reply(raw_body=completion_body(message)))
    with pytest.raises(LLMError, match=expected) as caught:
        model.complete(PLANNER_CALL, purpose="planner")
    assert "llm.api_base" in str(caught.value) and len(server.requests) == 1


def test_a_reply_dripped_a_byte_at_a_time_stops_at_the_timeout(server: ScriptedServer, make_model: ModelFactory) -> None:
    model = make_model(config_for(server, timeout=0.5, max_retries=0))
    server.enqueue("planner", Reply(content=planner_reply("slowly"), drip=0.05))
    started = time.monotonic()
    with pytest.raises(LLMUnreachableError, match=r"did not answer within 0.5 s \(with retries off\); .*llm\.timeout"):
        model.complete(PLANNER_CALL, purpose="planner")
    assert time.monotonic() - started < 1.5


def test_a_short_retry_after_is_waited_out(server: ScriptedServer, make_model: ModelFactory) -> None:
    model = make_model(config_for(server, timeout=2.0, max_retries=1))
    server.enqueue("planner", Reply(status=429, headers={"Retry-After": "0.4"}), planner_reply("done", send_to="User"))
    started = time.monotonic()
    assert model.complete(PLANNER_CALL, purpose="planner").text == planner_reply("done", send_to="User")
    assert time.monotonic() - started >= 0.4 and len(server.requests) == 2


def test_a_long_retry_after_is_refused_at_once_with_the_real_count_and_the_wait(server: ScriptedServer, make_model: ModelFactory) -> None:
    model = make_model(config_for(server, max_retries=2))
    server.enqueue("planner", Reply(status=429, headers={"Retry-After": "3600"}))
    started = time.monotonic()
    with pytest.raises(LLMRateLimitError) as caught:
        model.complete(PLANNER_CALL, purpose="planner")
    assert time.monotonic() - started < 1.0 and len(server.requests) == 1
    message = str(caught.value)
    assert "asks to wait 3,600 s" in message and "gave up after 1 request," in message and "llm.timeout" in message
    assert "retries" not in message


@pytest.mark.parametrize("address", ["http://alice:{secret}@127.0.0.1:{port}/v1", "http://127.0.0.1:{port}/v1?api-key={secret}"])
def test_credentials_inside_the_api_base_never_reach_an_error_message(make_model: ModelFactory, address: str) -> None:
    secret = "sk-url-secret-123456"
    for port in (closed_port(), None):  # unreachable, then a server that echoes the path it got
        with ScriptedServer() as keyless:
            real_port = port or int(keyless.url.split(":")[2].split("/")[0])
            model = make_model(LLMConfig(api_base=address.format(secret=secret, port=real_port), max_retries=0))
            with pytest.raises(LLMError) as caught:
                model.complete(PLANNER_CALL, purpose="planner")
        assert secret not in str(caught.value) and secret not in (model.calls[-1].error or "")
        assert secret not in model.client.url and secret not in model.client.host


def test_cached_prompt_tokens_are_read_from_openai_usage_details_and_llama_cpp_timings() -> None:
    from taskweaver_lite.llm.completions import cached_tokens

    assert cached_tokens({"prompt_tokens": 90, "prompt_tokens_details": {"cached_tokens": 64}}, None) == 64
    assert cached_tokens({"prompt_tokens": 90}, {"prompt_n": 26, "cache_n": 64}) == 64
    assert cached_tokens({"prompt_tokens": 90, "prompt_tokens_details": None}, None) == 0
    assert cached_tokens({}, {"cache_n": "oops"}) == 0


class Abilities(ModelDefaults):
    """A model that notes each optional ability it is asked for."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.asked: list[str] = []

    def complete(
        self, messages: Sequence[Message], *, purpose: str, max_tokens: int | None = None, on_delta: DeltaSink | None = None, schema: ReplySchema | None = None
    ) -> Completion:
        return Completion(model=self.name, text="ok", prompt_tokens=1, completion_tokens=1, latency=0.0)

    def model_name(self, purpose: str) -> str:
        return self.name

    def scope_cache(self, name: str) -> None:
        self.asked.append(f"scope {name}")

    def share_cache(self, purpose: str, owner: str) -> None:
        self.asked.append(f"share {purpose} {owner}")

    def close(self) -> None:
        self.asked.append("close")


def test_a_metered_or_routed_model_passes_every_ability_on_to_each_model_inside_once() -> None:
    inner = Abilities("big")
    metered = MeteredModel(inner)
    metered.scope_cache("s1")
    metered.share_cache("compression_planner", "planner")
    metered.close()
    assert metered.model_name("planner") == "big"
    assert inner.asked == ["scope s1", "share compression_planner planner", "close"], "the meter drops none of the model's abilities"
    small, big = Abilities("small"), Abilities("big")
    routed = RoutedModel({"planner": small, "code_generator": small}, default=big)
    routed.scope_cache("s2")
    routed.close()
    assert small.asked == big.asked == ["scope s2", "close"], "each distinct model is told once"
    assert (routed.model_name("planner"), routed.model_name("compression_planner")) == ("small", "big")
