"""TaskWeaver's example folders (`planner_examples`, `code_generator_examples`) reach the prompts in its own format."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import cli_env

from taskweaver_lite.roles.examples import load_examples
from taskweaver_lite.testing.scripted_server import ScriptedServer, planner_reply

pytestmark = pytest.mark.unit

# Written in TaskWeaver's example format (rounds of posts with typed attachments), as its project/examples hold them.
PLANNER_EXAMPLE = {
    "enabled": True,
    "rounds": [
        {
            "user_query": "how many rows has sales.csv",
            "state": "created",
            "post_list": [
                {"message": "how many rows has sales.csv", "send_from": "User", "send_to": "Planner", "attachment_list": []},
                {
                    "message": "Load sales.csv and count its rows",
                    "send_from": "Planner",
                    "send_to": "CodeInterpreter",
                    "attachment_list": [
                        {"type": "plan_reasoning", "content": "Count the rows."},
                        {"type": "init_plan", "content": "1. Load and count\n2. Report"},
                        {"type": "plan", "content": "1. Load and count\n2. Report"},
                        {"type": "current_plan_step", "content": "1. Load and count"},
                        {"type": "stop", "content": "InProcess"},
                    ],
                },
                {"message": "sales.csv has 42 rows", "send_from": "CodeInterpreter", "send_to": "Planner", "attachment_list": None},
                {
                    "message": "sales.csv has 42 rows.",
                    "send_from": "Planner",
                    "send_to": "User",
                    "attachment_list": [
                        {"type": "init_plan", "content": "1. Load and count\n2. Report"},
                        {"type": "plan", "content": "1. Load and count\n2. Report"},
                        {"type": "current_plan_step", "content": "2. Report"},
                    ],
                },
            ],
        }
    ],
}
ECHO_EXAMPLE = {
    "enabled": True,
    "rounds": [
        {
            "user_query": "echo hi",
            "state": "created",
            "post_list": [
                {"message": "echo hi", "send_from": "User", "send_to": "Planner", "attachment_list": []},
                {"message": "hi", "send_from": "Planner", "send_to": "Echo", "attachment_list": []},
            ],
        }
    ],
}
CODE_EXAMPLE = {
    "enabled": True,
    "rounds": [
        {
            "user_query": "ten random numbers",
            "state": "finished",
            "post_list": [
                {"message": "make ten random numbers", "send_from": "Planner", "send_to": "CodeInterpreter", "attachment_list": []},
                {
                    "message": "done",
                    "send_from": "CodeInterpreter",
                    "send_to": "Planner",
                    "attachment_list": [
                        {"type": "thought", "content": "{ROLE_NAME} draws them with numpy."},
                        {"type": "reply_type", "content": "python"},
                        {"type": "reply_content", "content": "import numpy as np\nnp.random.rand(10)"},
                        {"type": "verification", "content": "CORRECT"},
                        {"type": "execution_status", "content": "SUCCESS"},
                        {"type": "execution_result", "content": "array of 10 floats"},
                    ],
                },
            ],
        }
    ],
}


def taskweaver_examples(project: Path) -> Path:
    for folder, files in {
        "planner_examples": {"example-planner-count.yaml": PLANNER_EXAMPLE, "example-planner-echo.yaml": ECHO_EXAMPLE},
        "code_generator_examples": {"example-codeinterpreter-1.yaml": CODE_EXAMPLE, "example-off.yaml": {**CODE_EXAMPLE, "enabled": False}},
    }.items():
        (project / "examples" / folder).mkdir(parents=True)
        for name, data in files.items():
            (project / "examples" / folder / name).write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return project


def test_a_planner_example_becomes_the_planners_side_of_the_conversation(tmp_path: Path) -> None:
    messages = load_examples(taskweaver_examples(tmp_path), "planner", party="Planner", parties={"Planner", "User", "CodeInterpreter"})
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"], "the Echo example waits for an echo role"
    assert messages[0]["content"] == "how many rows has sales.csv"
    first = json.loads(messages[1]["content"])["response"]
    assert first == {
        "init_plan": "1. Load and count\n2. Report",
        "plan": "1. Load and count\n2. Report",
        "current_plan_step": "1. Load and count",
        "send_to": "CodeInterpreter",
        "message": "Load sales.csv and count its rows",
    }
    assert messages[2]["content"] == "CodeInterpreter: sales.csv has 42 rows"
    assert json.loads(messages[3]["content"])["response"]["send_to"] == "User"


def test_an_example_naming_a_role_is_used_once_that_role_is_enabled(tmp_path: Path) -> None:
    messages = load_examples(taskweaver_examples(tmp_path), "planner", party="Planner", parties={"Planner", "User", "CodeInterpreter", "Echo"})
    assert [m["content"] for m in messages if m["role"] == "user"][-1] == "echo hi"


def test_a_code_generator_example_gives_its_code_reply_and_the_result_it_was_shown(tmp_path: Path) -> None:
    messages = load_examples(taskweaver_examples(tmp_path), "code_generator", party="CodeInterpreter", parties={"CodeInterpreter", "Planner"})
    assert [m["role"] for m in messages] == ["user", "assistant", "user"], "the disabled file is left out"
    assert messages[0]["content"] == "make ten random numbers"
    assert json.loads(messages[1]["content"])["response"] == {
        "thought": "CodeInterpreter draws them with numpy.",
        "reply_type": "python",
        "reply_content": "import numpy as np\nnp.random.rand(10)",
    }
    assert messages[2]["content"] == "Execution result of the code above:\narray of 10 floats"


@pytest.mark.cli
def test_a_taskweaver_project_with_llm_variables_chats_with_its_own_examples_in_the_prompt(tmp_path: Path) -> None:
    project = taskweaver_examples(tmp_path / "project")
    (project / "taskweaver_config.json").write_text(
        json.dumps({"llm.api_base": "https://api.openai.com/v1", "llm.api_key": "", "llm.model": "gpt-4-1106-preview"}), encoding="utf-8"
    )
    with ScriptedServer(model="tw-model", api_key="tw-key") as server:
        server.enqueue("planner", planner_reply("Hello there.", send_to="User"))
        env = {**cli_env(), "LLM_API_BASE": server.url, "LLM_API_KEY": "tw-key", "LLM_MODEL": "tw-model"}
        done = subprocess.run(
            [sys.executable, "-m", "taskweaver_lite", "chat", "-p", str(project)],
            input="hello\n/context\n",
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Hello there.\n"
    (asked,) = [r for r in server.requests if r.role == "planner"]
    assert asked.body["model"] == "tw-model" and "how many rows has sales.csv" in json.dumps(asked.messages)
    planner_lines = done.stderr.split("Planner (", 1)[1].split("\n\n")[0]
    examples = next(line for line in planner_lines.splitlines() if line.strip().startswith("examples"))
    assert int(examples.split()[-1].replace(",", "")) > 0, done.stderr
