"""Reading evaluation input: TaskWeaver's case YAML unchanged, DSEval problem sets, matrices, verdicts, and every bad file."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import REPO

from taskweaver_lite.cli.eval import report_folder
from taskweaver_lite.config.file import load_config
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.eval.cases import BadCase, ProblemSet, TaskCase, load_cases
from taskweaver_lite.eval.examiner import Transcript
from taskweaver_lite.eval.matrix import Setting, load_matrix
from taskweaver_lite.eval.outcome import RUN_ID_FILE, Outcome, PointResult, ResultsFile, scored_keys
from taskweaver_lite.eval.report import render_markdown, summarize
from taskweaver_lite.eval.runner import EvalPlan, case_overrides, dependency_problem, eval_llm, run_eval
from taskweaver_lite.eval.scoring import NotAVerdict, read_verdict
from taskweaver_lite.store.opening import open_store
from taskweaver_lite.testing.eval_script import judge

pytestmark = pytest.mark.unit

TASKWEAVER_CASES = REPO / "tests" / "data" / "taskweaver_cases"
SHIPPED = REPO / "project" / "eval_cases"


def test_taskweavers_own_case_files_are_read_unchanged() -> None:
    cases = {c.name: c for c in load_cases([TASKWEAVER_CASES])}
    calc, echo = cases["calc_mean"], cases["echo"]
    assert isinstance(calc, TaskCase) and isinstance(echo, TaskCase)
    assert calc.data_files == ("demo_data.csv",) and calc.dependencies == ("numpy",) and calc.app_dir == "../project/"
    assert calc.config_var == {"execution_service.kernel_mode": "local"}
    assert [(p.score_point, p.weight, p.eval_code) for p in calc.scoring_points] == [("The correct mean value is 78172.75", 1.0, None)]
    assert echo.scoring_points[0].eval_code is not None and "HumanMessage" in echo.scoring_points[0].eval_code
    assert echo.scoring_points[1].eval_code is None  # `eval_code: null`: the judge marks it


def test_a_case_folder_a_case_file_and_a_folder_of_cases_name_the_same_case() -> None:
    by_folder = load_cases([TASKWEAVER_CASES / "calc_mean"])
    by_file = load_cases([TASKWEAVER_CASES / "calc_mean" / "calc_mean.yaml"])
    assert [c.name for c in by_folder] == [c.name for c in by_file] == ["calc_mean"]


def test_the_shipped_set_holds_a_long_case_a_short_one_and_a_dseval_set() -> None:
    cases = {c.name: c for c in load_cases([SHIPPED])}
    assert set(cases) == {"running_sum", "mean_units", "sales_basics"}  # matrix.yaml is not a case
    running = cases["running_sum"]
    assert isinstance(running, TaskCase) and running.max_rounds == 50
    dseval = cases["sales_basics"]
    assert isinstance(dseval, ProblemSet) and len(dseval.questions) == 3 and dseval.data_dir == SHIPPED / "dseval" / "_inputs" / "sales_basics"


def test_dseval_sections_keep_context_code_and_merge_validators_into_the_comparison_template() -> None:
    problems = load_cases([SHIPPED / "dseval" / "sales_basics.py"])[0]
    assert isinstance(problems, ProblemSet)
    context, load, rows, per_region = problems.problems
    assert context.question is None and context.reference_code == "import pandas as pd"
    assert load.validator == {"crash": None, "namespace_intact": None, "result": None, "namespace_check": {"sales": None}}
    assert rows.validator == {"crash": None, "namespace_intact": None, "result": None}
    assert per_region.validator["result"] == {"compare_fn": {"ignore_names": True}}


def test_dseval_own_problem_set_is_read_with_its_data_folder() -> None:
    [problems] = load_cases([REPO / "tests" / "data" / "dseval" / "iris.py"])
    assert isinstance(problems, ProblemSet) and problems.data_dir == REPO / "tests" / "data" / "dseval" / "_inputs"
    assert [p.question is not None for p in problems.problems] == [False, True, True, True]
    load = problems.problems[1]
    assert load.question is not None and load.question.startswith("Load Iris dataset from `inputs/iris.csv`")
    assert load.validator["namespace_check"] == {"iris": None} and load.reference_code == 'iris = pd.read_csv("inputs/iris.csv", index_col="Id")'
    assert problems.problems[2].validator == {"crash": None, "namespace_intact": None, "result": None}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("scoring_points: [{score_point: x, weight: 1}]\n", "missing task_description"),
        ("task_description: add numbers\n", "missing scoring_points"),
        ("task_description: t\nscoring_points: [{weight: 1}]\n", "scoring_points item 1: missing score_point"),
        ("task_description: t\nscoring_points: [{score_point: s, weight: lots}]\n", "scoring_points item 1: weight must be a number"),
        ("task_description: t\nscoring_points: [{score_point: s, weight: 1}]\nmax_rounds: 0\n", "max_rounds must be a whole number"),
        ("task_description: [unclosed\n", "cannot be read as YAML"),
    ],
)
def test_a_case_file_with_a_missing_or_wrong_field_becomes_a_bad_case_naming_it(tmp_path: Path, text: str, reason: str) -> None:
    (tmp_path / "broken.yaml").write_text(text, encoding="utf-8")
    [case] = load_cases([tmp_path / "broken.yaml"])
    assert isinstance(case, BadCase) and reason in case.reason and "broken.yaml" in case.reason


def test_a_dseval_set_whose_data_is_not_there_is_a_bad_case_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "chipotle.py").write_text('# %%\n"""\nquestion: load it\ndata:\n  chipotle.tsv: https://example.com/x\n"""\nx = 1\n', encoding="utf-8")
    [case] = load_cases([tmp_path / "chipotle.py"])
    assert isinstance(case, BadCase) and "chipotle.tsv not found" in case.reason and "nothing is downloaded" in case.reason


