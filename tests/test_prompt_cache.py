"""Cache hints on the wire, as each kind of server gets them, and the cached tokens each reply reports.

The scripted server plays OpenAI's API (`prompt_cache_key`, `usage.prompt_tokens_details.cached_tokens`),
llama.cpp's server (`cache_prompt`, `id_slot`, `timings.cache_n`, `GET /props`) and a strict server
that refuses a field it does not know (HTTP 400 naming it).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from taskweaver_lite.config.settings import LLMConfig
from taskweaver_lite.llm.client import MeteredModel, OpenAIChatModel, usage_by_purpose
from taskweaver_lite.records.model_calls import Message, Usage
from taskweaver_lite.testing.scripted_server import ScriptedServer, planner_reply

pytestmark = pytest.mark.unit

SYSTEM = "Answer in JSON with init_plan, plan, current_plan_step, send_to, message. " + "Plan carefully. " * 40
HINTS = ("prompt_cache_key", "cache_prompt", "id_slot")


def call(question: str) -> list[Message]:
    return [Message(role="system", content=SYSTEM), Message(role="user", content=question)]


@pytest.fixture(autouse=True)
def _no_openai_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


@pytest.fixture
def clients() -> Iterator[list[OpenAIChatModel]]:
    made: list[OpenAIChatModel] = []
    yield made
    for client in made:
        client.close()


def client_for(server: ScriptedServer, made: list[OpenAIChatModel], **settings: Any) -> OpenAIChatModel:
    config = LLMConfig.model_validate({"api_base": server.url, "api_key": "k", "model": "m", "max_retries": 0, **settings})
    client = OpenAIChatModel(config)
    made.append(client)
    return client


def sent_hints(server: ScriptedServer) -> list[dict[str, Any]]:
    """The cache fields of every request the server received, in order."""
    return [{name: r.body[name] for name in HINTS if name in r.body} for r in server.requests]


def ask_twice(model: Any, purposes: tuple[str, ...] = ("planner", "planner")) -> None:
    for n, purpose in enumerate(purposes):
        model.complete(call(f"question {n}"), purpose=purpose)


@pytest.mark.parametrize("stream", [True, False])
def test_an_openai_style_server_gets_a_cache_key_per_session_and_role_and_its_cached_tokens_are_counted(clients: list[OpenAIChatModel], stream: bool) -> None:
    with ScriptedServer() as server:
        server.set_default("planner", planner_reply("ok"))
        server.set_default("code_generator", planner_reply("ok"))
        client = client_for(server, clients, stream=stream)
        client.scope_cache("20260101-000000-abcdef")
        metered = MeteredModel(client)
        ask_twice(metered, ("planner", "code_generator", "planner"))
    assert sent_hints(server) == [
        {"prompt_cache_key": "taskweaver-lite/20260101-000000-abcdef/planner"},
        {"prompt_cache_key": "taskweaver-lite/20260101-000000-abcdef/code_generator"},
        {"prompt_cache_key": "taskweaver-lite/20260101-000000-abcdef/planner"},
    ]
    by_purpose = usage_by_purpose(metered.usage_by_model())
    planner = by_purpose["planner"]
    assert planner.cached_tokens > 0, "the second planner call shares the system message with the first: its server cached it"
    assert by_purpose["code_generator"].cached_tokens == 0, "a role's first call under its own key has nothing cached"
    assert planner.uncached_tokens == planner.prompt_tokens - planner.cached_tokens
    assert metered.usage().cached_tokens == planner.cached_tokens


def test_a_llama_cpp_server_found_by_discovery_gets_cache_prompt_and_a_slot_per_role(clients: list[OpenAIChatModel]) -> None:
    with ScriptedServer(server_kind="llama.cpp", slots=4) as server:
        server.set_default("planner", planner_reply("ok"))
        client = client_for(server, clients, server_kind="llama.cpp")
        metered = MeteredModel(client)
        ask_twice(metered, ("planner", "code_generator", "compression_planner", "compression_code_generator", "planner"))
    assert sent_hints(server) == [
        {"cache_prompt": True, "id_slot": 0},
        {"cache_prompt": True, "id_slot": 1},
        {"cache_prompt": True, "id_slot": 2},
        {"cache_prompt": True, "id_slot": 3},
        {"cache_prompt": True, "id_slot": 0},
    ]
    assert metered.usage().cached_tokens > 0, "llama.cpp's timings.cache_n is read as cached tokens"


def test_a_llama_cpp_server_is_recognised_by_its_timings_and_slots_beyond_its_count_are_never_named(clients: list[OpenAIChatModel]) -> None:
    with ScriptedServer(server_kind="llama.cpp", slots=2) as server:
        server.set_default("planner", planner_reply("ok"))
        client = client_for(server, clients, stream=False)
        ask_twice(client, ("planner", "planner", "code_generator", "compression_planner"))
    assert sent_hints(server) == [
        {"prompt_cache_key": "taskweaver-lite/session/planner"},  # not known yet: the first reply's timings tell
        {"cache_prompt": True, "id_slot": 0},
        {"cache_prompt": True, "id_slot": 1},
        {"cache_prompt": True},  # a third slot does not exist: it would wait for ever on llama.cpp
    ]


def test_one_slot_is_the_default_and_is_not_named(clients: list[OpenAIChatModel]) -> None:
    with ScriptedServer(server_kind="llama.cpp", slots=1) as server:
        server.set_default("planner", planner_reply("ok"))
        ask_twice(client_for(server, clients, server_kind="llama.cpp"))
    assert sent_hints(server) == [{"cache_prompt": True}, {"cache_prompt": True}]


def test_a_field_the_server_refuses_is_dropped_once_and_never_sent_again(clients: list[OpenAIChatModel]) -> None:
    with ScriptedServer(refuses=("prompt_cache_key",)) as server:
        server.set_default("planner", planner_reply("ok"))
        client = client_for(server, clients)
        ask_twice(client)
    statuses = [bool(hints) for hints in sent_hints(server)]
    assert statuses == [True, False, False], "one refused request, then the field is left out for good"
    assert len(server.requests) == 3, "the refused request is sent again at once, without the field"


def test_prompt_cache_off_sends_no_hint(clients: list[OpenAIChatModel]) -> None:
    with ScriptedServer(server_kind="llama.cpp") as server:
        server.set_default("planner", planner_reply("ok"))
        ask_twice(client_for(server, clients, prompt_cache="off", server_kind="llama.cpp"))
    assert sent_hints(server) == [{}, {}]


def test_the_api_address_alone_marks_openai_and_the_cache_line_reads_plainly() -> None:
    config = LLMConfig.model_validate({"api_base": "https://api.openai.com/v1", "api_key": "sk-x"})
    client = OpenAIChatModel(config)
    try:
        assert client.prompt_cache.kind == "openai"
        assert client.prompt_cache.hints("planner") == {"prompt_cache_key": "taskweaver-lite/session/planner"}
    finally:
        client.close()
    assert Usage(prompt_tokens=1200, cached_tokens=1000).cache_line() == "1,200 prompt tokens, 1,000 cached, 200 uncached"


def test_local_discovery_tells_the_client_which_hints_the_server_takes() -> None:
    from taskweaver_lite.config.settings import Config
    from taskweaver_lite.llm.discovery import LocalServer, use_local_server

    for name, kind in (("llama.cpp server", "llama.cpp"), ("Ollama", "other")):
        config = Config()
        use_local_server(config, [LocalServer(name=name, api_base="http://127.0.0.1:8080/v1", models=("qwen",))])
        assert config.llm.server_kind == kind
