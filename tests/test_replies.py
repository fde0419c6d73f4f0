"""Reading model replies: JSON found despite fences, prose, <think> blocks, slips and cuts;
schema checks whose messages say exactly what is wrong; the repair turn's wording."""

from __future__ import annotations

import json

import pytest

from taskweaver_lite.errors import ReplyFormatError
from taskweaver_lite.llm.replies import (
    CODE_GENERATOR_SCHEMA,
    PLANNER_SCHEMA,
    SUMMARY_SCHEMA,
    extract_json,
    parse_reply,
    repair_message,
)

pytestmark = pytest.mark.unit

CODE = {"response": {"thought": "load it", "reply_type": "python", "reply_content": "df = load()"}}
CODE_TEXT = json.dumps(CODE)
PLAN = {
    "init_plan": "1. load\n2. answer",
    "plan": "1. load\n2. answer",
    "current_plan_step": "1. load",
    "send_to": "CodeInterpreter",
    "message": "Load the file",
}


def test_plain_json_is_read_as_is() -> None:
    assert extract_json(CODE_TEXT) == CODE


def test_json_inside_a_json_code_fence_is_found() -> None:
    assert extract_json(f"Here it is:\n```json\n{CODE_TEXT}\n```\nDone.") == CODE


def test_json_inside_a_fence_without_language_is_found() -> None:
    assert extract_json(f"```\n{CODE_TEXT}\n```") == CODE


def test_python_fence_before_the_json_fence_is_not_taken_for_the_answer() -> None:
    text = f'```python\nd = {{"a": 1}}\n```\nand the reply:\n```json\n{CODE_TEXT}\n```'
    assert extract_json(text) == CODE


def test_think_block_with_braces_before_the_json_is_skipped() -> None:
    text = f'<think>I could use {{x}} or {{"a": 1}} here...</think>\n{CODE_TEXT}'
    assert extract_json(text) == CODE


def test_answer_after_a_closing_think_tag_without_opening_tag_is_found() -> None:
    assert extract_json(f'weighing {{"a": 1}} options</think>\n{CODE_TEXT}') == CODE


def test_reply_cut_off_inside_think_block_has_no_answer() -> None:
    with pytest.raises(ReplyFormatError, match=r"only a <think> block"):
        extract_json('<think>first I will {"response": {"thought": ')


def test_prose_before_and_after_the_json_is_ignored() -> None:
    assert extract_json(f"Sure! Here is my answer: {CODE_TEXT} Let me know {{anything}} else.") == CODE


def test_braces_in_prose_before_the_json_are_not_taken_for_the_answer() -> None:
    assert extract_json(f"Use {{}} or {{name}} placeholders. {CODE_TEXT}") == CODE


def test_trailing_commas_and_single_quotes_are_repaired() -> None:
    text = "{'response': {'thought': 'load it', 'reply_type': 'python', 'reply_content': 'df = load()',},}"
    assert extract_json(text) == CODE


def test_unquoted_keys_are_repaired() -> None:
    text = '{response: {thought: "load it", reply_type: "python", reply_content: "df = load()"}}'
    assert extract_json(text) == CODE


def test_truncated_json_keeps_what_was_written() -> None:
    text = '{"response": {"thought": "load it", "reply_type": "python", "reply_content": "df = lo'
    assert extract_json(text) == {"response": {"thought": "load it", "reply_type": "python", "reply_content": "df = lo"}}


def test_truncated_json_is_not_replaced_by_an_object_nested_inside_it() -> None:
    text = '{"response": {"thought": "t", "options": {"a": 1}, "reply_type": "python", "reply_content": "x = ('
    found = extract_json(text)
    assert found["response"]["options"] == {"a": 1}
    assert found["response"]["reply_content"] == "x = ("


def test_truncated_json_in_an_unclosed_fence_is_recovered() -> None:
    text = '```json\n{"ConversationSummary": "The user loaded sales.csv'
    assert extract_json(text) == {"ConversationSummary": "The user loaded sales.csv"}


def test_prose_without_json_is_reported_with_a_preview() -> None:
    with pytest.raises(ReplyFormatError, match=r"^the reply is not JSON: no JSON object found in 'I cannot help"):
        extract_json("I cannot help with that request.")


def test_empty_reply_is_reported_as_empty() -> None:
    with pytest.raises(ReplyFormatError, match=r"^the reply is not JSON: it is empty$"):
        extract_json("  \n")


def test_parse_reply_returns_the_unwrapped_object() -> None:
    assert parse_reply(CODE_TEXT, CODE_GENERATOR_SCHEMA) == CODE["response"]


def test_enumerated_values_match_regardless_of_case_and_spacing() -> None:
    text = json.dumps({"response": {**PLAN, "send_to": "code interpreter"}})
    assert parse_reply(text, PLANNER_SCHEMA)["send_to"] == "CodeInterpreter"
    text = json.dumps({"response": {**PLAN, "send_to": "user"}})
    assert parse_reply(text, PLANNER_SCHEMA)["send_to"] == "User"


def test_value_outside_the_allowed_set_names_the_field_the_choices_and_the_value() -> None:
    text = json.dumps({"response": {**PLAN, "send_to": "Planner"}})
    with pytest.raises(ReplyFormatError) as caught:
        parse_reply(text, PLANNER_SCHEMA)
    assert str(caught.value) == "field 'send_to' must be one of User, CodeInterpreter; got 'Planner'"


