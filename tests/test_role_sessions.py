"""Roles in a session: a project role answering, routing among three roles, its own folds, resume, export, bad input.

Real kernel, the real openai client and the scripted server. A model-only role's calls carry none
of the schema words, so the scripted server files them under "other"; its folds under "compression".
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, make_project, run_cli

from taskweaver_lite.config.file import load_config
from taskweaver_lite.llm.tokens import get_tokenizer
from taskweaver_lite.records.conversation import Post
from taskweaver_lite.records.model_calls import Message
from taskweaver_lite.session.assembly import open_session, resume_session
from taskweaver_lite.session.export import write_export
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply, summary_reply

pytestmark = pytest.mark.kernel

ANALYST = """\
alias: Analyst
intro : |-
  - Analyst explains what a number means for the business, in two sentences.
prompt: |
  You are the {{ alias }} of a data team. Explain results briefly.
"""
THREE_ROLES = {"roles": ["planner", "code_interpreter", "analyst"]}


def project_with_analyst(tmp_path: Path, server: ScriptedServer, *, role_file: str = ANALYST, **sections: Mapping[str, object]) -> Path:
    project = make_project(tmp_path, server.url, session=THREE_ROLES, **sections)
    folder = project / "roles" / "analyst"
    folder.mkdir(parents=True)
    (folder / "analyst.role.yaml").write_text(role_file, encoding="utf-8")
    return project


def calls(server: ScriptedServer, role: str) -> list[list[dict[str, Any]]]:
    return [r.messages for r in server.requests if r.role == role]


def last_user(messages: list[dict[str, Any]]) -> str:
    return next(str(m["content"]) for m in reversed(messages) if m["role"] == "user")


def route(posts: list[Post]) -> list[tuple[str, str]]:
    return [(p.send_from, p.send_to) for p in posts]


def test_a_yaml_only_project_role_answers_the_planner_in_a_session(tmp_path: Path, server: ScriptedServer) -> None:
    server.enqueue("planner", planner_reply("What does a 12% rise mean?", send_to="Analyst"), planner_reply("Sales grew well.", send_to="User"))
    server.enqueue("other", "A 12% rise means demand is strong.")
    with open_session(load_config(project_with_analyst(tmp_path, server))) as session:
        rnd = session.ask("Sales rose 12%. Is that good?")
    assert rnd.state == "finished" and rnd.answer == "Sales grew well."
    assert route(rnd.posts) == [("User", "Planner"), ("Planner", "Analyst"), ("Analyst", "Planner"), ("Planner", "User")]
    analyst_call = calls(server, "other")[0]
    assert analyst_call[0] == {"role": "system", "content": "You are the Analyst of a data team. Explain results briefly."}
    assert "What does a 12% rise mean?" in last_user(analyst_call)
    planner_calls = calls(server, "planner")
    system = planner_calls[0][0]["content"]
    assert "## The Analyst" in system and "explains what a number means" in system, "the Planner's prompt lists the enabled roles' intros"
    assert '"User" or "CodeInterpreter" or "Analyst"' in system
    assert "Analyst: A 12% rise means demand is strong." in last_user(planner_calls[1])


def test_one_request_routed_planner_worker_planner_code_interpreter_planner_user(tmp_path: Path, server: ScriptedServer) -> None:
    server.enqueue(
        "planner",
        planner_reply("Which growth rate should we compute?", send_to="Analyst"),
        planner_reply("Compute (112 - 100) / 100 and print it."),
        planner_reply("Growth is 0.12.", send_to="User"),
    )
    server.enqueue("other", "Year over year, from 100 to 112.")
    server.enqueue("code_generator", code_reply("growth = (112 - 100) / 100\nprint(growth)"))
    with open_session(load_config(project_with_analyst(tmp_path, server))) as session:
        rnd = session.ask("How much did we grow?")
    assert route(rnd.posts) == [
        ("User", "Planner"),
        ("Planner", "Analyst"),
        ("Analyst", "Planner"),
        ("Planner", "CodeInterpreter"),
        ("CodeInterpreter", "Planner"),
        ("Planner", "User"),
    ]
    report = rnd.posts[4]
    assert report.code == "growth = (112 - 100) / 100\nprint(growth)" and "ran successfully" in report.message
    assert "```" not in report.message, "the code is the report's field, not text the Planner parses back"
    coder_prompt = json.dumps(calls(server, "code_generator")[0])
    assert "from 100 to 112" not in coder_prompt, "a role sees only the posts it sent or received"
    assert "print(growth)" in last_user(calls(server, "planner")[2]) and "0.12" in last_user(calls(server, "planner")[2])


def test_a_workers_rounds_fold_by_its_own_compression_at_an_8k_window_with_nothing_over_the_window(tmp_path: Path, server: ScriptedServer) -> None:
    role_file = ANALYST + "rounds_to_compress: 1\nrounds_to_retain: 1\n"
    project = project_with_analyst(tmp_path, server, role_file=role_file, llm={"context_window": 8000}, round_compressor={"retry_backoff": 0})
    server.set_default("other", lambda messages: "Meaning: " + "the figure is steady " * 150)
    server.set_default("compression", summary_reply("SUMMARY: the analyst explained earlier figures."))
    tokenizer = get_tokenizer()
    with open_session(load_config(project)) as session:
        for number in range(1, 7):
            server.enqueue("planner", planner_reply(f"Explain figure {number}.", send_to="Analyst"), planner_reply(f"Done {number}.", send_to="User"))
            assert session.ask(f"Explain figure {number}").state == "finished"
            for context in session.contexts().values():
                assert context.wait_idle(timeout=20)
        analyst, planner = session.contexts()["analyst"], session.contexts()["planner"]
        assert analyst.state.folded_through >= 4, "the analyst keeps one round verbatim (its own rounds_to_retain)"
        assert planner.state.folded_through < analyst.state.folded_through, "the Planner folds by its own settings"
        assert analyst.label == "Analyst" and analyst.report() is not None
    assert "SUMMARY: the analyst explained" in json.dumps(calls(server, "other")[-1])
    for request in server.requests:
        reply_room = request.body.get("max_tokens") or request.body.get("max_completion_tokens") or 0
        sent = [Message(role=m["role"], content=str(m["content"])) for m in request.messages]
        assert tokenizer.count_messages(sent) + reply_room <= 8000, f"a {request.role} call went over the window"
    folds = [r for r in server.requests if r.role == "compression" and "team" in r.messages[0]["content"]]
    assert folds, "the analyst's rounds are folded with the worker's fold prompt"


def test_a_session_with_three_roles_resumes_with_each_roles_history_and_exports_every_post(tmp_path: Path, server: ScriptedServer) -> None:
    role_file = ANALYST + "rounds_to_compress: 1\nrounds_to_retain: 1\n"
    project = project_with_analyst(tmp_path, server, role_file=role_file, round_compressor={"retry_backoff": 0})
    server.set_default("compression", summary_reply("SUMMARY-OF-ANALYST-ROUNDS"))
    for number in (1, 2):
        server.enqueue(
            "planner",
            planner_reply(f"Explain figure {number}.", send_to="Analyst"),
            planner_reply(f"Compute figure {number}."),
            planner_reply(f"Figure {number} done.", send_to="User"),
        )
        server.enqueue("other", f"Figure {number} is fine.")
        server.enqueue("code_generator", code_reply(f"figure_{number} = {number} * 10\nprint(figure_{number})"))
    config = load_config(project)
    with open_session(config) as session:
        session.ask("First figure")
        session.ask("Second figure")
        for context in session.contexts().values():
            assert context.wait_idle(timeout=20)
        folded = session.contexts()["analyst"].state.folded_through
        session_id = session.id
    assert folded >= 1
    server.enqueue("planner", planner_reply("And figure 3?", send_to="Analyst"), planner_reply("All done.", send_to="User"))
    server.enqueue("other", "Figure 3 is fine too.")
    resumed, report = resume_session(config, session_id)
    with resumed:
        assert report.rounds == 2 and report.replayed == 2
        assert resumed.contexts()["analyst"].state.folded_through == folded, "each role's summary comes back"
        assert [p.send_from for p in resumed.conversation.rounds[1].posts].count("Analyst") == 1
        assert resumed.ask("Third figure").answer == "All done."
    prompt = json.dumps(calls(server, "other")[-1])
    assert "SUMMARY-OF-ANALYST-ROUNDS" in prompt and "Figure 2 is fine." in prompt and "figure_2 = 2" not in prompt
    markdown = write_export(config, session_id, fmt="md", target=tmp_path / "out.md", force=False).read_text(encoding="utf-8")
    assert "**Planner → Analyst:** Explain figure 1." in markdown and "**Analyst:** Figure 3 is fine too." in markdown
    notebook = write_export(config, session_id, fmt="ipynb", target=tmp_path / "out.ipynb", force=False).read_text(encoding="utf-8")
    assert "Figure 2 is fine." in notebook and "figure_2 = 2 * 10" in notebook


def test_an_unknown_or_disabled_recipient_gets_a_repair_turn_naming_the_valid_ones(tmp_path: Path, server: ScriptedServer) -> None:
    server.enqueue(
        "planner",
        planner_reply("Check this.", send_to="Reviewer"),  # the bundled example role: there, but not enabled
        planner_reply("Check this.", send_to="Boss"),
        planner_reply("Nothing to check.", send_to="User"),
    )
    with open_session(load_config(project_with_analyst(tmp_path, server))) as session:
        rnd = session.ask("Check my numbers")
    assert rnd.state == "finished" and rnd.answer == "Nothing to check."
    repairs = [last_user(messages) for messages in calls(server, "planner")[1:]]
    assert "'Reviewer'" in repairs[0] and "User, CodeInterpreter, Analyst" in repairs[0]
    assert "'Boss'" in repairs[1] and "User, CodeInterpreter, Analyst" in repairs[1]


def test_a_role_whose_model_is_unreachable_answers_with_the_setting_and_the_request_goes_on(tmp_path: Path, server: ScriptedServer) -> None:
    role_file = ANALYST + "llm: {api_base: 'http://127.0.0.1:9/v1', max_retries: 0, timeout: 2}\n"
    project = project_with_analyst(tmp_path, server, role_file=role_file)
    server.enqueue("planner", planner_reply("Explain 12%.", send_to="Analyst"), planner_reply("I could not get an explanation.", send_to="User"))
    config = load_config(project)
    with open_session(config) as session:
        rnd = session.ask("Is 12% good?")
        session_id = session.id
    assert rnd.state == "finished" and rnd.answer == "I could not get an explanation."
    failure = rnd.posts[2]
    assert (failure.send_from, failure.send_to) == ("Analyst", "Planner")
    assert "could not answer" in failure.message and "analyst.llm" in failure.message and "\n" not in failure.message
    assert "analyst.llm" in last_user(calls(server, "planner")[1])
    resumed, _ = resume_session(config, session_id, replay=False)
    with resumed:
        assert route(resumed.conversation.rounds[0].posts) == route(rnd.posts), "nothing is lost from the store"


def test_a_broken_role_is_one_line_and_the_session_goes_on_with_the_others(tmp_path: Path, server: ScriptedServer) -> None:
    project = project_with_analyst(tmp_path, server, role_file="alias: Analyst\nprompt: p\n")
    server.enqueue("planner", planner_reply("Hello!", send_to="User"))
    with open_session(load_config(project)) as session:
        assert [line for line in session.role_problems if "analyst" in line] == [
            f"role analyst ({project / 'roles' / 'analyst' / 'analyst.role.yaml'}): key 'intro' is missing; the session starts without it"
        ]
        assert session.ask("hi").answer == "Hello!"
    assert "Analyst" not in calls(server, "planner")[0][0]["content"]


def test_a_request_that_bounces_between_roles_stops_at_the_hop_cap_with_a_clear_message(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url, session={"roles": ["planner", "echo"], "max_internal_hops": 2})
    server.set_default("planner", planner_reply("Say it again.", send_to="Echo"))
    with open_session(load_config(project)) as session:
        rnd = session.ask("Loop forever")
    assert rnd.state == "finished" and rnd.answer is not None
    assert "stopped after 2 steps" in rnd.answer and "session.max_internal_hops" in rnd.answer
    assert [p.send_from for p in rnd.posts].count("Echo") == 2 and "Say it again." in rnd.answer


@pytest.mark.cli
def test_roles_command_lists_state_and_the_chat_names_a_broken_enabled_role_in_one_line(tmp_path: Path, server: ScriptedServer) -> None:
    project = project_with_analyst(tmp_path, server, role_file="alias: Analyst\nintro: x\nmodule: analyst.Analyst\n")
    (project / "roles" / "analyst" / "analyst.py").write_text("raise RuntimeError('broken on purpose')\n", encoding="utf-8")
    listed = run_cli("roles", "-p", str(project), "--json")
    states = {entry["name"]: entry for entry in json.loads(listed.stdout)}
    assert states["planner"]["state"] == "enabled" and states["echo"]["state"] == "disabled" and states["reviewer"]["state"] == "disabled"
    assert states["analyst"]["state"] == "broken" and "RuntimeError: broken on purpose" in states["analyst"]["error"]
    server.enqueue("planner", planner_reply("Hi there.", send_to="User"))
    chat = run_cli("chat", "-p", str(project), stdin="hello\n")
    assert chat.returncode == 0 and chat.stdout.strip() == "Hi there."
    lines = [line for line in chat.stderr.splitlines() if "analyst" in line]
    assert len(lines) == 1 and "analyst.py" in lines[0] and "broken on purpose" in lines[0]


def readme_role_files() -> dict[str, str]:
    """The documentation's "Write a role" example (docs/roles.md): each block after a `<!-- role example: PATH -->` marker."""
    page = (REPO / "docs" / "roles.md").read_text(encoding="utf-8")
    found = dict(re.findall(r"<!-- role example: (\S+) -->\n```\w+\n(.*?)```", page, re.S))
    assert set(found) == {"roles/glossary/glossary.role.yaml", "roles/glossary/glossary.py"}, "docs/roles.md lost its role example"
    return found


