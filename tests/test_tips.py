"""Experience tips without a session: the store's tips and handcrafted files, deleting by id, and the pick for a request."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from taskweaver_lite.config.settings import ExperienceConfig
from taskweaver_lite.errors import ExperienceError
from taskweaver_lite.knowledge.experience import Experience
from taskweaver_lite.knowledge.tips import read_handcrafted
from taskweaver_lite.llm.tokens import get_tokenizer
from taskweaver_lite.records.tips import KIND_LABELS, Tip
from taskweaver_lite.store.database import SessionStore

pytestmark = pytest.mark.unit


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    opened = SessionStore(tmp_path / "sessions.db")
    opened.create_session("s1", started=time.time())
    return opened


def test_a_stored_tip_and_a_handcrafted_one_with_the_same_id_are_told_apart(tmp_path: Path, store: SessionStore) -> None:
    folder = tmp_path / "experience"
    folder.mkdir()
    (folder / "handcrafted_exp_1.yaml").write_text("exp_id: 1\nexperience_text: Label the axes.\n", encoding="utf-8")
    experience = Experience(store=store, folder=folder, settings=ExperienceConfig())
    experience.save("s1", [("preference", "Euros, two decimals.")])
    assert experience.delete("1").text == "Euros, two decimals.", "a number names a stored tip first"
    with pytest.raises(ExperienceError, match=r"tip 1 is handcrafted: delete or edit .*handcrafted_exp_1\.yaml"):
        experience.delete("1")
    with pytest.raises(ExperienceError, match="there is no tip #9"):
        experience.delete("#9")
    assert [t.text for t in experience.all()] == ["Label the axes."]


def test_the_pick_ranks_by_the_words_a_tip_shares_with_the_request_and_follows_new_tips(store: SessionStore, tmp_path: Path) -> None:
    experience = Experience(store=store, folder=tmp_path / "none", settings=ExperienceConfig(top_k=2))
    experience.save("s1", [("preference", "Plots get a title."), ("error_resolution", "Parse the date column of sales.csv before resampling sales by month.")])
    assert [t.kind for t in experience.relevant("resample sales by month")] == ["error_resolution"]
    store.create_session("s2", started=time.time())
    experience.save("s2", [("preference", "Monthly sales plots use bars.")])
    assert experience.relevant("monthly sales plots")[0].text == "Monthly sales plots use bars.", "a tip saved since is searched too"
    assert experience.relevant("?!") == [] and experience.relevant("quantum chromodynamics") == []


def test_a_request_searches_each_text_once_and_the_next_request_sees_tips_saved_elsewhere(store: SessionStore, tmp_path: Path) -> None:
    looked: list[str] = []

    class Counted(SessionStore):
        def tips_version(self) -> tuple[int, int]:
            looked.append("tips")
            return super().tips_version()

    counted = Counted(tmp_path / "counted.db")
    counted.create_session("s1", started=time.time())
    experience = Experience(store=counted, folder=tmp_path / "none", settings=ExperienceConfig())
    experience.new_request()
    assert experience.relevant("monthly sales plots") == [] and experience.relevant("monthly sales plots") == []
    assert looked == ["tips"], "the Planner's second prompt of a request does not search again"
    elsewhere = Experience(store=counted, folder=tmp_path / "none", settings=ExperienceConfig())  # another session's view of the project
    elsewhere.save("s1", [("preference", "Monthly sales plots use bars.")])
    assert experience.relevant("monthly sales plots") == [], "within one request its prompts show the same tips"
    experience.new_request()
    assert [t.text for t in experience.relevant("monthly sales plots")] == ["Monthly sales plots use bars."], "the next request sees it"
    counted.close()


def test_the_stored_tips_are_read_again_only_once_they_changed(tmp_path: Path) -> None:
    read: list[str | None] = []

    class Counted(SessionStore):
        def stored_tips(self, *, owner: str | None = None) -> list[Tip]:
            read.append(owner)
            return super().stored_tips(owner=owner)

    counted = Counted(tmp_path / "counted.db")
    counted.create_session("s1", started=time.time())
    experience = Experience(store=counted, folder=tmp_path / "none", settings=ExperienceConfig())
    experience.save("s1", [("preference", "Monthly sales plots use bars.")])
    for text in ("monthly sales plots", "sales by region", "plots with bars"):  # requests' texts, all different
        experience.new_request()
        assert experience.relevant(text)
    assert read == [None], "the tips were read once for three searches: their version did not change"
    experience.save("s1", [("preference", "Regional sales use a map.")])
    assert [t.text for t in experience.relevant("regional sales")] == ["Regional sales use a map."] and read == [None, None], "read again once changed"
    counted.close()


def test_the_tips_block_stays_within_its_cap_and_is_empty_when_retrieval_is_off(store: SessionStore, tmp_path: Path) -> None:
    long_tip = "When sales are resampled by month " + "always check the month boundaries carefully " * 40
    tokenizer = get_tokenizer()
    on = Experience(store=store, folder=tmp_path, settings=ExperienceConfig(max_tokens=100))
    on.save("s1", [("error_resolution", long_tip)])
    block = on.block("resample sales by month", tokenizer=tokenizer, max_tokens=1000)
    assert block.startswith("## Experience from earlier sessions") and tokenizer.count(block) <= 100, "the best tip is cut to fit rather than dropped"
    off = Experience(store=store, folder=tmp_path, settings=ExperienceConfig(enabled=False))
    assert off.block("resample sales by month", tokenizer=tokenizer, max_tokens=1000) == ""


def test_handcrafted_files_missing_a_key_or_not_a_mapping_are_named_and_the_rest_read(tmp_path: Path) -> None:
    (tmp_path / "handcrafted_exp_a.yaml").write_text("exp_id: a\nexperience_text: fine\n", encoding="utf-8")
    (tmp_path / "handcrafted_exp_b.yaml").write_text("exp_id: b\n", encoding="utf-8")
    (tmp_path / "list.yml").write_text("- just\n- a list\n", encoding="utf-8")
    found = read_handcrafted(tmp_path)
    assert [t.id for t in found.tips] == ["a"]
    assert any("handcrafted_exp_b.yaml: no experience_text" in p for p in found.problems)
    assert any("list.yml: expected a mapping" in p for p in found.problems)


def test_tips_taskweaver_generated_are_labelled_as_taskweavers_not_as_handcrafted(tmp_path: Path) -> None:
    (tmp_path / "handcrafted_exp_1.yaml").write_text("exp_id: '1'\nexperience_text: Parse dates first.\n", encoding="utf-8")
    (tmp_path / "exp_1.yaml").write_text("exp_id: '1'\nexperience_text: Parse dates first.\nembedding: [0.1]\n", encoding="utf-8")
    (tmp_path / "exp_20240101-000000-abc.yaml").write_text(
        "exp_id: 20240101-000000-abc\nexperience_text: The user wants totals in thousands.\nraw_experience_path: raw_exp_20240101-000000-abc.yaml\n",
        encoding="utf-8",
    )
    found = read_handcrafted(tmp_path)
    assert [(t.id, t.kind, KIND_LABELS[t.kind]) for t in found.tips] == [
        ("1", "handcrafted", "handcrafted"),
        ("20240101-000000-abc", "taskweaver", "from TaskWeaver"),
    ]
    assert all(t.from_file for t in found.tips)
