"""Experience: a session distilled into tips (/save, the serve endpoint), retrieved by the next session's roles, handcrafted tips, /experience."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from helpers import make_project, run_cli

from taskweaver_lite.config.file import load_config
from taskweaver_lite.errors import ConfigError, ExperienceError
from taskweaver_lite.session.assembly import open_session
from taskweaver_lite.session.session import Session
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply
from taskweaver_lite.testing.web_server import WebServer

pytestmark = pytest.mark.kernel

DATES_TIP = "When sales.csv is read, parse the date column with parse_dates=['date'] or resampling by month fails with a TypeError."
EURO_TIP = "The user wants money shown in euros with two decimals."


def tips_reply(*tips: tuple[str, str]) -> str:
    return json.dumps({"tips": [{"kind": kind, "text": text} for kind, text in tips]})


def prompt_of(server: ScriptedServer, role: str, *, since: int = -1) -> list[dict]:
    """The messages of the role's last call, or of its first call among the requests from number `since` on."""
    if since >= 0:
        return next(r.messages for r in server.requests[since:] if r.role == role)
    return next(r.messages for r in reversed(server.requests) if r.role == role)


def text_of(server: ScriptedServer, role: str) -> str:
    return "\n".join(m["content"] for m in prompt_of(server, role))


def first_session(project: Path, server: ScriptedServer) -> Session:
    """A session whose code failed once (no parse_dates) and was fixed; still open."""
    server.enqueue("planner", planner_reply("Compute the monthly total of [1, 2]."), planner_reply("The total is 3.", send_to="User"))
    server.enqueue("code_generator", code_reply("print(totl)"), code_reply("print(sum([1, 2]))"))
    session = open_session(load_config(project))
    session.ask("Monthly sales totals, in euros please.")
    return session


def ask_monthly(project: Path, server: ScriptedServer, **overrides: object) -> None:
    server.enqueue("planner", planner_reply("Resample sales by month."), planner_reply("Done.", send_to="User"))
    server.enqueue("code_generator", code_reply("print('resampled')"))
    config = load_config(project, [f"{key}={value}" for key, value in overrides.items()])
    with open_session(config) as session:
        session.ask("Show the monthly sales from sales.csv")


