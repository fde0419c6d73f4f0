"""`taskweaver-lite eval` end to end: real sessions, real kernels, the openai SDK over HTTP to the scripted model.

The scripted model (`testing/eval_script.py`) plays agent, examiner and judge; tests bend it to
fail where a real model would. The CLI test kills a real `eval` process mid-run and resumes it.
"""

from __future__ import annotations

import itertools
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, cli_env, make_project, outliving, watch_stderr

from taskweaver_lite.eval.cases import load_cases
from taskweaver_lite.eval.matrix import Setting
from taskweaver_lite.eval.outcome import RUN_ID_FILE, Outcome
from taskweaver_lite.eval.report import REPORT_JSON, REPORT_MD, REPORT_PLOT, write_report
from taskweaver_lite.eval.runner import EvalPlan, run_eval
from taskweaver_lite.store.database import SessionStore
from taskweaver_lite.testing import eval_script
from taskweaver_lite.testing.scripted_server import Reply, ScriptedServer, code_reply, last_user_text

pytestmark = pytest.mark.kernel

TASKWEAVER_CASES = REPO / "tests" / "data" / "taskweaver_cases"
SHIPPED = REPO / "project" / "eval_cases"


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with eval_script.scripted_eval_server() as scripted:
        yield scripted


def plan(tmp_path: Path, server: ScriptedServer, *settings: Setting, jobs: int = 1, timeout: float | None = None) -> EvalPlan:
    project = make_project(tmp_path, server.url, llm={"max_retries": 0, **({"timeout": timeout} if timeout else {})})
    return EvalPlan(project, tmp_path / "report", settings or (Setting("project"),), jobs=jobs)


def short_running_sum(folder: Path, rounds: int = 12) -> Path:
    """The shipped running_sum case cut to `rounds` requests (the shipped one's 50 take too long for CI twice over)."""
    case = folder / "running_sum"
    case.mkdir(parents=True)
    total = rounds * (rounds + 1) // 2
    text = (SHIPPED / "running_sum" / "running_sum.yaml").read_text(encoding="utf-8")
    text = text.replace("round 50", f"round {rounds}").replace("max_rounds: 50", f"max_rounds: {rounds}").replace("1275", str(total))
    (case / "running_sum.yaml").write_text(text, encoding="utf-8")
    return case


def by_case(outcomes: list[Outcome]) -> dict[str, Outcome]:
    return {o.case: o for o in outcomes}


def test_taskweavers_own_cases_are_examined_judged_and_their_eval_code_runs_in_the_kernel(tmp_path: Path, server: ScriptedServer) -> None:
    outcomes = by_case(run_eval(load_cases([TASKWEAVER_CASES]), plan(tmp_path, server)))
    calc, echo = outcomes["calc_mean"], outcomes["echo"]
    assert calc.status == "scored" and calc.score == 1.0 and calc.rounds == 1
    assert calc.details[0].by == "judge" and calc.notes == ("config_var execution_service.kernel_mode: local keeps the project's execution.sandbox",)
    # echo's first point asserts on chat_history[-1] being the agent's HumanMessage saying exactly "Hello World".
    assert [(d.by, d.hit) for d in echo.details] == [("eval_code", True), ("judge", True)]
    assert calc.prompt_tokens > 0 and calc.examiner_tokens > 0 and calc.judge_tokens > 0
    saved = json.loads((tmp_path / "report" / "transcripts" / "echo@project.json").read_text(encoding="utf-8"))
    assert saved["chat_history"][-1] == ["ai", "TASK_FINISHED"] and saved["chat_history"][-2] == ["human", "Hello World"]
    examiner_requests = [r for r in server.requests if r.role == "other" and "You are testing" in r.messages[0]["content"]]
    assert "Let's start" not in examiner_requests[0].messages[1]["content"]  # our kick-off, our words
    assert examiner_requests[0].body.get("response_format") is None  # the examiner writes prose, not JSON