def test_the_readme_role_example_answers_from_its_terms_and_asks_its_model_about_others(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url, session={"roles": ["planner", "code_interpreter", "glossary"]})
    for path, text in readme_role_files().items():
        (project / path).parent.mkdir(parents=True, exist_ok=True)
        (project / path).write_text(text, encoding="utf-8")
    server.enqueue(
        "planner",
        planner_reply("What is net_sales?", send_to="Glossary"),
        planner_reply("What is churn?", send_to="Glossary"),
        planner_reply("Both explained.", send_to="User"),
    )
    server.enqueue("other", "Churn is the share of customers who leave.")
    with open_session(load_config(project)) as session:
        assert not session.role_problems
        rnd = session.ask("Explain net_sales and churn")
    assert rnd.answer == "Both explained."
    glossary_posts = [p for p in rnd.posts if p.send_from == "Glossary"]
    assert glossary_posts[0].message == "net_sales: sales after returns and discounts, in euros"
    assert [a.kind for a in glossary_posts[0].attachments] == ["source"]
    assert glossary_posts[1].message == "Churn is the share of customers who leave."
    model_call = calls(server, "other")[0]
    assert model_call[0]["content"] == "You are the Glossary of a data team. Say in one sentence what the term means to an analyst."
    assert "[source]\nthe team glossary" in last_user(calls(server, "planner")[1])


