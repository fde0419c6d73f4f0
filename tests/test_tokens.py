"""Exact token counting: counts, chat framing, middle truncation, and the prompt budget."""

from __future__ import annotations

import pytest

from taskweaver_lite.config.settings import Config
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.llm.tokens import COUNT_CACHE_ENTRIES, REPLY_PRIMING_TOKENS, TOKENS_PER_MESSAGE, get_tokenizer
from taskweaver_lite.records.model_calls import Message

pytestmark = pytest.mark.unit


def test_count_matches_the_o200k_encoding_exactly() -> None:
    tokenizer = get_tokenizer("o200k_base")
    # Reference values from OpenAI's o200k_base tables.
    assert tokenizer.count("hello world") == 2
    assert tokenizer.count("") == 0
    assert tokenizer.count("hello world " * 1000) == 2001


def test_cl100k_is_available_and_counts_differently() -> None:
    assert get_tokenizer("cl100k_base").name == "cl100k_base"
    text = "Ünïcödé façade — 東京 データ分析"
    assert get_tokenizer("cl100k_base").count(text) != get_tokenizer("o200k_base").count(text)


def test_get_tokenizer_returns_the_same_instance_each_time() -> None:
    assert get_tokenizer() is get_tokenizer("o200k_base")


def test_unknown_encoding_is_a_config_error_naming_the_choices() -> None:
    with pytest.raises(ConfigError, match="o200k_base"):
        get_tokenizer("p50k_nonexistent")


def test_count_messages_adds_the_chat_framing_per_message_and_for_the_reply() -> None:
    tokenizer = get_tokenizer()
    messages = [Message(role="system", content="hello world"), Message(role="user", content="hello world")]
    content = 2 * tokenizer.count("hello world")
    roles = tokenizer.count("system") + tokenizer.count("user")
    assert tokenizer.count_messages(messages) == content + roles + 2 * TOKENS_PER_MESSAGE + REPLY_PRIMING_TOKENS
    assert tokenizer.count_messages([]) == REPLY_PRIMING_TOKENS


def test_truncate_middle_keeps_short_text_unchanged() -> None:
    tokenizer = get_tokenizer()
    assert tokenizer.truncate_middle("short text", 100) == "short text"


def test_truncate_middle_keeps_head_and_tail_and_says_how_much_was_left_out() -> None:
    tokenizer = get_tokenizer()
    text = "START " + " ".join(f"line{i}" for i in range(5000)) + " END"
    cut = tokenizer.truncate_middle(text, 200)
    assert tokenizer.count(cut) <= 200
    assert cut.startswith("START line0")
    assert cut.endswith("line4999 END")
    left_out = tokenizer.count(text) - tokenizer.count(cut.split("\n[...")[0]) - tokenizer.count(cut.split("...]\n")[-1])
    assert f"[... {left_out:,} tokens left out here ...]" in cut


@pytest.mark.parametrize("limit", [1, 3, 7, 20, 21, 40, 333])
def test_truncate_middle_never_breaks_multibyte_characters_or_exceeds_the_limit(limit: int) -> None:
    tokenizer = get_tokenizer()
    text = "🦜🧬🫠東京データ" * 500
    cut = tokenizer.truncate_middle(text, limit)
    assert tokenizer.count(cut) <= limit
    cut.encode("utf-8")  # every character whole
    assert "\ufffd" not in cut


def test_prompt_budget_is_the_window_minus_reply_reserve_and_margin() -> None:
    config = Config.model_validate({"llm": {"context_window": 32_000, "reply_reserve": 2_000, "margin": 100}})
    assert config.prompt_budget == 29_900


def test_counts_of_texts_seen_before_stay_exact_and_the_memory_of_them_stays_bounded() -> None:
    tokenizer = get_tokenizer()
    text = "Rows by region: " + ", ".join(f"region {i} grew {i * 3}%" for i in range(200))
    first = tokenizer.count(text)
    assert tokenizer.count("".join(list(text))) == first == len(tokenizer._bpe.encode(text))  # an equal text, another object
    for i in range(COUNT_CACHE_ENTRIES + 100):
        tokenizer.count(f"text number {i}")
    kept = tokenizer._cached_count.cache_info().currsize
    assert kept <= COUNT_CACHE_ENTRIES
    huge = "word " * 20_000  # longer than any text kept: counted each time, never held
    assert tokenizer.count(huge) == len(tokenizer._bpe.encode(huge))
    assert tokenizer._cached_count.cache_info().currsize == kept
