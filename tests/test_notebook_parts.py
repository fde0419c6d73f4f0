"""The parts of `%%ask` that need no kernel: its options, which notebook and project a kernel has, the index of sessions, the history's text."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskweaver_lite.config.file import merge_overrides
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.notebook.cell_view import code_block
from taskweaver_lite.notebook.magics import AskError, AskOptions, history_text, parse_ask, questions_kept
from taskweaver_lite.notebook.notebook_session import SessionIndex, notebook_identity, notebook_project
from taskweaver_lite.records.conversation import Post, Round
from taskweaver_lite.roles.planner import list_working_files

pytestmark = pytest.mark.unit


def test_the_cell_is_the_request_and_the_line_holds_the_options() -> None:
    assert parse_ask("--set llm.model=gpt-4o --insert --set=execution.timeout=600", "what grew?\nby region") == AskOptions(
        request="what grew?\nby region", overrides=("llm.model=gpt-4o", "execution.timeout=600"), insert=True
    )
    assert parse_ask("--set 'llm.model=big model' sum units") == AskOptions(request="sum units", overrides=("llm.model=big model",))
    assert parse_ask("  what is --insert for?") == AskOptions(request="what is --insert for?"), "options only lead the line"
    assert parse_ask("--insert Plot units", "by region") == AskOptions(request="Plot units\nby region", insert=True), "the first line may begin the request"


@pytest.mark.parametrize(
    ("line", "cell", "says"),
    [
        ("", "  \n", "no request"),
        ("--insert", None, "no request"),
        ("--sett x=1", "hello", "unknown option '--sett'"),
        ("--frobnicate hello", None, "unknown option '--frobnicate'"),
        ("--set llm.model", "hello", "--set llm.model: expected KEY=VALUE"),
    ],
)
def test_a_bad_line_is_refused_with_what_to_write(line: str, cell: str | None, says: str) -> None:
    with pytest.raises(AskError, match=says.replace("(", r"\(").replace(".", r"\.")) as raised:
        parse_ask(line, cell)
    assert raised.value._render_traceback_()[0].startswith("taskweaver-lite: ")


def test_a_question_mark_ends_a_question_not_a_help_request() -> None:
    assert questions_kept(["%ask what grew so far?\n"]) == ["get_ipython().run_line_magic('ask', 'what grew so far?')\n"]
    assert questions_kept(["%ask?\n", "%ask_history\n", "x = 1?\n"]) == ["%ask?\n", "%ask_history\n", "x = 1?\n"]
    assert questions_kept(["%%ask\n", "%ask is it?\n"]) == ["%%ask\n", "%ask is it?\n"], "a cell magic's text is left alone"


def test_the_notebook_is_known_by_the_path_its_front_end_gave_else_by_its_folder(tmp_path: Path) -> None:
    env = {"JPY_SESSION_NAME": "/home/ana/sales.ipynb"}
    assert notebook_identity({"__session__": "/home/ana/q3.ipynb"}, env, tmp_path).key == "/home/ana/q3.ipynb"
    assert notebook_identity({}, env, tmp_path).source == "JPY_SESSION_NAME"
    assert notebook_identity({"__vsc_ipynb_file__": "/x/v.ipynb"}, {}, tmp_path).key == "/x/v.ipynb"
    folder = notebook_identity({"__session__": ""}, {}, tmp_path)
    assert (folder.key, folder.source) == (str(tmp_path.resolve()), "working folder")


def test_the_project_is_the_variable_then_the_working_folder_then_the_defaults(tmp_path: Path) -> None:
    named, work, state = tmp_path / "named", tmp_path / "work", tmp_path / "state"
    named.mkdir()
    work.mkdir()
    assert notebook_project({"TASKWEAVER_LITE_PROJECT": str(named)}, work).folder == named
    with pytest.raises(ConfigError, match=r"TASKWEAVER_LITE_PROJECT=.*missing: no such project folder"):
        notebook_project({"TASKWEAVER_LITE_PROJECT": str(tmp_path / "missing")}, work)
    defaults = notebook_project({"XDG_STATE_HOME": str(state)}, work)
    assert (defaults.folder, defaults.source) == (state / "taskweaver-lite" / "notebooks", "defaults")
    (work / "project").mkdir()
    (work / "project" / "taskweaver_config.yaml").write_text("llm: {model: m}\n")
    assert notebook_project({}, work).folder == work / "project"
    (work / "taskweaver_config.yaml").write_text("llm: {model: m}\n")
    assert notebook_project({}, work).folder == work


def test_each_notebook_keeps_its_session_id_until_reset(tmp_path: Path) -> None:
    index = SessionIndex(tmp_path / "notebooks")
    assert index.get("/a.ipynb") is None
    index.set("/a.ipynb", "s1")
    index.set("/b.ipynb", "s2")
    assert (index.get("/a.ipynb"), index.get("/b.ipynb")) == ("s1", "s2")
    assert SessionIndex(tmp_path / "notebooks").get("/a.ipynb") == "s1", "read again by a restarted kernel"
    index.forget("/a.ipynb")
    assert index.get("/a.ipynb") is None and index.get("/b.ipynb") == "s2"


def test_later_settings_win_in_the_order_keys_first_came() -> None:
    assert merge_overrides(["a=1", "b=2"], ["b=3", "c=4"]) == ["a=1", "b=3", "c=4"]


def test_the_history_lists_each_request_with_how_it_ended() -> None:
    done = Round(index=1, user_query="sum | units", posts=[Post(send_from="Planner", send_to="User", message="60")], state="finished")
    stopped = Round(index=2, user_query="slow", state="failed", error="Cancelled by the user.")
    markdown, plain = history_text("s1", [done, stopped])
    assert plain == "Session s1 of this notebook: 2 requests.\n1. sum | units -> 60\n2. slow -> failed: Cancelled by the user."
    assert "| 1 | sum \\| units | 60 |" in markdown
    assert history_text(None, []) == ("No requests yet in this notebook's session.",) * 2


def test_code_shows_in_a_fence_longer_than_any_inside_it() -> None:
    assert code_block("x = 1\n") == "```python\nx = 1\n```"
    assert code_block('s = """````"""').startswith("`````python\n")


def test_the_planners_file_list_never_enters_hidden_folders_and_bounds_its_scan(tmp_path: Path) -> None:
    # A notebook's folder is the analyst's: a .venv of thousands of files there must not be walked at every Planner call.
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "sales.csv").write_text("a,b\n")
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / ".hidden.csv").write_text("x")
    (tmp_path / "to_data").symlink_to(tmp_path / "data")
    venv = tmp_path / ".venv" / "lib"
    venv.mkdir(parents=True)
    for number in range(50):
        (venv / f"module{number}.py").write_text("")
    listed = list_working_files(tmp_path, scan=10)
    assert listed == ["data/sales.csv (4 B)", "notes.txt (1 B)", "to_data (a link, not followed)"], "nothing of .venv was looked at"
    for number in range(12):
        (tmp_path / f"part{number:02d}.csv").write_text("")
    bounded = list_working_files(tmp_path, limit=3, scan=10)
    assert bounded[-1] == "... (a large folder: only its first 10 entries were looked at)"