def test_missing_field_is_named() -> None:
    text = json.dumps({"response": {"thought": "t", "reply_type": "python"}})
    with pytest.raises(ReplyFormatError) as caught:
        parse_reply(text, CODE_GENERATOR_SCHEMA)
    assert str(caught.value) == "missing field 'reply_content'"


def test_every_problem_is_listed_at_once() -> None:
    text = json.dumps({"response": {"thought": {"a": 1}, "reply_type": "sql"}})
    with pytest.raises(ReplyFormatError) as caught:
        parse_reply(text, CODE_GENERATOR_SCHEMA)
    assert str(caught.value) == (
        "field 'thought' must be a string; got an object; field 'reply_type' must be one of python, text; got 'sql'; missing field 'reply_content'"
    )


def test_fields_at_the_top_level_are_accepted_without_the_wrapper() -> None:
    assert parse_reply(json.dumps(PLAN), PLANNER_SCHEMA) == PLAN


def test_fields_under_a_differently_named_wrapper_are_accepted() -> None:
    assert parse_reply(json.dumps({"reply": CODE["response"]}), CODE_GENERATOR_SCHEMA) == CODE["response"]


def test_object_without_any_schema_field_names_the_missing_wrapper() -> None:
    with pytest.raises(ReplyFormatError, match=r"missing the 'response' object: .* got keys answer"):
        parse_reply('{"answer": 42}', PLANNER_SCHEMA)


def test_wrapper_that_is_not_an_object_is_reported() -> None:
    with pytest.raises(ReplyFormatError, match=r"^'response' must be a JSON object; got a string$"):
        parse_reply('{"response": "done"}', CODE_GENERATOR_SCHEMA)


def test_json_that_is_not_an_object_is_reported() -> None:
    with pytest.raises(ReplyFormatError, match=r"^the reply is not a JSON object: got a list"):
        parse_reply("[1, 2]", CODE_GENERATOR_SCHEMA)


def test_numbers_become_strings_and_a_plan_given_as_a_list_becomes_lines() -> None:
    text = json.dumps({"response": {**PLAN, "init_plan": ["1. load", "2. answer"], "current_plan_step": 1}})
    parsed = parse_reply(text, PLANNER_SCHEMA)
    assert parsed["init_plan"] == "1. load\n2. answer"
    assert parsed["current_plan_step"] == "1"


def test_fields_beyond_the_schema_are_kept() -> None:
    text = json.dumps({"response": {**PLAN, "review": "looks fine"}})
    assert parse_reply(text, PLANNER_SCHEMA)["review"] == "looks fine"


def test_summary_without_variables_gets_an_empty_list() -> None:
    assert parse_reply('{"ConversationSummary": "loaded data"}', SUMMARY_SCHEMA) == {
        "ConversationSummary": "loaded data",
        "Variables": [],
    }


def test_summary_variables_are_checked_item_by_item() -> None:
    text = json.dumps(
        {
            "ConversationSummary": "s",
            "Variables": [{"name": "df", "type": "DataFrame"}, "total", {"type": "int"}],
        }
    )
    with pytest.raises(ReplyFormatError) as caught:
        parse_reply(text, SUMMARY_SCHEMA)
    assert str(caught.value) == "item Variables[1] must be an object; got a string; missing field 'Variables[2].name'"


def test_summary_variable_without_description_gets_an_empty_one() -> None:
    text = '{"ConversationSummary": "s", "Variables": [{"name": "df", "type": "DataFrame"}]}'
    assert parse_reply(text, SUMMARY_SCHEMA)["Variables"] == [{"name": "df", "type": "DataFrame", "description": ""}]


def test_repair_message_says_what_was_wrong_and_shows_the_exact_shape() -> None:
    error = ReplyFormatError("field 'send_to' must be one of User, CodeInterpreter; got 'Planner'")
    text = repair_message(error, PLANNER_SCHEMA)
    assert text.startswith("Your previous reply could not be used: field 'send_to' must be one of User, CodeInterpreter; got 'Planner'.")
    assert "only the JSON object" in text
    outline = json.loads(text[text.index("{") :])
    assert list(outline) == ["response"]
    assert list(outline["response"]) == ["init_plan", "plan", "current_plan_step", "send_to", "message"]
    assert outline["response"]["send_to"] == "User | CodeInterpreter"


def test_repair_message_for_the_summary_shows_no_wrapper() -> None:
    text = repair_message(ReplyFormatError("missing field 'ConversationSummary'"), SUMMARY_SCHEMA)
    outline = json.loads(text[text.index("{") :])
    assert list(outline) == ["ConversationSummary", "Variables"]
    assert outline["Variables"] == [{"name": "<string>", "type": "<string>", "description": "<string>"}]


def test_a_huge_broken_reply_is_refused_instead_of_repaired() -> None:
    # json-repair on a cut-off 2 MB reply takes about a minute: such a reply is asked for again.
    cut_off = '{"response": {"thought": "' + "x" * 2_000_000
    with pytest.raises(ReplyFormatError, match="2,000,026 characters long and not valid JSON"):
        parse_reply(cut_off, CODE_GENERATOR_SCHEMA)
