"""Reading a reply while it streams: the fields shown live, whatever the pieces' boundaries."""

from __future__ import annotations

import json

import pytest

from taskweaver_lite.llm.streaming import PartialReply
from taskweaver_lite.testing.scripted_server import code_reply, planner_reply

pytestmark = pytest.mark.unit

PLANNER = planner_reply('Say "hi" \\ then\nthe total: 42 € \U0001f600', send_to="User", current_plan_step="1. count rows")


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_the_planner_fields_are_decoded_whatever_the_piece_size(size: int) -> None:
    partial = PartialReply(("message", "current_plan_step"))
    for start in range(0, len(PLANNER), size):
        partial.feed(PLANNER[start : start + size])
    fields = json.loads(PLANNER)["response"]
    assert partial.values["message"] == fields["message"]
    assert partial.values["current_plan_step"] == "1. count rows"
    assert set(partial.values) == {"message", "current_plan_step"}  # init_plan and plan are never shown raw


def test_a_value_grows_while_its_string_is_still_open() -> None:
    partial = PartialReply(("reply_content",))
    text = code_reply("import pandas as pd\nprint(1)")
    cut = text.index("print") + 3
    partial.feed(text[:cut])
    assert partial.values["reply_content"] == "import pandas as pd\npri"


def test_a_leading_think_block_is_reasoning_and_json_inside_it_is_not_read() -> None:
    partial = PartialReply(("message",))
    partial.feed("<thi")
    partial.feed('nk>maybe {"message": "wrong"}')
    assert partial.reasoning == 'maybe {"message": "wrong"}' and partial.values == {}
    partial.feed('</think>\n```json\n{"response": {"message": "right"')
    assert partial.values == {"message": "right"}
    assert partial.reasoning == 'maybe {"message": "wrong"}'


def test_a_key_named_like_a_field_inside_a_value_is_not_taken_for_it() -> None:
    partial = PartialReply(("message",))
    partial.feed('{"response": {"plan": "message: no", "items": ["message", "x"], "message": "yes"}}')
    assert partial.values == {"message": "yes"}
