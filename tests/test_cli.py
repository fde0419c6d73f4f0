"""`taskweaver-lite chat` and friends, driven as a user would: a subprocess with piped stdin."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from helpers import make_project, run_cli, running_cli, watch_stderr

from taskweaver_lite.testing.scripted_server import Reply, ScriptedServer, code_reply, planner_reply

pytestmark = pytest.mark.cli


def test_piped_stdin_prints_each_answer_to_stdout_exactly(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    server.enqueue("planner", planner_reply("Hello! What shall we analyse?", send_to="User"))
    server.enqueue("planner", planner_reply("Put 2 + 3 in a variable s and print it."), planner_reply("2 + 3 = 5", send_to="User"))
    server.enqueue("code_generator", code_reply("s = 2 + 3\nprint(s)"))
    done = run_cli("chat", "-p", str(project), stdin="hi\n\n   \nwhat is 2 + 3?\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Hello! What shall we analyse?\n2 + 3 = 5\n"
    assert "Running code" in done.stderr and "s = 2 + 3" in done.stderr


def test_a_multi_step_request_runs_each_step_in_the_same_kernel(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    server.enqueue(
        "planner",
        planner_reply("Create a list nums with 1..10.", plan="1. make nums\n2. sum nums"),
        planner_reply("Print the sum of nums.", plan="1. make nums\n2. sum nums", current_plan_step="2. sum nums"),
        planner_reply("The sum of 1..10 is 55.", send_to="User"),
    )
    server.enqueue("code_generator", code_reply("nums = list(range(1, 11))"), code_reply("print(sum(nums))"))
    done = run_cli("chat", "-p", str(project), stdin="sum the numbers one to ten\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "The sum of 1..10 is 55.\n"
    final_planner_prompt = [r for r in server.requests if r.role == "planner"][-1].messages
    assert "55" in final_planner_prompt[-1]["content"]


def test_a_code_error_is_fixed_and_the_fix_is_reported(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    server.enqueue("planner", planner_reply("Print the mean of [2, 4]."), planner_reply("The mean is 3.", send_to="User"))
    server.enqueue(
        "code_generator", code_reply("import statistics\nprint(statistics.meen([2, 4]))"), code_reply("import statistics\nprint(statistics.mean([2, 4]))")
    )
    done = run_cli("chat", "-p", str(project), stdin="mean of 2 and 4\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "The mean is 3.\n"
    assert "AttributeError" in done.stderr and "after 1 fixes" in [r for r in server.requests if r.role == "planner"][-1].messages[-1]["content"]


def test_a_malformed_reply_is_repaired(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    server.enqueue("planner", "Sure! Here is my answer: send it to the user.", planner_reply("Repaired answer.", send_to="User"))
    done = run_cli("chat", "-p", str(project), stdin="hello\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Repaired answer.\n"
    assert "malformed" in done.stderr.lower()


def test_rate_limit_then_success(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    server.enqueue("planner", Reply(status=429), planner_reply("Got through.", send_to="User"))
    done = run_cli("chat", "-p", str(project), stdin="hello\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Got through.\n"
    assert sum(r.role == "planner" for r in server.requests) == 2


def test_the_llm_down_gives_one_clear_line_and_a_non_zero_exit(tmp_path: Path) -> None:
    project = make_project(tmp_path, "http://127.0.0.1:9/v1", llm={"max_retries": 0, "timeout": 3})
    done = run_cli("chat", "-p", str(project), stdin="hello\nsecond line\n")
    assert done.returncode == 1
    assert done.stdout == ""
    errors = [line for line in done.stderr.splitlines() if "127.0.0.1:9" in line]
    assert len(errors) == 1 and errors[0].startswith("taskweaver-lite:"), done.stderr
    assert "Traceback" not in done.stderr
    stored = json.loads(run_cli("sessions", "-p", str(project), "--json").stdout)
    assert [(s["title"], s["rounds"]) for s in stored] == [("hello", 1)], "the session and its failed request were saved"


@pytest.mark.parametrize(
    ("yaml_text", "overrides", "expected"),
    [
        ("llm:\n  modle: x\n", [], ["taskweaver_config.yaml", "unknown key 'llm.modle'", "model"]),
        ("execution:\n  timeout: soon\n", [], ["taskweaver_config.yaml", "execution.timeout", "number"]),
        ("llm: [unclosed\n", [], ["taskweaver_config.yaml", "not valid YAML", "line"]),
        ("", ["round_compressor.rounds_to_retian=1"], ["--set round_compressor.rounds_to_retian", "rounds_to_retain"]),
        ("", ["planner.prompt_compression=maybe"], ["--set planner.prompt_compression=maybe", "boolean"]),
        ("llm:\n  model: gpt\n   bad: indent\n", [], ["taskweaver_config.yaml", "line 3", "mapping values are not allowed here"]),
        ("llm:\n  modle: x\n  api_bsae: y\nplanner: {x: 1}\n", [], ["'llm.modle' and 'llm.api_bsae'", "'planner.x'"]),
        ("", ["llm.x=1", "planner.y=2"], ["--set llm.x", "--set planner.y"]),
        ("", ["llm.api_base=[x"], ["--set llm.api_base=[x", "not valid YAML", "quote it"]),
        ("", ["llm.api_base=localhost:11434"], ["llm.api_base", "http://"]),
    ],
)
def test_a_bad_config_names_the_file_and_key_in_one_line(tmp_path: Path, yaml_text: str, overrides: list[str], expected: list[str]) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "taskweaver_config.yaml").write_text(yaml_text)
    args = ["chat", "-p", str(project)] + [a for o in overrides for a in ("--set", o)]
    done = run_cli(*args, stdin="hello\n", timeout=30)
    assert done.returncode != 0
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    for fragment in expected:
        assert fragment in done.stderr, done.stderr


def test_a_missing_project_folder_is_named_with_the_init_command_that_makes_it(tmp_path: Path) -> None:
    nowhere = tmp_path / "nowhere"
    done = run_cli("chat", "-p", str(nowhere), stdin="hello\n", timeout=30)
    assert done.returncode != 0 and "project folder not found" in done.stderr
    assert f"`taskweaver-lite init {nowhere}`" in done.stderr and "pass -p" not in done.stderr, "-p was passed"
    default = run_cli("chat", stdin="hello\n", timeout=30, cwd=tmp_path)
    assert default.returncode != 0
    assert "project: project folder not found; create one with `taskweaver-lite init`, or pass -p PROJECT_DIR" in default.stderr


def test_a_data_file_given_as_the_project_is_named_as_a_file(tmp_path: Path) -> None:
    data = tmp_path / "sales.csv"
    data.write_text("a,b\n1,2\n", encoding="utf-8")
    done = run_cli("chat", "-p", str(data), stdin="hello\n", timeout=30)
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"{data} is a file, not a project folder" in done.stderr and "/load it" in done.stderr


def test_no_replay_without_resume_is_an_error(tmp_path: Path) -> None:
    done = run_cli("chat", "--no-replay", stdin="hello\n", timeout=30, cwd=tmp_path)
    assert done.returncode == 2 and "--no-replay only applies to a resumed session" in done.stderr


def test_load_copies_the_file_and_the_planner_is_told(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    data = tmp_path / "prices.csv"
    data.write_text("item,price\napple,3\npear,4\n")
    server.enqueue("planner", planner_reply("Read prices.csv and print the total price."), planner_reply("Total: 7", send_to="User"))
    server.enqueue("code_generator", code_reply("import pandas as pd\nprint(pd.read_csv('prices.csv').price.sum())"))
    done = run_cli("chat", "-p", str(project), stdin=f"/load {data}\nwhat do the prices add up to?\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Total: 7\n"
    first_prompt = next(r for r in server.requests if r.role == "planner").messages
    assert 'loaded the file "prices.csv"' in first_prompt[-1]["content"]
    assert list(project.glob("sessions/*/cwd/prices.csv"))


def test_ctrl_c_cancels_the_running_step_and_the_session_goes_on(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    server.enqueue(
        "planner",
        planner_reply("Set x = 5, then wait a minute."),
        planner_reply("Print x."),
        planner_reply("Printed x.", send_to="User"),
    )
    server.enqueue("code_generator", code_reply("x = 5\nimport time\ntime.sleep(60)"), code_reply("print('x is', x)"))
    with running_cli("chat", "-p", str(project)) as proc:
        lines, running, reader = watch_stderr(proc, "time.sleep(60)")
        assert proc.stdin is not None
        proc.stdin.write("wait for a minute\nnow print x\n")
        proc.stdin.close()
        assert running.wait(60), "".join(lines)
        time.sleep(0.5)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.wait(timeout=60)
        reader.join(timeout=5)
    assert proc.returncode == 0, "".join(lines)
    assert time.monotonic() - started < 30, "the cell was not interrupted"
    assert "Cancelled" in "".join(lines)
    assert out == "Printed x.\n"
    last_planner = [r for r in server.requests if r.role == "planner"][-1].messages
    assert "x is 5" in last_planner[-1]["content"], "variables from before the cancel survive"


def test_sessions_delete_removes_a_session_for_good_and_refuses_one_a_chat_has_open(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    server.set_default("planner", planner_reply("Noted.", send_to="User"))
    assert run_cli("chat", "-p", str(project), stdin="first\n").returncode == 0
    [gone] = json.loads(run_cli("sessions", "-p", str(project), "--json").stdout)
    with running_cli("chat", "-p", str(project), "--resume", gone["id"]) as proc:
        lines, answered, reader = watch_stderr(proc, "Resumed")
        assert answered.wait(60), "".join(lines)
        refused = run_cli("sessions", "-p", str(project), "--delete", gone["id"])
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=60)
        reader.join(timeout=5)
    assert refused.returncode == 1 and "open in another" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    assert (project / "sessions" / gone["id"]).is_dir(), "a refused delete leaves the session as it was"
    done = run_cli("sessions", "-p", str(project), "--delete", gone["id"])
    assert done.returncode == 0 and f"Deleted session {gone['id']}" in done.stdout, done.stderr
    assert json.loads(run_cli("sessions", "-p", str(project), "--json").stdout) == []
    assert not (project / "sessions" / gone["id"]).exists(), "its folder (working files, plots) goes with it"
    again = run_cli("sessions", "-p", str(project), "--delete", gone["id"])
    assert again.returncode == 1 and f"no session '{gone['id']}'" in again.stderr, again.stderr