@pytest.mark.cli
def test_context_and_summary_show_each_enabled_role_by_its_name(tmp_path: Path, server: ScriptedServer) -> None:
    project = project_with_analyst(tmp_path, server)
    server.enqueue("planner", planner_reply("Explain 12%.", send_to="Analyst"), planner_reply("Fine.", send_to="User"))
    server.enqueue("other", "It is a healthy rise.")
    chat = run_cli("chat", "-p", str(project), stdin="Is 12% good?\n/context\n/summary\n/info\n")
    assert chat.returncode == 0, chat.stderr
    assert "Analyst (round_compression): " in chat.stderr and "CodeGenerator (round_compression): " in chat.stderr
    assert "Analyst: nothing folded yet" in chat.stderr
    assert "Analyst -> Planner: It is a healthy rise." in chat.stderr
    assert "analyst on " in chat.stderr, "/info counts the role's model calls under its own name"


def test_a_role_class_that_raises_or_returns_no_post_answers_with_what_went_wrong(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url, session={"roles": ["planner", "faulty", "silent"]})
    for name, body in (("faulty", "raise ValueError('no data for ' + request.message)"), ("silent", "return 'not a post'")):
        folder = project / "roles" / name
        folder.mkdir(parents=True)
        (folder / f"{name}.role.yaml").write_text(f"alias: {name.title()}\nintro: x\nmodule: {name}.Role\n", encoding="utf-8")
        (folder / f"{name}.py").write_text(f"class Role:\n    def reply(self, request, tools):\n        {body}\n", encoding="utf-8")
    server.enqueue(
        "planner",
        planner_reply("Q1", send_to="Faulty"),
        planner_reply("Q2", send_to="Silent"),
        planner_reply("Neither helped.", send_to="User"),
    )
    with open_session(load_config(project)) as session:
        rnd = session.ask("Try both")
    assert rnd.answer == "Neither helped."
    faulty, silent = rnd.posts[2], rnd.posts[4]
    assert (faulty.send_from, faulty.send_to) == ("Faulty", "Planner") and "ValueError: no data for Q1" in faulty.message
    assert str(project / "roles" / "faulty" / "faulty.role.yaml") in faulty.message
    assert (silent.send_from, silent.send_to) == ("Silent", "Planner") and "not a post" in silent.message