def test_a_path_that_is_not_there_is_a_bad_case(tmp_path: Path) -> None:
    [case] = load_cases([tmp_path / "nope"])
    assert isinstance(case, BadCase) and "no such case file or folder" in case.reason


def test_taskweaver_config_var_keys_are_translated_and_those_with_no_setting_are_noted() -> None:
    case = TaskCase(
        "c",
        Path("c.yaml"),
        "t",
        (),
        config_var={"planner.prompt_compression": True, "code_verification.code_verification_on": False, "web_search.chunk_size": 2000},
    )
    overrides, notes = case_overrides(case)
    assert overrides == ["planner.prompt_compression=true", "code_interpreter.code_verification_on=false"]
    assert notes == ["config_var web_search.chunk_size not applied: no such setting here"]


def test_taskweavers_container_mode_means_the_sandbox_and_its_local_mode_keeps_the_projects() -> None:
    container = TaskCase("c", Path("c.yaml"), "t", (), config_var={"execution_service.kernel_mode": "container"})
    local = TaskCase("l", Path("l.yaml"), "t", (), config_var={"execution_service.kernel_mode": "local"})
    assert case_overrides(container) == (['execution.sandbox="bubblewrap"'], [])
    assert case_overrides(local) == ([], ["config_var execution_service.kernel_mode: local keeps the project's execution.sandbox"])


def test_dependencies_are_checked_as_taskweaver_writes_them() -> None:
    assert dependency_problem("pandas") == "" and dependency_problem("pandas>=1.0") == ""
    assert "not met" in dependency_problem("pandas>999")
    assert "is not installed" in dependency_problem("no-such-package-here")


def test_judge_replies_are_verdicts_only_when_they_say_yes_or_no() -> None:
    assert read_verdict('{"reason": "it said 55", "is_hit": "yes"}').hit
    assert not read_verdict('```json\n{"is_hit": "No", "reason": "wrong sum"}\n```').hit
    assert read_verdict("Yes.").hit
    for reply in ("I think the agent did well overall", '{"reason": "unsure"}', ""):
        with pytest.raises(NotAVerdict):
            read_verdict(reply)


def test_the_transcript_hands_scoring_everything_but_the_stop_word() -> None:
    transcript = Transcript((("system", "brief"), ("human", "kick-off"), ("ai", "add 1"), ("human", "1"), ("ai", "TASK_FINISHED")), rounds=1)
    assert transcript.records_json() == '[["system", "brief"], ["human", "kick-off"], ["ai", "add 1"], ["human", "1"]]'
    assert '"speaker": "agent"' in transcript.conversation_json() and "kick-off" not in transcript.conversation_json()