def test_a_scored_run_is_kept_in_the_report_store_beside_the_session_that_played_it(tmp_path: Path, server: ScriptedServer) -> None:
    the_plan = plan(tmp_path, server)
    [outcome] = run_eval(load_cases([TASKWEAVER_CASES / "calc_mean"]), the_plan)
    assert outcome.status == "scored" and outcome.session_id is not None, outcome.reason
    run_id = (the_plan.report_dir / RUN_ID_FILE).read_text(encoding="utf-8").strip()
    store = SessionStore(the_plan.report_dir / "sessions.db", read_only=True)
    try:
        kept, sessions = store.eval_results(run_id), store.list_sessions()
    finally:
        store.close()
    assert {name: Outcome.from_dict(result) for name, result in kept.items()} == {"calc_mean @ project": outcome}
    assert [entry.id for entry in sessions] == [outcome.session_id], "the session is in the report's store, not the project's"
    assert not (the_plan.project / "sessions.db").exists()
    assert (outcome.session_file, outcome.transcript) == ("sessions/calc_mean@project.md", "transcripts/calc_mean@project.json")
    written = (the_plan.report_dir / outcome.session_file).read_text(encoding="utf-8")
    assert "demo_data.csv" in written, "the run's session, written out as Markdown beside the report, shows its requests"


def test_the_shipped_project_as_configured_runs_a_shipped_case(tmp_path: Path, server: ScriptedServer) -> None:
    project = Path(shutil.copytree(REPO / "project", tmp_path / "project", ignore=shutil.ignore_patterns("sessions", "eval", "*.db*")))
    wired = (f"llm.api_base={server.url}", "llm.api_key=test-key", "llm.model=scripted")
    [outcome] = run_eval(load_cases([project / "eval_cases" / "mean_units"]), EvalPlan(project, tmp_path / "report", (Setting("project"),), overrides=wired))
    assert outcome.status == "scored" and outcome.score == 1.0, outcome.reason


def test_eval_code_that_fails_marks_its_point_missed_with_the_assertion(tmp_path: Path, server: ScriptedServer) -> None:
    case = tmp_path / "cases" / "echo_wrong"
    case.mkdir(parents=True)
    (case / "echo_wrong.yaml").write_text(
        'task_description: The task is to echo the word "Hello World"\n'
        "scoring_points:\n  - score_point: the agent says goodbye\n    weight: 2\n"
        "    eval_code: |-\n      assert chat_history[-1].content == 'Goodbye', f'said {chat_history[-1].content!r}'\n",
        encoding="utf-8",
    )
    [outcome] = run_eval(load_cases([case]), plan(tmp_path, server))
    assert outcome.status == "scored" and outcome.score == 0.0
    assert outcome.details[0].reason == "AssertionError: said 'Hello World'"


def test_verbose_shows_the_examiner_every_post_and_pre_commands_run_where_taskweaver_runs_them(tmp_path: Path, server: ScriptedServer) -> None:
    case = tmp_path / "cases" / "verbose_echo"
    case.mkdir(parents=True)
    (case / "verbose_echo.yaml").write_text(
        'task_description: The task is to echo the word "Hello World"\nverbose: true\n'
        'pre_command: ["touch made_by_pre_command.txt", "exit 3"]\n'
        'scoring_points: [{score_point: the agent says "Hello World", weight: 1}]\n',
        encoding="utf-8",
    )
    [outcome] = run_eval(load_cases([case]), plan(tmp_path, server))
    assert (tmp_path / "made_by_pre_command.txt").exists(), "in the folder that holds cases/ (TaskWeaver's auto_eval/)"
    assert outcome.notes == (f"pre_command 'exit 3' failed in {tmp_path.resolve()} (exit 3)",)
    saved = json.loads((tmp_path / "report" / "transcripts" / "verbose_echo@project.json").read_text(encoding="utf-8"))
    agent_said = saved["chat_history"][3][1]
    assert "Below are conversation details inside the Agent" in agent_said and "Planner -> User: Hello World" in agent_said
    assert outcome.status == "scored" and outcome.score == 1.0


