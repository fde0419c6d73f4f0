"""An evaluation that says what it did not play: a case whose role is left out, a headline that keeps scored and unplayed
runs apart, each note once, the program's version, links to each run's record, and pre_commands where TaskWeaver runs them."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers import REPO

from taskweaver_lite import __version__
from taskweaver_lite.eval.cases import TaskCase, load_cases
from taskweaver_lite.eval.matrix import Setting
from taskweaver_lite.eval.outcome import Outcome, Status
from taskweaver_lite.eval.report import ReportAbout, write_report
from taskweaver_lite.eval.runner import EvalPlan, _pre_commands, run_one
from taskweaver_lite.session.workspace import Workspace

pytestmark = pytest.mark.unit

# TaskWeaver's auto_eval/cases/rag/rag_sys.yaml, as its repository ships it.
RAG_CASE = """version: 0.1
app_dir: ../project/
config_var:
  session.roles: ["document_retriever", "planner"]
  document_retriever.index_folder: "../auto_eval/cases/rag/knowledge_base"
  execution_service.kernel_mode: "local"
pre_command: ["python ../scripts/document_indexer.py --doc_paths ./cases/rag/docs --output_path ./cases/rag/knowledge_base --extensions md"]
task_description: |-
  The task is to ask the agent what are the two modes of code execution in TaskWeaver.
scoring_points:
  - score_point: "Agent should say the two modes are 'local' and 'container' in TaskWeaver."
    weight: 1
"""


def rag_case(root: Path) -> Path:
    folder = root / "auto_eval" / "cases" / "rag"
    folder.mkdir(parents=True)
    (folder / "rag_sys.yaml").write_text(RAG_CASE, encoding="utf-8")
    return folder


def project(root: Path, config: str = "") -> Path:
    folder = root / "project"
    folder.mkdir()
    (folder / "taskweaver_config.yaml").write_text(config, encoding="utf-8")
    return folder


def test_the_rag_case_with_its_retriever_left_out_is_not_played_naming_the_role_and_why(tmp_path: Path) -> None:
    [case] = load_cases([rag_case(tmp_path)])
    plan = EvalPlan(project(tmp_path), tmp_path / "report", (Setting("project"),), overrides=("session.roles=[planner, code_interpreter]",))
    plan.report_dir.mkdir()
    with Workspace.load(plan.project) as workspace:
        outcome = run_one(case, Setting("project"), plan, workspace)
    assert (outcome.status, outcome.score) == ("not played", None), outcome
    assert outcome.reason == (
        "the case needs the role document_retriever (left out of session.roles by --set or the setting); without it the agent cannot do the task"
    )
    assert not (tmp_path / "auto_eval" / "cases" / "rag" / "knowledge_base").exists(), "a case not played runs no pre_command"


def test_a_role_the_project_has_broken_is_named_with_its_file_and_its_problem(tmp_path: Path) -> None:
    [case] = load_cases([rag_case(tmp_path)])
    folder = project(tmp_path)
    role = folder / "roles" / "document_retriever"
    role.mkdir(parents=True)
    (role / "document_retriever.role.yaml").write_text("alias: DocumentRetriever\nintro: Finds passages.\n", encoding="utf-8")
    plan = EvalPlan(folder, tmp_path / "report", (Setting("project"),))
    plan.report_dir.mkdir()
    with Workspace.load(plan.project) as workspace:
        outcome = run_one(case, Setting("project"), plan, workspace)
    assert outcome.status == "not played"
    assert outcome.reason.startswith(f"the case needs the role document_retriever ({role / 'document_retriever.role.yaml'}: key 'module' is missing")


def test_pre_commands_run_in_the_folder_that_holds_cases_as_taskweavers_auto_eval(tmp_path: Path) -> None:
    folder = rag_case(tmp_path)
    case = TaskCase(name="rag", path=folder / "rag_sys.yaml", task_description="t", scoring_points=(), pre_command=("pwd > where.txt",))
    assert _pre_commands(case) == []
    assert (tmp_path / "auto_eval" / "where.txt").read_text(encoding="utf-8").strip() == str((tmp_path / "auto_eval").resolve())


def outcome(case: str, setting: str, *, score: float | None = None, reason: str = "", notes: tuple[str, ...] = ()) -> Outcome:
    status: Status = "scored" if score is not None else "not played"
    return Outcome(
        case=case,
        setting=setting,
        kind="taskweaver",
        status=status,
        score=score,
        points=score,
        max_points=1 if score is not None else None,
        reason=reason,
        notes=notes,
        session_file=f"sessions/{case}@{setting}.md" if score is not None else "",
        transcript=f"transcripts/{case}@{setting}.json" if score is not None else "",
    )


def test_the_headline_keeps_played_and_scored_apart_from_not_played_with_each_reason_and_note_once(tmp_path: Path) -> None:
    needs = "the case needs the role web_search (no role of that name here); without it the agent cannot do the task"
    shared = "config_var execution_service.kernel_mode: local keeps the project's execution.sandbox"
    outcomes = [
        outcome("calc_mean", "base", score=1.0, notes=(shared,)),
        outcome("echo", "base", score=0.2, notes=(shared,)),
        outcome("web_search", "base", reason=needs, notes=(shared,)),
        outcome("web_search_calc", "base", reason=needs, notes=(shared,)),
        outcome("calc_mean", "small", score=0.5),
        outcome("echo", "small", reason="the model could not play this case"),
        outcome("web_search", "small", reason=needs),
        outcome("web_search_calc", "small", reason=needs),
    ]
    about = ReportAbout(started=time.time(), command="taskweaver-lite eval cases", project=tmp_path)
    text = write_report(tmp_path, outcomes, [Setting("base"), Setting("small")], plot=False, about=about)[0].read_text(encoding="utf-8")
    headline = text.split("## Headline")[1].split("## Per case")[0]
    assert "| base | 0.60 | 2/4 | 2 | 0 |" in headline and "| small | 0.50 | 1/4 | 3 | 0 |" in headline, headline
    assert "A mean score counts only the runs that were played and scored" in headline
    assert f"- {needs} (4 runs: web_search @ base, web_search_calc @ base, web_search @ small, web_search_calc @ small)" in headline
    assert "| web_search | not played | not played |" in text and "| calc_mean | 1.00 | 0.50 |" in text
    assert text.count(shared) == 1 and f"- {shared} (cases calc_mean, echo, web_search, web_search_calc)" in text
    assert f"- **Program:** taskweaver-lite {__version__}" in text
    assert "[session](sessions/calc_mean@base.md), [transcript](transcripts/calc_mean@base.json) |" in text


def test_the_documentation_table_has_no_links_into_a_run_folder_that_is_not_there() -> None:
    page = (REPO / "docs" / "eval.md").read_text(encoding="utf-8")
    assert "](sessions/" not in page and "](transcripts/" not in page
