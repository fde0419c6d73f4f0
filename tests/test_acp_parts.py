"""The ACP agent's parts without a program: the plan's entries, a cell's tool call, a prompt's text, and what an editor's
folder and MCP servers become as a session's settings (lent read-only, or not, and why)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from acp import text_block
from acp.schema import EnvVariable, HttpMcpServer, ImageContentBlock, McpServerStdio, ResourceContentBlock

from taskweaver_lite.acp.agent import prompt_text
from taskweaver_lite.acp.folders import FolderError, editor_settings, python_name
from taskweaver_lite.acp.updates import TurnUpdates, fenced, plan_update
from taskweaver_lite.config.file import load_config
from taskweaver_lite.records.conversation import Plan, Post
from taskweaver_lite.records.events import CellPrinted, PostAdded, ReplyStreamed, Working
from taskweaver_lite.records.execution import ExecutionResult
from taskweaver_lite.records.model_calls import Delta

pytestmark = pytest.mark.unit

PLAN = "1. load sales.csv\n2. sum the amount column <sequentially depends on 1>\n3. report the total"


def statuses(plan: Plan, *, done: bool = False) -> list[tuple[str, str]]:
    return [(entry.content, entry.status) for entry in plan_update(plan, done=done).entries]


def test_the_plan_moves_step_by_step_by_number_or_by_words() -> None:
    assert statuses(Plan(PLAN, PLAN, "2. sum the amount column")) == [
        ("load sales.csv", "completed"),
        ("sum the amount column <sequentially depends on 1>", "in_progress"),
        ("report the total", "pending"),
    ]
    assert [status for _, status in statuses(Plan(PLAN, PLAN, "report the total"))] == ["completed", "completed", "in_progress"]
    assert [status for _, status in statuses(Plan(PLAN, PLAN, "1. load sales.csv"), done=True)] == ["completed"] * 3


def test_a_fence_is_longer_than_any_backticks_inside() -> None:
    assert fenced("print(1)", "python") == "```python\nprint(1)\n```"
    assert fenced("a ```` b") == "`````\na ```` b\n`````"


def test_a_cells_tool_call_starts_with_its_code_and_ends_with_its_output_and_plot(tmp_path: Path) -> None:
    sent: list[Any] = []
    turn = TurnUpdates(sent.append)
    png = tmp_path / "plot.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + b"0" * 64)
    turn.listen(PostAdded(round=None, post=Post(send_from="Planner", send_to="CodeInterpreter", message="Plot the sales.")))  # type: ignore[arg-type]
    turn.listen(Working("code_running", "plot(sales)"))
    turn.listen(CellPrinted("stdout", "drawing\n"))
    result = ExecutionResult(code="plot(sales)", success=True, stdout="drawing\n", artifacts=(str(png),))
    turn.listen(PostAdded(round=None, post=Post(send_from="CodeInterpreter", send_to="Planner", message="done", execution=result)))  # type: ignore[arg-type]
    start, live, end = sent
    assert (start.session_update, start.kind, start.status, start.title) == ("tool_call", "execute", "in_progress", "Plot the sales.")
    assert start.raw_input == {"code": "plot(sales)"}
    assert live.tool_call_id == end.tool_call_id == start.tool_call_id and "drawing" in live.content[1].content.text
    assert end.status == "completed" and "Output:\ndrawing" in end.raw_output
    [image] = [item.content for item in end.content if isinstance(item.content, ImageContentBlock)]
    assert image.mime_type == "image/png"


def test_a_prompt_is_its_text_with_linked_files_named_by_path_and_other_content_is_refused() -> None:
    link = ResourceContentBlock(type="resource_link", name="sales.csv", uri="file:///home/ana/data/sales%202026.csv")
    assert prompt_text([text_block("\n sum it"), link]) == "sum it\n\n(the file /home/ana/data/sales 2026.csv)"
    with pytest.raises(Exception, match="a prompt takes text and links to files, not image content"):
        prompt_text([ImageContentBlock(type="image", data="", mime_type="image/png")])


def test_the_editors_folder_is_lent_read_only_unless_it_holds_the_project_or_the_sandbox_is_off(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    folder = tmp_path / "analysis"
    folder.mkdir()
    config = load_config(project)
    lent = editor_settings(config, cwd=str(folder))
    assert lent.lent == folder and lent.notices == ()
    assert load_config(project, list(lent.overrides)).execution.mounts[-1].model_dump() == {"path": str(folder), "mode": "ro"}
    inside = editor_settings(config, cwd=str(project))
    assert inside.lent is None and inside.overrides == ()
    assert "which the sandbox hides (the config holds the model's key)" in inside.notices[0]
    unsandboxed = editor_settings(load_config(project, ["execution.sandbox=none"]), cwd=str(folder))
    assert unsandboxed.lent is None and "read-only cannot be kept" in unsandboxed.notices[0]
    with pytest.raises(FolderError, match="cwd must be an absolute path"):
        editor_settings(config, cwd="analysis")


def test_the_editors_stdio_servers_join_mcp_servers_under_python_names_and_http_ones_are_said_to_be_left_out(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    servers = [
        McpServerStdio(name="my-files", command="/usr/bin/files-server", args=["--root", "/data"], env=[EnvVariable(name="TOKEN", value="t")]),
        HttpMcpServer(type="http", name="web", url="http://127.0.0.1:9/mcp", headers=[]),
    ]
    settings = editor_settings(load_config(project), cwd=str(tmp_path), servers=servers)
    config = load_config(project, list(settings.overrides))
    assert config.mcp.servers["my_files"].command == ["/usr/bin/files-server", "--root", "/data"] and config.mcp.servers["my_files"].env == {"TOKEN": "t"}
    assert "runs beside the kernel as my_files: a cell calls its tools as my_files.TOOL(...)" in settings.notices[0]
    assert "'web' is not started: only servers run by a command (stdio)" in settings.notices[1]
    assert [python_name(name) for name in ("clock", "2fa", "class", "a b")] == ["clock", "_2fa", "_class", "a_b"]


def test_the_answer_streams_as_it_is_written_once_and_a_reasoning_models_thinking_is_a_thought() -> None:
    sent: list[Any] = []
    turn = TurnUpdates(sent.append)
    reply = json.dumps(
        {"response": {"init_plan": "1. answer", "plan": "1. answer", "current_plan_step": "1. answer", "send_to": "User", "message": "The total is 600."}}
    )
    turn.listen(ReplyStreamed("planner", Delta("start")))
    turn.listen(ReplyStreamed("planner", Delta("reasoning", "The user wants the sum. ")))
    turn.listen(ReplyStreamed("planner", Delta("content", "<think>Three rows.</think>")))
    for start in range(0, len(reply), 7):
        turn.listen(ReplyStreamed("planner", Delta("content", reply[start : start + 7])))
    streamed = "".join(update.content.text for update in sent if update.session_update == "agent_message_chunk")
    assert streamed == "The total is 600." and len([u for u in sent if u.session_update == "agent_message_chunk"]) > 1
    turn.listen(PostAdded(round=None, post=Post(send_from="Planner", send_to="User", message="The total is 600.")))  # type: ignore[arg-type]
    answer = "".join(update.content.text for update in sent if update.session_update == "agent_message_chunk")
    assert answer == "The total is 600.", "the posted answer adds nothing that streamed already"
    thoughts = "".join(update.content.text for update in sent if update.session_update == "agent_thought_chunk")
    assert thoughts == "The user wants the sum. Three rows."


def test_a_step_to_a_role_does_not_stream_as_the_answer() -> None:
    sent: list[Any] = []
    turn = TurnUpdates(sent.append)
    reply = json.dumps(
        {"response": {"init_plan": "1. sum", "plan": "1. sum", "current_plan_step": "1. sum", "send_to": "CodeInterpreter", "message": "Sum it."}}
    )
    turn.listen(ReplyStreamed("planner", Delta("start")))
    turn.listen(ReplyStreamed("planner", Delta("content", reply)))
    assert [update for update in sent if update.session_update == "agent_message_chunk"] == []
