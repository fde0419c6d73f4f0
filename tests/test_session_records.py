"""What a chat leaves behind and tells the user: /load in the records, --set kept for resume, the
resume hint on exit, and exports that pick their format and never overwrite silently."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from helpers import REPO, make_project, run_cli

from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply

pytestmark = pytest.mark.cli


def test_load_set_values_and_the_exit_hint_survive_into_resume_and_exports(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    data = tmp_path / "prices.csv"
    data.write_text("item,price\napple,3\n")
    server.enqueue("planner", planner_reply("It has one row.", send_to="User"))
    first = run_cli("chat", "-p", str(project), "--set", "round_compressor.rounds_to_retain=1", stdin=f"/load {data}\nwhat is in it?\n/history\n")
    assert first.returncode == 0, first.stderr
    assert first.stdout == "It has one row.\n"
    assert f"(Loaded prices.csv into the working folder (from {data}))" in first.stderr, "/history shows the /load"
    session_id = json.loads(run_cli("sessions", "-p", str(project), "--json").stdout)[0]["id"]
    assert first.stderr.rstrip().endswith(f"Session {session_id} is saved. Continue it with: taskweaver-lite chat -p {project} --resume {session_id}")

    resumed = run_cli("chat", "-p", str(project), "--resume", "last", stdin="")
    assert resumed.returncode == 0, resumed.stderr
    assert "Re-applied the settings this session was started with: --set round_compressor.rounds_to_retain=1" in resumed.stderr
    assert "Re-ran 0" not in resumed.stderr, "no cells ran, so there is nothing to say about re-running them"

    markdown = tmp_path / "out.md"
    done = run_cli("export", "last", "-p", str(project), "-o", str(markdown))
    assert done.returncode == 0, done.stderr
    assert f"*Loaded `prices.csv` into the working folder (from {data}).*" in markdown.read_text(encoding="utf-8")
    again = run_cli("export", "last", "-p", str(project), "-o", str(markdown))
    assert again.returncode == 1 and "exists and was left as it is" in again.stderr and "--force" in again.stderr
    assert run_cli("export", "last", "-p", str(project), "-o", str(markdown), "--force").returncode == 0
    notebook = tmp_path / "out.ipynb"
    assert run_cli("export", "last", "-p", str(project), "-o", str(notebook)).returncode == 0
    assert json.loads(notebook.read_text(encoding="utf-8"))["nbformat"] == 4, "the format came from the file name"
    unclear = run_cli("export", "last", "-p", str(project), "-o", str(tmp_path / "out.txt"))
    assert unclear.returncode == 1 and "cannot tell the format" in unclear.stderr


def test_an_unknown_session_names_the_listing_command_with_its_project(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    server.enqueue("planner", planner_reply("Hi.", send_to="User"))
    assert run_cli("chat", "-p", str(project), stdin="hello\n").returncode == 0
    for command in (("export", "nosuch"), ("chat", "--resume", "nosuch")):
        done = run_cli(*command, "-p", str(project))
        assert done.returncode == 1
        assert "no session 'nosuch'" in done.stderr and f"run `taskweaver-lite sessions -p {project}` to see the ids" in done.stderr


def test_a_chat_without_requests_says_there_is_nothing_to_resume(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    done = run_cli("chat", "-p", str(project), stdin="/info\n")
    assert done.returncode == 0, done.stderr
    assert re.search(r"Session \S+ had no requests; nothing was kept to resume\.$", done.stderr.rstrip())


def test_the_chat_history_file_is_ignored_by_git() -> None:
    try:
        ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", "project/.chat_history"], capture_output=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("git is not installed")
    if ignored.returncode == 128:
        pytest.skip("not a git checkout")
    assert ignored.returncode == 0, "project/.chat_history is not in .gitignore"


def test_a_failed_step_shows_the_users_frames_and_last_shows_the_whole_traceback(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url, code_interpreter={"max_retry_count": 0})
    server.enqueue("planner", planner_reply("Print column b of a frame."), planner_reply("There is no column b.", send_to="User"))
    server.enqueue("code_generator", code_reply("import pandas as pd\nframe = pd.DataFrame({'a': [1]})\nframe['b']"))
    done = run_cli("chat", "-p", str(project), stdin="show b\n/last\n")
    assert done.returncode == 0, done.stderr
    step, _, last = done.stderr.partition("The last cell that ran (request 1)")
    assert "KeyError: 'b'" in step and "----> 3 frame['b']" in step and "/last shows the whole traceback" in step
    assert "pandas/core" not in step, "library frames stay off the screen"
    assert "pandas/core" in last and "frame['b']" in last
