"""The document_retriever role in a session: routed by the Planner, answering from docs/ with citations; roles whose needs are unmet are off."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import make_project, run_cli

from taskweaver_lite.config.file import load_config
from taskweaver_lite.session.assembly import open_session, resume_session
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply

pytestmark = pytest.mark.kernel

ROLES = {"roles": ["planner", "code_interpreter", "document_retriever"]}
FINANCE = """# Finance notes

## Fiscal year

Our fiscal year starts on 1 April and ends on 31 March.
Quarterly figures follow it: Q1 is April to June.
"""


def last_user(messages: list[dict]) -> str:
    return next(m["content"] for m in reversed(messages) if m["role"] == "user")


def planner_calls(server: ScriptedServer) -> list[list[dict]]:
    return [r.messages for r in server.requests if r.role == "planner"]


def test_a_request_goes_planner_retriever_planner_code_interpreter_planner_user(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url, session=ROLES)
    (project / "docs").mkdir(exist_ok=True)
    (project / "docs" / "finance.md").write_text(FINANCE, encoding="utf-8")
    server.enqueue(
        "planner",
        planner_reply("When does the fiscal year start?", send_to="DocumentRetriever"),
        planner_reply("Print the months of Q1 of a fiscal year starting in April."),
        planner_reply("Q1 is April, May and June (docs/finance.md:3-6).", send_to="User"),
    )
    server.enqueue("code_generator", code_reply("print(['April', 'May', 'June'])"))
    with open_session(load_config(project)) as session:
        rnd = session.ask("Which months are in our Q1?")
    assert rnd.state == "finished" and rnd.answer == "Q1 is April, May and June (docs/finance.md:3-6)."
    assert [(p.send_from, p.send_to) for p in rnd.posts] == [
        ("User", "Planner"),
        ("Planner", "DocumentRetriever"),
        ("DocumentRetriever", "Planner"),
        ("Planner", "CodeInterpreter"),
        ("CodeInterpreter", "Planner"),
        ("Planner", "User"),
    ]
    calls = planner_calls(server)
    assert "DocumentRetriever" in calls[0][0]["content"] and "file:line" in calls[0][0]["content"], "the Planner's prompt introduces the role"
    passages = last_user(calls[1])
    assert "docs/finance.md:3-6 (Fiscal year)" in passages and "starts on 1 April" in passages
    assert (project / "docs_index.db").is_file(), "the index is a file in the project, built on first use"
    assert not [r for r in server.requests if r.role == "other"], "the retriever answers without a model call"


def test_with_no_documents_the_retriever_says_so_and_the_planner_goes_on(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url, session=ROLES)
    shutil.rmtree(project / "docs")
    server.enqueue(
        "planner",
        planner_reply("fiscal year start", send_to="DocumentRetriever"),
        planner_reply("There are no documents to look this up in.", send_to="User"),
    )
    with open_session(load_config(project)) as session:
        rnd = session.ask("When does our fiscal year start?")
    assert "There is no docs/ folder in the project" in last_user(planner_calls(server)[1])
    assert rnd.answer == "There are no documents to look this up in."


def test_a_role_needing_vision_without_a_vision_model_is_off_with_the_reason(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url, session={"roles": ["planner", "code_interpreter", "image_reader"]})
    folder = project / "roles" / "image_reader"
    folder.mkdir(parents=True)
    (folder / "image_reader.role.yaml").write_text(
        "alias: ImageReader\nintro: |-\n  - ImageReader describes the image whose path it is sent.\nprompt: Describe the image.\nrequires: [vision]\n",
        encoding="utf-8",
    )
    server.enqueue("planner", planner_reply("Hello.", send_to="User"))
    with open_session(load_config(project)) as session:
        problems = session.role_problems
        session.ask("hi")
    assert any(p.startswith("role image_reader is off: it needs a model that reads images") and "image_reader.llm.vision: true" in p for p in problems)
    assert "ImageReader" not in planner_calls(server)[0][0]["content"], "an off role is not offered to the Planner"
    vision = load_config(project, ["image_reader.llm.model=gpt-4o", "image_reader.llm.vision=true"])
    server.enqueue("planner", planner_reply("Hello.", send_to="User"))
    with open_session(vision) as session:
        assert session.role_problems == []
        session.ask("hi")
    assert "ImageReader" in planner_calls(server)[-1][0]["content"]


@pytest.mark.cli
def test_the_chat_reports_an_off_role_on_stderr_and_goes_on(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url, session={"roles": ["planner", "code_interpreter", "image_reader"]})
    folder = project / "roles" / "image_reader"
    folder.mkdir(parents=True)
    (folder / "image_reader.role.yaml").write_text("alias: ImageReader\nintro: reads images\nprompt: Describe it.\nrequires: vision\n", encoding="utf-8")
    server.enqueue("planner", planner_reply("Hello!", send_to="User"))
    result = run_cli("chat", "-p", str(project), stdin="hi\n")
    assert result.returncode == 0 and result.stdout.strip() == "Hello!"
    assert "role image_reader is off: it needs a model that reads images" in result.stderr
    listed = run_cli("roles", "-p", str(project))
    lines = {line.split()[0]: line for line in listed.stdout.splitlines() if line.strip()}
    assert " off " in lines["image_reader"] and "needs a model that reads images" in lines["image_reader"]
    assert " disabled " in lines["document_retriever"], "the retriever ships, off until session.roles lists it"


def test_a_resumed_session_asks_the_retriever_again_and_sees_edited_documents(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url, session=ROLES)
    (project / "docs").mkdir(exist_ok=True)
    (project / "docs" / "finance.md").write_text(FINANCE, encoding="utf-8")
    server.enqueue("planner", planner_reply("fiscal year start", send_to="DocumentRetriever"), planner_reply("1 April.", send_to="User"))
    with open_session(load_config(project)) as session:
        session.ask("When does the fiscal year start?")
    (project / "docs" / "finance.md").write_text(FINANCE.replace("1 April", "1 July"), encoding="utf-8")
    server.enqueue("planner", planner_reply("fiscal year start", send_to="DocumentRetriever"), planner_reply("1 July now.", send_to="User"))
    resumed, report = resume_session(load_config(project), "last")
    with resumed:
        rnd = resumed.ask("And now?")
    assert report.rounds == 1 and rnd.answer == "1 July now."
    latest = last_user(planner_calls(server)[-1])
    assert "starts on 1 July" in latest and "1 April" not in latest, "the index follows the edit"
    assert [p.send_from for p in resumed.conversation.rounds[0].posts] == ["User", "Planner", "DocumentRetriever", "Planner"], "the first round is back"


def test_a_new_projects_docs_answer_what_the_sample_datas_columns_mean(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url, session=ROLES)
    server.enqueue(
        "planner",
        planner_reply("discount column meaning", send_to="DocumentRetriever"),
        planner_reply("The share taken off the list price.", send_to="User"),
    )
    with open_session(load_config(project)) as session:
        session.ask("What does the discount column hold?")
    passages = last_user(planner_calls(server)[1])
    assert "[1] docs/sales_data.md:" in passages and "the share taken off the list price" in passages


@pytest.mark.cli
def test_the_docs_command_lists_each_document_and_why_one_is_skipped(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    (project / "docs" / "broken.ipynb").write_text("{not json", encoding="utf-8")
    (project / "docs" / "chart.png").write_bytes(b"\x89PNG")
    listed = run_cli("docs", "-p", str(project))
    assert listed.returncode == 0, listed.stderr
    lines = {line.split()[0]: line for line in listed.stdout.splitlines() if line.strip()}
    assert "skipped: not a readable notebook" in lines["broken.ipynb"]
    assert lines["sales_data.md"].split()[1:] == ["3", "passages"]
    assert "1 document, 3 passages in" in listed.stdout and "1 other file (not documents)" in listed.stdout
