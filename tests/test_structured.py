"""`llm.structured`: replies constrained to each role's schema, sent as `response_format` where the
endpoint takes it, stepping down for the session under `auto`, and the older `json_mode` read as its alias.

The schemas sent are the parser's own (`replies.json_schema`): what a server constrained to them can
write, the parser reads, and what the parser refuses, they refuse. Checked with `jsonschema`, a
validator nobody here wrote.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from helpers import make_project

from taskweaver_lite.config.file import load_config
from taskweaver_lite.config.settings import LLMConfig
from taskweaver_lite.errors import ConfigError, LLMError, ReplyFormatError
from taskweaver_lite.eval.scoring import VERDICT_SCHEMA
from taskweaver_lite.knowledge.distil import DISTIL_SCHEMA
from taskweaver_lite.llm.client import OpenAIChatModel, RoutedModel
from taskweaver_lite.llm.replies import CODE_GENERATOR_SCHEMA, SUMMARY_SCHEMA, ReplySchema, json_schema, parse_reply, planner_schema
from taskweaver_lite.records.model_calls import Message
from taskweaver_lite.session.assembly import open_session
from taskweaver_lite.testing.scripted_server import Reply, ScriptedServer, code_reply, planner_reply, summary_reply, text_reply

pytestmark = pytest.mark.unit

PLANNER = planner_schema(("User", "CodeInterpreter"))
CALL: list[Message] = [{"role": "system", "content": "Answer in JSON: init_plan, plan, ..."}, {"role": "user", "content": "How many rows?"}]
CODER_CALL: list[Message] = [{"role": "system", "content": "Answer in JSON: thought, reply_type, reply_content."}, {"role": "user", "content": "Count them."}]
EVERY_SCHEMA = (PLANNER, CODE_GENERATOR_SCHEMA, SUMMARY_SCHEMA, DISTIL_SCHEMA, VERDICT_SCHEMA)


@pytest.fixture
def models() -> Iterator[list[OpenAIChatModel]]:
    made: list[OpenAIChatModel] = []
    yield made
    for model in made:
        model.close()


def client(server: ScriptedServer, made: list[OpenAIChatModel], **settings: Any) -> OpenAIChatModel:
    made.append(OpenAIChatModel(LLMConfig(api_base=server.url, api_key="test-key", model="scripted", timeout=5.0, max_retries=0, **settings)))
    return made[-1]


def sent_formats(server: ScriptedServer) -> list[str | None]:
    return [request.body.get("response_format", {}).get("type") for request in server.requests]


def objects_in(schema: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if schema.get("type") == "object" or "object" in schema.get("type", ()):
        yield schema
    for value in schema.get("properties", {}).values():
        yield from objects_in(value)
    if isinstance(schema.get("items"), dict):
        yield from objects_in(schema["items"])


@pytest.mark.parametrize("schema", EVERY_SCHEMA, ids=lambda s: s.name)
def test_every_reply_schema_is_strict_every_field_required_and_no_other_key(schema: ReplySchema) -> None:
    described = json_schema(schema)
    jsonschema.Draft202012Validator.check_schema(described)
    for obj in objects_in(described):
        assert obj["additionalProperties"] is False, f"{schema.name}: an object that allows other keys (strict mode refuses it)"
        assert obj["required"] == list(obj["properties"]), f"{schema.name}: strict mode wants every property required, in order"


@pytest.mark.parametrize(
    ("schema", "reply"),
    [
        (PLANNER, planner_reply("Count the rows.")),
        (PLANNER, planner_reply("There are 288.", send_to="User")),
        (CODE_GENERATOR_SCHEMA, code_reply("print(len(df))")),
        (CODE_GENERATOR_SCHEMA, text_reply("No code is needed.")),
        (SUMMARY_SCHEMA, json.dumps({"ConversationSummary": "Loaded sales.", "Variables": None})),
        (SUMMARY_SCHEMA, summary_reply("Loaded sales.", [{"name": "df", "type": "DataFrame", "description": "sales"}])),
        (DISTIL_SCHEMA, json.dumps({"tips": [{"kind": "error_resolution", "text": "Parse dates first."}]})),
        (VERDICT_SCHEMA, json.dumps({"reason": "It says 288.", "is_hit": "yes"})),
    ],
)
def test_what_the_schema_allows_the_parser_reads(schema: ReplySchema, reply: str) -> None:
    jsonschema.validate(json.loads(reply), json_schema(schema))
    parse_reply(reply, schema)


@pytest.mark.parametrize(
    ("schema", "reply"),
    [
        (PLANNER, planner_reply("Ask someone else.", send_to="Reviewer")),  # not an enabled role
        (PLANNER, json.dumps({"response": {"plan": "1. count", "send_to": "User", "message": "hi"}})),  # fields missing
        (CODE_GENERATOR_SCHEMA, json.dumps({"response": {"thought": "t", "reply_type": "shell", "reply_content": "ls"}})),
        (SUMMARY_SCHEMA, json.dumps({"Variables": []})),
        (DISTIL_SCHEMA, json.dumps({"tips": [{"kind": "anything", "text": "x"}]})),
    ],
)
def test_what_the_parser_refuses_the_schema_refuses(schema: ReplySchema, reply: str) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads(reply), json_schema(schema))
    with pytest.raises(ReplyFormatError, match=r"must be one of|missing"):
        parse_reply(reply, schema)


def test_the_planners_send_to_takes_exactly_the_enabled_roles() -> None:
    schema = json_schema(planner_schema(("User", "CodeInterpreter", "DocumentRetriever")))
    assert schema["properties"]["response"]["properties"]["send_to"] == {"type": "string", "enum": ["User", "CodeInterpreter", "DocumentRetriever"]}


def test_auto_sends_the_callers_schema_and_a_prose_call_goes_unconstrained(server: ScriptedServer, models: list[OpenAIChatModel]) -> None:
    server.enqueue("planner", planner_reply("hi", send_to="User"), "A prose answer.")
    model = client(server, models)
    model.complete(CALL, purpose="planner", schema=PLANNER)
    model.complete(CALL, purpose="planner")
    first, prose = (request.body for request in server.requests)
    assert first["response_format"] == {"type": "json_schema", "json_schema": {"name": "Planner", "strict": True, "schema": json_schema(PLANNER)}}
    assert "response_format" not in prose, "a call that reads no JSON is never constrained"


@pytest.mark.parametrize(("setting", "sent"), [("json_schema", "json_schema"), ("json_object", "json_object"), ("off", None)])
def test_each_setting_sends_its_own_format(setting: str, sent: str | None, server: ScriptedServer, models: list[OpenAIChatModel]) -> None:
    server.enqueue("code_generator", code_reply("print(1)"))
    client(server, models, structured=setting).complete(CODER_CALL, purpose="code_generator", schema=CODE_GENERATOR_SCHEMA)
    assert sent_formats(server) == [sent]


def test_auto_steps_down_to_json_object_then_to_none_and_keeps_to_it_for_the_session(server: ScriptedServer, models: list[OpenAIChatModel]) -> None:
    server.enqueue(
        "planner",
        Reply(status=400, error_message="Invalid parameter: 'response_format' of type 'json_schema' is not supported with this model."),
        Reply(status=400, error_message="response_format json_object is not supported"),
        planner_reply("first", send_to="User"),
        planner_reply("second", send_to="User"),
    )
    model = client(server, models)
    assert json.loads(model.complete(CALL, purpose="planner", schema=PLANNER).text)["response"]["message"] == "first"
    model.complete(CALL, purpose="planner", schema=PLANNER)
    assert sent_formats(server) == ["json_schema", "json_object", None, None]
    assert model.response_format.level == "off"


def test_auto_steps_down_once_and_json_object_holds_when_accepted(server: ScriptedServer, models: list[OpenAIChatModel]) -> None:
    server.enqueue("planner", Reply(status=422, error_message="json_schema is not supported by this backend"), *[planner_reply("ok", send_to="User")] * 2)
    model = client(server, models)
    model.complete(CALL, purpose="planner", schema=PLANNER)
    model.complete(CALL, purpose="planner", schema=PLANNER)
    assert sent_formats(server) == ["json_schema", "json_object", "json_object"]


@pytest.mark.parametrize("setting", ["json_schema", "json_object"])
def test_an_explicit_setting_refused_is_an_error_naming_llm_structured(setting: str, server: ScriptedServer, models: list[OpenAIChatModel]) -> None:
    server.enqueue("planner", Reply(status=400, error_message=f"response_format {setting} is not supported"))
    with pytest.raises(LLMError, match=rf"does not accept response_format {setting} .*set llm\.structured to auto"):
        client(server, models, structured=setting).complete(CALL, purpose="planner", schema=PLANNER)
    assert len(server.requests) == 1, "an explicit setting is not stepped down behind the user's back"


def test_a_refusal_about_something_else_does_not_step_down(server: ScriptedServer, models: list[OpenAIChatModel]) -> None:
    server.enqueue("planner", Reply(status=400, error_message="temperature must be <= 2"))
    model = client(server, models)
    with pytest.raises(LLMError, match="temperature"):
        model.complete(CALL, purpose="planner", schema=PLANNER)
    assert model.response_format.level == "json_schema"


def test_each_roles_model_keeps_its_own_setting_and_its_own_step_down(models: list[OpenAIChatModel]) -> None:
    with ScriptedServer() as planning, ScriptedServer() as coding:
        planning.enqueue("planner", Reply(status=400, error_message="response_format json_schema unsupported"), planner_reply("ok", send_to="User"))
        coding.enqueue("code_generator", code_reply("print(1)"))
        routed = RoutedModel({"code_generator": client(coding, models, structured="json_schema")}, default=client(planning, models))
        routed.complete(CALL, purpose="planner", schema=PLANNER)
        routed.complete(CODER_CALL, purpose="code_generator", schema=CODE_GENERATOR_SCHEMA)
        assert (sent_formats(planning), sent_formats(coding)) == (["json_schema", "json_object"], ["json_schema"])


@pytest.mark.parametrize(
    ("llm", "expected"),
    [
        ({}, "auto"),
        ({"json_mode": True}, "auto"),
        ({"json_mode": False}, "off"),
        ({"structured": "json_object"}, "json_object"),
        ({"structured": False}, "off"),  # `structured: off` in YAML 1.1 is a boolean
        ({"structured": "json_schema", "json_mode": True}, "json_schema"),
        ({"structured": "off", "json_mode": False}, "off"),
    ],
)
def test_json_mode_is_the_older_name_of_structured(llm: dict[str, Any], expected: str) -> None:
    assert LLMConfig.model_validate(llm).structured == expected


def test_json_mode_and_structured_that_disagree_are_a_config_error_naming_both(tmp_path: Path) -> None:
    project = make_project(tmp_path, "http://127.0.0.1:9/v1", llm={"json_mode": False, "structured": "json_schema"})
    with pytest.raises(ConfigError, match=r"json_mode: false and structured: json_schema disagree"):
        load_config(project)


def test_a_role_sets_its_own_structured_over_the_top_level_one(tmp_path: Path) -> None:
    project = make_project(tmp_path, "http://127.0.0.1:9/v1", llm={"structured": "off"}, planner={"llm": {"structured": "json_schema"}})
    (project / "taskweaver_config.yaml").write_text(
        (project / "taskweaver_config.yaml").read_text(encoding="utf-8") + "code_generator:\n  llm: {structured: off}\n", encoding="utf-8"
    )
    config = load_config(project, ["round_compressor.llm.json_mode=true"])
    assert [config.llm_for(part).structured for part in ("planner", "code_generator", "round_compressor")] == ["json_schema", "off", "auto"]


@pytest.mark.kernel
def test_a_session_sends_each_calls_schema_and_the_same_prompts_whatever_the_setting(tmp_path: Path) -> None:
    """The schema travels beside the prompt: the messages of every call are the same under auto and off (the cached prefix too)."""
    sent: dict[str, list[tuple[str, list[dict[str, Any]], dict[str, Any] | None]]] = {}
    for setting in ("auto", "off"):
        with ScriptedServer() as server:
            server.enqueue("planner", planner_reply("Add two and two."), planner_reply("It is 4.", send_to="User"))
            server.enqueue("planner", planner_reply("Done.", send_to="User"))
            server.enqueue("code_generator", code_reply("print(2 + 2)"))
            server.set_default("compression", summary_reply("The user counted rows.", []))
            sections: dict[str, dict[str, object]] = {
                "llm": {"api_base": server.url, "api_key": "k", "model": "scripted", "structured": setting},
                "round_compressor": {"rounds_to_compress": 1, "rounds_to_retain": 1},
            }
            with open_session(load_config(make_project(tmp_path / setting, server.url, **sections))) as session:
                session.ask("What is 2 + 2?")
                session.ask("Thanks.")
                assert session.contexts()["planner"].wait_idle(timeout=20)
            sent[setting] = [(r.role, r.messages, r.body.get("response_format")) for r in server.requests]
    auto, off = sent["auto"], sent["off"]
    assert [(role, messages) for role, messages, _ in auto] == [(role, messages) for role, messages, _ in off], "the prompts differ by the setting"
    assert all(constraint is None for _, _, constraint in off)
    by_role = {role: constraint for role, _, constraint in auto}
    assert by_role["planner"] == {"type": "json_schema", "json_schema": {"name": "Planner", "strict": True, "schema": json_schema(PLANNER)}}
    assert by_role["code_generator"] is not None and by_role["code_generator"]["json_schema"]["schema"] == json_schema(CODE_GENERATOR_SCHEMA)
    assert "compression" in by_role, "no fold ran"
    assert by_role["compression"] is not None and by_role["compression"]["json_schema"]["schema"] == json_schema(SUMMARY_SCHEMA)
