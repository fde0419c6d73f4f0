"""`session.suggested_requests`: a request's number asks the request it names; anything else goes as typed."""

from __future__ import annotations

import pytest

from taskweaver_lite.config.settings import Config
from taskweaver_lite.session.session import numbered, suggested

pytestmark = pytest.mark.unit

REQUESTS = ["Load sales.csv.", "Which region grew fastest?"]


def test_a_number_in_the_list_is_the_request_it_names() -> None:
    assert suggested("1", REQUESTS) == "Load sales.csv."
    assert suggested(" 2\n", REQUESTS) == "Which region grew fastest?"


@pytest.mark.parametrize("text", ["0", "3", "-1", "1.", "2 please", "²", "", "9" * 5000])
def test_anything_else_is_sent_as_typed(text: str) -> None:
    assert suggested(text, REQUESTS) == text
    assert suggested("1", []) == "1", "with no list a number is just a number"


def test_the_list_is_numbered_from_one_and_read_from_the_config() -> None:
    assert numbered(REQUESTS) == "1. Load sales.csv.\n2. Which region grew fastest?"
    assert Config.model_validate({"session": {"suggested_requests": REQUESTS}}).session.suggested_requests == REQUESTS
    assert Config().session.suggested_requests == []