def test_a_dseval_set_is_scored_by_its_validators_without_a_judge(tmp_path: Path, server: ScriptedServer) -> None:
    def careless(messages: list[dict[str, Any]]) -> str:
        asked = last_user_text(messages)
        if "How many rows" in asked:  # the right count, but it trims the user's DataFrame on the way
            return code_reply("sales.drop(sales.index[-1], inplace=True)\nlen(sales) + 1")
        if "per region" in asked:
            return code_reply("sales.groupby('region')['revenue'].mean()")
        if "largest revenue" in asked:
            return code_reply("sales['revnue'].max()")
        return eval_script.code_generator(messages)

    server.set_default("code_generator", careless)
    problems = tmp_path / "dseval" / "sales_basics.py"
    shutil.copytree(SHIPPED / "dseval", problems.parent)
    extra = '\n\n# %%\n"""\nquestion: What is the largest revenue?\n"""\n\nsales["revenue"].max()\n'
    problems.write_text(problems.read_text(encoding="utf-8") + extra, encoding="utf-8")
    [outcome] = run_eval(load_cases([problems]), plan(tmp_path, server))
    assert outcome.kind == "dseval" and outcome.status == "scored" and outcome.rounds == 4
    assert [d.hit for d in outcome.details] == [True, False, False, False] and outcome.score == 0.25
    assert outcome.details[1].reason == "unexpected variable updated: sales"  # the side effect, though the count was right
    assert "different" in outcome.details[2].reason  # the result compared with the reference's
    assert outcome.details[3].reason.startswith("the code crashed: KeyError")
    assert not any(r.role == "other" for r in server.requests)  # no examiner, no judge


def test_bad_input_marks_its_case_with_the_reason_and_the_others_go_on(tmp_path: Path, server: ScriptedServer) -> None:
    cases = tmp_path / "cases"
    for name, text in {
        "no_task": "scoring_points: [{score_point: s, weight: 1}]\n",
        "no_data": 'task_description: The task is to echo the word "Hello World"\ndata_files: [gone.csv]\nscoring_points: [{score_point: s, weight: 1}]\n',
        "unjudged": 'task_description: The task is to echo the word "Hello World"\nscoring_points: [{score_point: says hello, weight: 1}]\n',
        "model_fails": "task_description: The task is to explode the model.\nscoring_points: [{score_point: s, weight: 1}]\n",
        "web_search": "config_var: {session.roles: [planner, web_search]}\ntask_description: t\nscoring_points: [{score_point: s, weight: 1}]\n",
    }.items():
        (cases / name).mkdir(parents=True)
        (cases / name / f"{name}.yaml").write_text(text, encoding="utf-8")

    def judge_waffles(messages: list[dict[str, Any]]) -> str:
        if "says hello" in last_user_text(messages):
            return "Well, the agent was friendly enough."
        return eval_script.examiner_or_judge(messages)

    def planner_breaks(messages: list[dict[str, Any]]) -> str | Reply:
        if "explode" in last_user_text(messages):
            return Reply(status=500, error_message="the model crashed")
        return eval_script.planner(messages)

    server.set_default("other", judge_waffles)
    server.set_default("planner", planner_breaks)
    outcomes = run_eval(load_cases([cases, TASKWEAVER_CASES / "echo"]), plan(tmp_path, server, jobs=2))
    result = by_case(outcomes)
    assert result["no_task"].status == "skipped" and "missing task_description" in result["no_task"].reason
    assert result["no_data"].status == "skipped" and "data file gone.csv not found" in result["no_data"].reason
    assert result["unjudged"].status == "failed" and "the judge's reply on scoring point 1 is not a verdict" in result["unjudged"].reason
    assert result["model_fails"].status == "failed" and "failed at request 1" in result["model_fails"].reason
    assert "HTTP 500" in result["model_fails"].reason
    assert result["web_search"].status == "not played" and "the case needs the role web_search (no role of that name here" in result["web_search"].reason
    assert result["echo"].status == "scored" and result["echo"].score == 1.0
    text = write_report(tmp_path / "report", outcomes, [Setting("project")], plot=False)[0].read_text(encoding="utf-8")
    assert "## Not scored" in text and "- no_data @ project: **skipped**: data file gone.csv not found" in text


