"""Changing course in a chat: /undo, /retry, /model NAME and /open N, over the real kernel and the scripted model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import cli_env, make_project, run_cli

from taskweaver_lite.config.file import load_config
from taskweaver_lite.store.database import SessionStore
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply

pytestmark = pytest.mark.cli


def stored(project: Path) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = json.loads(run_cli("sessions", "-p", str(project), "--json").stdout)
    return rows


def test_undo_drops_the_last_request_everywhere_and_rebuilds_the_kernel_without_it(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    server.enqueue("planner", planner_reply("Set x to 1."), planner_reply("x is 1.", send_to="User"))
    server.enqueue("planner", planner_reply("Set x to 100 and yvar to 2."), planner_reply("x is 100.", send_to="User"))
    server.enqueue("planner", planner_reply("Print x and whether y exists."), planner_reply("Printed.", send_to="User"))
    server.enqueue("code_generator", code_reply("x = 1"), code_reply("x = 100\nyvar = 2"), code_reply("print('x =', x, 'yvar' in dir())"))
    done = run_cli("chat", "-p", str(project), stdin="set x to 1\nmake x a hundred\n/undo\nshow x\n")
    assert done.returncode == 0, done.stderr
    assert "Undid request 2 ('make x a hundred')" in done.stderr
    assert "x = 1 False" in done.stderr, "the kernel holds what request 1 made, nothing of request 2"
    last_planner = [r for r in server.requests if r.role == "planner"][-1]
    assert "make x a hundred" not in json.dumps(last_planner.messages), "the undone request is gone from the prompt"
    last_coder = json.dumps([r for r in server.requests if r.role == "code_generator"][-1].messages)
    assert "yvar" not in last_coder and "- x (int): 1" in last_coder, "the CodeGenerator's variables are the rebuilt kernel's"
    assert [row["rounds"] for row in stored(project)] == [2]
    store = SessionStore(load_config(project).store_path)
    try:
        session = store.load(str(stored(project)[0]["id"]))
    finally:
        store.close()
    assert [r.user_query for r in session.rounds] == ["set x to 1", "show x"], "the store forgot it too (a resume will not bring it back)"


def test_retry_asks_the_last_request_again_in_place_of_its_answer(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    server.enqueue("planner", planner_reply("A poor answer.", send_to="User"), planner_reply("A better answer.", send_to="User"))
    done = run_cli("chat", "-p", str(project), stdin="what is it?\n/retry\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "A poor answer.\nA better answer.\n"
    assert "Retrying request 1 ('what is it?')" in done.stderr and "Undid" not in done.stderr, "it says it retries"
    asked = [r for r in server.requests if r.role == "planner"]
    assert "what is it?" in json.dumps(asked[1].messages[-1]) and "A poor answer" not in json.dumps(asked[1].messages)
    assert [row["rounds"] for row in stored(project)] == [1]


def test_model_switches_every_part_or_one_role_from_the_next_request_and_is_kept_for_resume(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    server.enqueue("planner", planner_reply("one", send_to="User"), planner_reply("Run it."), planner_reply("two", send_to="User"))
    server.enqueue("code_generator", code_reply("print(1)"))
    done = run_cli("chat", "-p", str(project), stdin="/model\nfirst\n/model big-model\n/model planner planner-model\nsecond\n/model\n")
    assert done.returncode == 0, done.stderr
    assert "Models now: planner scripted, code_generator scripted, round_compressor scripted." in done.stderr, "a bare /model shows them"
    assert "Models now: planner planner-model, code_generator big-model" in done.stderr
    models = [(r.role, r.body["model"]) for r in server.requests if r.role in ("planner", "code_generator")]
    assert models == [("planner", "scripted"), ("planner", "planner-model"), ("code_generator", "big-model"), ("planner", "planner-model")]
    assert "The planner's model is now planner-model from the next request on." in done.stderr
    store = SessionStore(load_config(project).store_path)
    try:
        kept = store.overrides(str(stored(project)[0]["id"]))
    finally:
        store.close()
    assert kept == ["llm.model=big-model", "planner.llm.model=planner-model"]


def test_piped_unknown_commands_are_refused_as_on_a_terminal_and_a_model_not_served_names_model(tmp_path: Path) -> None:
    with ScriptedServer(model="scripted") as checked:
        project = make_project(tmp_path, checked.url)
        done = run_cli("chat", "-p", str(project), stdin="/clear\n/h\n/img cat.png\n/model gpt-x\nhello\n")
    assert [r.body["model"] for r in checked.requests] == ["gpt-x"], "no command reached the model; the request went with /model's choice"
    for command in ("/clear", "/h", "/img"):
        assert f"Unknown command {command}. Type /help for the list." in done.stderr
    assert done.returncode == 1 and "check the name given to /model gpt-x (choose another with /model NAME)" in done.stderr, done.stderr
    assert "check llm.model" not in done.stderr


def test_open_lists_the_plots_and_hands_one_to_the_system_viewer(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url)
    viewer = tmp_path / "bin"
    viewer.mkdir()
    opened = tmp_path / "opened.txt"
    (viewer / "xdg-open").write_text(f'#!/bin/sh\necho "$1" > {opened}\n', encoding="utf-8")
    (viewer / "xdg-open").chmod(0o755)
    plot = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.savefig('trend.png')\nplt.show()\nopen('totals.csv', 'w').write('a,1')"
    server.enqueue("planner", planner_reply("Plot it."), planner_reply("Plotted.", send_to="User"))
    server.enqueue("code_generator", code_reply(plot))
    env = {**cli_env(), "PATH": f"{viewer}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        [sys.executable, "-m", "taskweaver_lite", "chat", "-p", str(project)],
        input="plot\n/open\n/open 9\n/open 1\n",
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "Files the cells produced (/open N shows one):\n  1. " in done.stderr
    listed = done.stderr.split("Files the cells produced")[1].split("Usage")[0]
    assert "trend.png" in listed and "totals.csv" in listed, "files the cells saved are listed, not only the captured plot"
    assert "Usage: /open N, N from 1 to" in done.stderr
    deadline = time.monotonic() + 10
    while not opened.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    shown = Path(opened.read_text(encoding="utf-8").strip())
    assert shown.suffix == ".png" and shown.is_file(), "the viewer got the plot's file"