def test_tips_saved_in_one_session_open_the_current_round_of_the_next_sessions_roles(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    server.enqueue("other", tips_reply(("error_resolution", DATES_TIP), ("preference", EURO_TIP)))
    with first_session(project, server) as session:
        saved = session.save_experience()
    assert [(t.kind, t.text) for t in saved] == [("error_resolution", DATES_TIP), ("preference", EURO_TIP)]
    distil_prompt = "\n".join(m["content"] for m in server.requests[-1].messages)
    assert "print(totl)" in distil_prompt and "NameError" in distil_prompt, "the distillation sees the failed code and its error"
    before = len(server.requests)
    ask_monthly(project, server)
    for role, request in (("planner", "Show the monthly sales from sales.csv"), ("code_generator", "Resample sales by month.")):
        messages = prompt_of(server, role, since=before)
        assert DATES_TIP not in messages[0]["content"], f"the {role}'s instructions stay the same whatever the request (cached)"
        tips, asked = messages[-2]["content"], messages[-1]["content"]
        assert tips.startswith("## Experience from earlier sessions") and DATES_TIP in tips, f"the {role}'s tips open the current round"
        assert request in asked, f"the {role}'s request stays the last message"
    first, second = [r.messages for r in server.requests[before:] if r.role == "planner"][:2]
    assert second[: len(first)] == first, "within a round each Planner call extends the one before it, tips included (a cached prefix)"


def test_with_experience_disabled_no_tip_is_retrieved(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    server.enqueue("other", tips_reply(("error_resolution", DATES_TIP)))
    with first_session(project, server) as session:
        session.save_experience()
    ask_monthly(project, server, **{"experience.enabled": "false"})
    assert DATES_TIP not in text_of(server, "planner") and "Experience from" not in text_of(server, "code_generator")


def test_only_the_top_k_tips_that_match_the_request_are_shown_within_the_token_cap(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url, experience={"top_k": 1, "max_tokens": 80})
    unrelated = ("preference", "The user likes seaborn violin plots for distributions.")
    server.enqueue("other", tips_reply(unrelated, ("error_resolution", DATES_TIP), ("preference", EURO_TIP)))
    with first_session(project, server) as session:
        session.save_experience()
        tokenizer = session.contexts()["planner"].tokenizer
        block = session.experience.block("monthly sales from sales.csv", tokenizer=tokenizer, max_tokens=1000)
    assert DATES_TIP in block and EURO_TIP not in block and "violin" not in block
    assert tokenizer.count(block) <= 80


def test_handcrafted_taskweaver_files_are_read_unchanged_and_a_broken_one_is_named(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    folder = project / "experience"
    folder.mkdir()
    tip = '- Say "world" if you hear "hello".\n- Always resample sales monthly with parse_dates.'
    (folder / "handcrafted_exp_1.yaml").write_text(f"exp_id: 1\nexperience_text: |-\n{_indent(tip)}\n", encoding="utf-8")
    # TaskWeaver's embedded copy of the same tip, as its refresh writes it: the same tip once.
    (folder / "exp_1.yaml").write_text(f"exp_id: 1\nexperience_text: |-\n{_indent(tip)}\nembedding_model: all-mpnet-base-v2\nembedding: [0.1, 0.2]\n")
    (folder / "broken.yaml").write_text("exp_id: 2\nexperience_text: [unclosed\n", encoding="utf-8")
    (folder / "raw_exp_3.yaml").write_text("rounds: []\n", encoding="utf-8")
    server.enqueue("planner", planner_reply("Resample."), planner_reply("Done.", send_to="User"))
    server.enqueue("code_generator", code_reply("print(1)"))
    with open_session(load_config(project)) as session:
        tips = session.experience.all()
        problems = session.experience.problems()
        session.ask("resample the sales monthly")
    assert [(t.id, t.kind, t.source) for t in tips] == [("1", "handcrafted", "handcrafted_exp_1.yaml")]
    assert any(str(folder / "broken.yaml") in p and "not valid YAML" in p for p in problems)
    assert any("raw_exp_3.yaml" in p and "not read" in p for p in problems)
    assert 'Say "world"' in text_of(server, "planner")


def test_a_distillation_that_is_not_json_is_reported_and_nothing_is_lost(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    server.enqueue("other", tips_reply(("preference", EURO_TIP)), "Sure! Here are some thoughts, no JSON today.")
    with first_session(project, server) as session:
        session.save_experience()
        with pytest.raises(ExperienceError, match=r"could not be read.*nothing was saved"):
            session.save_experience()
        assert [t.text for t in session.experience.all()] == [EURO_TIP], "the tips stored before are intact"
        assert [r.state for r in session.conversation.rounds] == ["finished"]
        server.enqueue("planner", planner_reply("Say hi.", send_to="User"))
        assert session.ask("hi").state == "finished", "the session goes on"


def test_save_before_any_request_says_there_is_nothing_to_learn_from(tmp_path: Path, server: ScriptedServer) -> None:
    with open_session(load_config(make_project(tmp_path, server.url))) as session, pytest.raises(ExperienceError, match="no requests yet"):
        session.save_experience()
    assert not [r for r in server.requests if r.role == "other"], "no model call for an empty session"


@pytest.mark.cli
def test_the_chat_saves_lists_and_deletes_tips(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    server.enqueue("planner", planner_reply("Hello!", send_to="User"))
    server.enqueue("other", tips_reply(("preference", EURO_TIP), ("error_resolution", DATES_TIP)))
    server.enqueue("other", tips_reply(("preference", EURO_TIP)), tips_reply())
    commands = "/save\n/experience\n/experience delete 3\n/experience delete 3\n/experience\n/save\n"
    result = run_cli("chat", "-p", str(project), stdin=f"hello\n/save\n{commands}")
    assert result.returncode == 0, result.stderr
    err = result.stderr
    assert "Saved 2 tips (shown" in err and "#1  preference" in err and "#2  error resolution" in err
    assert "Saved 1 tip, in place of the 2 saved from this session before" in err and "#3  preference" in err, "a second /save replaces the first's tips"
    assert f"Deleted tip 3: {EURO_TIP}" in err and "there is no tip 3" in err
    assert "no tips were saved." in err
    assert err.count("Experience: 1 tip;") == 1 and err.count("Experience: 0 tips;") == 1, "the list after the delete shows none left"


def test_the_serve_endpoint_saves_lists_and_deletes_tips(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    server.enqueue("planner", planner_reply("Hello!", send_to="User"))
    server.enqueue("other", tips_reply(("preference", EURO_TIP)), "not json")
    with WebServer(load_config(project)) as web, httpx.Client(base_url=web.url, timeout=60) as client:
        session_id = client.post("/api/sessions", json={}).json()["id"]
        with client.stream("POST", f"/api/sessions/{session_id}/messages", json={"text": "hello"}) as response:
            response.read()
        saved = client.post(f"/api/sessions/{session_id}/experience")
        assert saved.status_code == 200 and [t["text"] for t in saved.json()["saved"]] == [EURO_TIP]
        broken = client.post(f"/api/sessions/{session_id}/experience")
        assert broken.status_code == 400 and "nothing was saved" in broken.json()["error"]
        listed = client.get(f"/api/sessions/{session_id}/experience").json()
        assert [t["kind"] for t in listed["tips"]] == ["preference"] and listed["enabled"] is True
        tip_id = listed["tips"][0]["id"]
        assert client.delete(f"/api/sessions/{session_id}/experience/{tip_id}").json()["deleted"]["text"] == EURO_TIP
        assert client.get(f"/api/sessions/{session_id}/experience").json()["tips"] == []


def _indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def test_experience_llm_picks_the_model_that_distils_and_a_bad_one_is_named_at_load(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url, experience={"llm": {"model": "big-distiller"}})
    server.enqueue("other", tips_reply(("preference", EURO_TIP)))
    with first_session(project, server) as session:
        session.save_experience()
    distil_call = server.requests[-1]
    assert distil_call.role == "other" and distil_call.body["model"] == "big-distiller"
    assert {r.body["model"] for r in server.requests if r.role == "planner"} == {"scripted"}, "the roles keep llm.model"
    with pytest.raises(ConfigError, match=r"experience\.llm"):
        load_config(project, ["experience.llm.context_window=300"])