def test_a_matrix_runs_every_case_under_every_setting_in_parallel_and_reports_their_costs(tmp_path: Path, server: ScriptedServer) -> None:
    off = Setting("off", ("planner.prompt_compression=false", "code_generator.prompt_compression=false"))
    tight = Setting("(1,1)", ("round_compressor.rounds_to_compress=1", "round_compressor.rounds_to_retain=1"))
    the_plan = plan(tmp_path, server, off, tight, jobs=2, timeout=60)  # longer than the barrier's wait
    both_started = threading.Barrier(2, timeout=30)
    first_calls = itertools.count()

    def planner_once_both_runs_asked(messages: list[dict[str, Any]]) -> str | Reply:
        if next(first_calls) < 2:
            both_started.wait()  # breaks (a 500 fails the run) if the second run waits for the first to end
        return eval_script.planner(messages)

    server.set_default("planner", planner_once_both_runs_asked)
    outcomes = run_eval(load_cases([short_running_sum(tmp_path / "cases")]), the_plan)
    assert not both_started.broken, "the two runs did not ask the model at the same time: they ran one after the other"
    result = {o.setting: o for o in outcomes}
    assert [o.setting for o in outcomes] == ["off", "(1,1)"]
    # 12 rounds: the points at sums 55 (round 10) and 78 (the last reply, eval_code) hit; those of rounds 20-40 cannot.
    assert all(o.status == "scored" and o.points == 6 and o.max_points == 15 and o.rounds == 12 for o in outcomes)
    assert result["off"].fold_calls == 0 and result["(1,1)"].fold_calls > 0
    folds = {p: c for p, c in result["(1,1)"].by_purpose.items() if p.startswith("compression")}
    assert sum(c["calls"] for c in folds.values()) == result["(1,1)"].fold_calls and "planner" in result["(1,1)"].by_purpose
    assert sum(c["prompt_tokens"] for c in result["(1,1)"].by_purpose.values()) == result["(1,1)"].prompt_tokens

    # Folding shrinks the roles' own prompts; the folds, which open with those prompts, are counted apart (mostly cached).
    def roles_own(outcome: Any) -> int:
        return sum(c["prompt_tokens"] for p, c in outcome.by_purpose.items() if not p.startswith("compression"))

    assert roles_own(result["(1,1)"]) < roles_own(result["off"])
    # The scripted server reports a prefix cache: a round's prompt begins as the last one did.
    assert all(0 < o.cached_tokens < o.prompt_tokens for o in outcomes)
    written = write_report(the_plan.report_dir, outcomes, [off, tight])
    assert [p.name for p in written] == [REPORT_MD, REPORT_JSON, REPORT_PLOT]
    assert (the_plan.report_dir / REPORT_PLOT).read_bytes().startswith(b"\x89PNG")
    data = json.loads((the_plan.report_dir / REPORT_JSON).read_text(encoding="utf-8"))
    assert [s["setting"] for s in data["summary"]] == ["off", "(1,1)"]
    assert data["runs"][0]["uncached_tokens"] == data["runs"][0]["prompt_tokens"] - data["runs"][0]["cached_tokens"]


@pytest.mark.cli
def test_eval_killed_mid_run_resumes_without_redoing_the_scored_runs(tmp_path: Path) -> None:
    project = make_project(tmp_path, "http://127.0.0.1:9/v1")
    report = tmp_path / "report"
    cases = [str(SHIPPED / "mean_units"), str(short_running_sum(tmp_path / "cases", rounds=20))]
    command = [sys.executable, "-m", "taskweaver_lite", "eval", *cases, "-p", str(project), "--scripted", "-o", str(report)]
    results = report / "results.jsonl"
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=cli_env()) as proc:
        deadline = time.monotonic() + 60
        while not (results.exists() and results.read_text(encoding="utf-8").count("\n") >= 1) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    # Killed as the next case's kernel was starting: no sandbox, kernel or launcher of the run outlives it.
    assert outliving(tmp_path) == [], "a kernel outlived the program that started it"
    assert [json.loads(line)["case"] for line in results.read_text(encoding="utf-8").splitlines()] == ["mean_units"]
    again = subprocess.run([*command, "--resume"], capture_output=True, text=True, env=cli_env(), timeout=120)
    assert again.returncode == 0, again.stderr
    assert "resume: 1 run(s) already scored, 1 to go" in again.stderr
    assert "running_sum @ project: started" in again.stderr and "running_sum @ project: round 20" in again.stderr
    assert "mean_units @ project: started" not in again.stderr
    assert [json.loads(line)["case"] for line in results.read_text(encoding="utf-8").splitlines()] == ["mean_units", "running_sum"]
    assert "| mean_units | project | 1.00 (1/1) |" in again.stdout and "| running_sum | project | 0.53 (8/15) | 20 |" in again.stdout