def test_the_scripted_judge_takes_the_claimed_number_not_the_round_count() -> None:
    prompt = 'Conversation:\n[{"speaker": "agent", "text": "The total sum is now 210"}]\n\nStatement:\nAfter 20 rounds the sum is 210.'
    assert '"yes"' in judge(prompt)
    assert '"no"' in judge(prompt.replace("210.", "211."))


def test_a_matrix_file_names_its_settings_and_a_bad_one_names_the_fix(tmp_path: Path) -> None:
    settings = load_matrix(SHIPPED / "matrix.yaml")
    assert [s.name for s in settings] == ["off", "(1,1)", "(2,3)", "observation masking"]
    assert settings[0].overrides == ("planner.prompt_compression=false", "code_generator.prompt_compression=false")
    (tmp_path / "m.yaml").write_text("- off\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="expected a mapping of setting names"):
        load_matrix(tmp_path / "m.yaml")
    (tmp_path / "m.yaml").write_text('"off": 3\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="setting 'off' must map config keys"):
        load_matrix(tmp_path / "m.yaml")
    (tmp_path / "m.yaml").write_text("off: {}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="read as YAML's bool: quote it"):
        load_matrix(tmp_path / "m.yaml")


def test_results_survive_a_line_cut_off_by_a_kill_and_resume_skips_only_scored_runs(tmp_path: Path) -> None:
    results = ResultsFile(tmp_path / "results.jsonl")
    results.append(Outcome("a", "off", "taskweaver", "scored", score=1.0, points=1, max_points=1))
    results.append(Outcome("b", "off", "taskweaver", "failed", reason="model down"))
    with (tmp_path / "results.jsonl").open("a", encoding="utf-8") as file:
        file.write('{"case": "c", "setting": "of')
    assert {o.case for o in results.read()} == {"a", "b"}
    assert scored_keys(results.read()) == {("a", "off")}


def test_the_report_lists_every_run_and_says_what_was_skipped_and_why() -> None:
    outcomes = [
        Outcome(
            "a",
            "off",
            "taskweaver",
            "scored",
            score=0.5,
            points=1,
            max_points=2,
            rounds=3,
            prompt_tokens=1000,
            cached_tokens=400,
            details=(PointResult("p", 1, True),),
        ),
        Outcome("b", "off", "taskweaver", "skipped", reason="data file x.csv not found in /cases/b"),
    ]
    text = render_markdown(outcomes, summarize(outcomes, [Setting("off")]))
    assert "| a | off | 0.50 (1/2) | 3 | 1,000 | 0 | 400 | 600 | 0 | 0.0 |" in text
    assert "- b @ off: **skipped**: data file x.csv not found in /cases/b" in text
    assert "| off | 0.50 | 1/2 |" in text


def test_the_examiner_and_the_judge_default_to_the_projects_model_and_take_partial_llm_mappings(tmp_path: Path) -> None:
    (tmp_path / "taskweaver_config.yaml").write_text("llm: {model: agent-model, context_window: 32000}\n", encoding="utf-8")
    plain = load_config(tmp_path)
    assert eval_llm(plain, "judge").model == eval_llm(plain, "examiner").model == "agent-model"
    config = load_config(tmp_path, ["eval.judge.llm.model=judge-model", "eval.examiner.llm.structured=off"])
    assert eval_llm(config, "judge").model == "judge-model" and eval_llm(config, "judge").context_window == 32000
    assert (eval_llm(config, "judge").structured, eval_llm(config, "examiner").structured) == ("auto", "off")
    broken = load_config(tmp_path, ["eval.examiner.llm.context_window=300"])
    with pytest.raises(ConfigError, match=r"eval\.examiner\.llm \(over llm\).*context_window"):
        eval_llm(broken, "examiner")


def test_a_setting_with_an_unknown_key_stops_the_command_before_any_run_naming_the_setting(tmp_path: Path) -> None:
    (tmp_path / "taskweaver_config.yaml").write_text("llm: {model: m}\n", encoding="utf-8")
    plan = EvalPlan(tmp_path, tmp_path / "report", (Setting("ok"), Setting("typo", ("round_compressor.rounds_to_retian=1",))))
    with pytest.raises(ConfigError, match=r"setting 'typo': --set round_compressor.rounds_to_retian: unknown config key 'rounds_to_retian'"):
        run_eval(load_cases([SHIPPED / "mean_units"]), plan)
    assert not (tmp_path / "report" / "results.jsonl").exists()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_each_run_is_kept_in_the_store_under_the_evaluations_id_and_a_resume_adds_to_the_same_record(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    (tmp_path / "taskweaver_config.yaml").write_text("llm: {model: m}\n", encoding="utf-8")
    team = (f"store.url={request.getfixturevalue('postgres_url')}",) if backend == "postgresql" else ()
    plan = EvalPlan(tmp_path, tmp_path / "report", (Setting("off"), Setting("tight")), overrides=team)
    cases = load_cases([tmp_path / "not_there"])  # skipped with its reason: the record needs no kernel
    outcomes = run_eval(cases, plan)
    run_id = (plan.report_dir / RUN_ID_FILE).read_text(encoding="utf-8").strip()
    run_eval(cases, EvalPlan(tmp_path, plan.report_dir, plan.settings, overrides=team, resume=True))
    assert (plan.report_dir / RUN_ID_FILE).read_text(encoding="utf-8").strip() == run_id, "--resume goes on under the same id"
    store = open_store(load_config(tmp_path, [*team, f"store.path={plan.report_dir / 'sessions.db'}"]))
    try:
        kept = store.eval_results(run_id)
    finally:
        store.close()
    assert sorted(kept) == ["not_there @ off", "not_there @ tight"]
    assert [Outcome.from_dict(kept[f"{o.case} @ {o.setting}"]) for o in outcomes] == outcomes
    assert kept["not_there @ off"]["status"] == "skipped" and "not_there" in kept["not_there @ off"]["reason"]


def test_report_folder_defaults_to_a_timestamp_and_resume_finds_the_newest(tmp_path: Path) -> None:
    fresh = report_folder(tmp_path, output=None, resume=False)
    assert fresh.parent == tmp_path / "eval" and fresh.name[:8].isdigit()
    with pytest.raises(ConfigError, match="--resume: no earlier report"):
        report_folder(tmp_path, output=None, resume=True)
    for name in ("20260101-000000", "20260102-000000"):
        (tmp_path / "eval" / name).mkdir(parents=True)
        (tmp_path / "eval" / name / "results.jsonl").write_text("", encoding="utf-8")
    assert report_folder(tmp_path, output=None, resume=True).name == "20260102-000000"


def test_the_scripted_judge_says_no_to_what_it_cannot_check_by_text() -> None:
    conversation = 'Conversation:\n[{"speaker": "agent", "text": "Hello World from Microsoft"}]\n\nStatement:\n'
    assert '"yes"' in judge(conversation + "The affiliation list should include Microsoft")
    assert '"no"' in judge(conversation + "The author list should include at least Bo Qiao")
    assert "checks numbers, quoted phrases and names only" in judge(conversation + "The code should not be executed.")
    assert '"yes"' in judge(conversation + '\\"Hello World\\" should appear in the last agent response')


def test_a_folder_is_searched_for_cases_at_any_depth_and_its_scripts_and_data_are_not_cases(tmp_path: Path) -> None:
    case = tmp_path / "auto_eval" / "cases" / "echo"
    case.mkdir(parents=True)
    (case / "echo.yaml").write_text("task_description: t\nscoring_points: [{score_point: s, weight: 1}]\n", encoding="utf-8")
    (case / "docs").mkdir()  # a case's own data folder
    (tmp_path / "auto_eval" / "evaluator.py").write_text("import yaml\n", encoding="utf-8")
    (tmp_path / "auto_eval" / "data").mkdir()
    (tmp_path / "auto_eval" / "data" / "x.csv").write_text("a\n1\n", encoding="utf-8")
    assert [(type(c).__name__, c.name) for c in load_cases([tmp_path / "auto_eval"])] == [("TaskCase", "echo")]