@pytest.mark.cli
def test_eval_stopped_by_sigterm_ends_its_runs_after_their_current_request(tmp_path: Path) -> None:
    project = make_project(tmp_path, "http://127.0.0.1:9/v1")
    report = tmp_path / "report"
    command = [sys.executable, "-m", "taskweaver_lite", "eval", str(SHIPPED / "running_sum"), "-p", str(project), "--scripted", "-o", str(report)]
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=cli_env()) as proc:
        lines, seen, reader = watch_stderr(proc, "running_sum @ project: round 10")
        assert seen.wait(60), "".join(lines)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) != 0
        reader.join(5)
    said = "".join(lines)
    assert "eval: interrupted; the runs recorded so far are in results.jsonl" in said and "round 50" not in said
    assert not (report / "results.jsonl").exists() or not (report / "results.jsonl").read_text(encoding="utf-8").strip()


def test_a_broken_role_is_left_out_with_a_note_and_the_cases_that_never_ask_it_are_scored(tmp_path: Path, server: ScriptedServer) -> None:
    the_plan = plan(tmp_path, server)
    folder = the_plan.project / "roles" / "critic"
    folder.mkdir(parents=True)
    (folder / "critic.role.yaml").write_text("alias: Critic\nmodule: critic.Critic\nintro: criticises\n", encoding="utf-8")
    (folder / "critic.py").write_text("import not_installed_anywhere_xyz\n", encoding="utf-8")
    (the_plan.project / "taskweaver_config.yaml").write_text(
        (the_plan.project / "taskweaver_config.yaml").read_text(encoding="utf-8") + "session:\n  roles: [planner, code_interpreter, critic]\n", encoding="utf-8"
    )
    [outcome] = run_eval(load_cases([TASKWEAVER_CASES / "calc_mean"]), the_plan)
    assert outcome.status == "scored" and outcome.score == 1.0, outcome.reason
    [note] = [n for n in outcome.notes if "critic" in n]
    assert "it needs the package not_installed_anywhere_xyz, which is not installed here" in note and note.endswith("(the case ran without it)")


def test_a_case_the_scripted_model_cannot_play_is_not_played_rather_than_scored_zero(tmp_path: Path, server: ScriptedServer) -> None:
    case = tmp_path / "cases" / "median"
    case.mkdir(parents=True)
    (case / "median.yaml").write_text(
        "task_description: The task is to fit an ARIMA model to the sales and report its AIC.\n"
        "scoring_points: [{score_point: The agent reports an AIC of 412.5, weight: 1}]\n",
        encoding="utf-8",
    )
    [outcome] = run_eval(load_cases([case]), plan(tmp_path, server))
    assert outcome.status == "not played" and outcome.score is None, outcome
    assert outcome.reason.startswith("the model could not play this case: it could not answer request(s) 1; run it with real models")
    summary = write_report(tmp_path / "report", [outcome], [Setting("project")], plot=False)[0].read_text(encoding="utf-8")
    assert "| median | project | not played |" in summary and "| project | - | 0/1 |" in summary


def test_taskweavers_rag_case_plays_its_indexer_read_as_index_these_documents_for_the_built_in_retriever(tmp_path: Path, server: ScriptedServer) -> None:
    cases = tmp_path / "auto_eval" / "cases"
    shutil.copytree(TASKWEAVER_CASES / "rag", cases / "rag")  # where TaskWeaver's pre_command expects it: auto_eval/cases/rag
    [outcome] = run_eval(load_cases([cases / "rag"]), plan(tmp_path, server))
    assert outcome.status == "scored" and outcome.score is not None and outcome.score > 0, outcome
    docs = (cases / "rag" / "docs").resolve()
    read_as = [note for note in outcome.notes if note.startswith("pre_command")]
    assert read_as == [
        "pre_command 'python ../scripts/document_indexer.py --doc_paths ./cases/rag/docs --output_path ./cases/rag/knowledge_base --extensions md'"
        f" read as: index the documents in {docs} for the document_retriever (its own index; TaskWeaver's indexer is not run)"
    ], outcome.notes
    assert not any("index_folder" in note for note in outcome.notes), "document_retriever.index_folder is applied, not set aside"
    assert not (cases / "rag" / "knowledge_base").exists()
    asked = [r for r in server.requests if r.role == "planner"]
    assert any("DocumentRetriever" in str(r.messages[-1]["content"]) and "Two Modes of Code Execution" in str(r.messages[-1]["content"]) for r in asked)
