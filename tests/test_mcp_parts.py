"""The MCP parts that need no kernel and no process: the typed `mcp.servers` config, a tool's JSON Schema as the
CodeGenerator reads it, the network rule, Python names for tool names, and resource addresses."""

from __future__ import annotations

import base64
import json
import re
import threading
from pathlib import Path
from typing import Any

import jsonschema
import mcp_types as types
import pytest
from helpers import REPO
from mcp import MCPError

from taskweaver_lite.cli.main import main
from taskweaver_lite.cli.reference import config_keys
from taskweaver_lite.config.file import load_config
from taskweaver_lite.config.settings import McpServerConfig
from taskweaver_lite.errors import ConfigError, TaskWeaverError
from taskweaver_lite.kernel.mcp.client import python_name
from taskweaver_lite.kernel.mcp.launch import McpLaunch
from taskweaver_lite.mcp.resources import MAX_RESOURCE_BYTES, read_resource, resource_uri
from taskweaver_lite.mcp.server import MAX_QUESTION_CHARS, TOOLS, failed_answer, question_of, variables_result
from taskweaver_lite.plugins.prompt import render_mcp_block
from taskweaver_lite.records.execution import Variable
from taskweaver_lite.records.mcp_tools import McpServer, McpTool
from taskweaver_lite.session.lazy_workspace import LazyWorkspace

pytestmark = pytest.mark.unit


def config_error(tmp_path: Path, text: str) -> str:
    (tmp_path / "taskweaver_config.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        load_config(tmp_path)
    return str(refused.value)


def test_the_servers_config_is_typed_and_its_errors_name_the_key(tmp_path: Path) -> None:
    said = config_error(tmp_path, "mcp:\n  servers:\n    my-time:\n      command: [mcp-server-time]\n")
    assert "key 'mcp.servers'" in said and "'my-time' is not a python name" in said
    said = config_error(tmp_path, "mcp:\n  servers:\n    t:\n      command: []\n      cmd: x\n")
    assert "unknown key 'mcp.servers.t.cmd'; known keys here: command, env, network, start_timeout, call_timeout" in said
    assert "key 'mcp.servers.t.command': list should have at least 1 item" in said
    said = config_error(tmp_path, "mcp:\n  servers:\n    t: {command: [x]}\nexecution:\n  kernel_gateway: {url: 'http://gw:8888'}\n")
    assert "mcp.servers and execution.kernel_gateway conflict" in said
    (tmp_path / "taskweaver_config.yaml").write_text("mcp:\n  servers:\n    time: {command: [mcp-server-time], env: {TZ: UTC}}\n", encoding="utf-8")
    assert load_config(tmp_path).mcp.servers == {"time": McpServerConfig(command=["mcp-server-time"], env={"TZ": "UTC"})}
    assert {"mcp.servers", "mcp.servers.<NAME>.command", "mcp.servers.<NAME>.network"} <= set(config_keys())  # the reference page names each key


def test_a_tool_is_shown_as_a_method_with_keyword_arguments_from_its_json_schema() -> None:
    schema = {
        "type": "object",
        "properties": {
            "unit": {"type": "string", "enum": ["C", "F"], "default": "C"},
            "city": {"type": "string", "description": "where"},
            "days": {"type": ["integer", "null"]},
        },
        "required": ["city"],
    }
    tool = McpTool.from_dict({"name": "get-weather", "attribute": "get_weather", "description": "The weather.\nFrom a service.", "input_schema": schema})
    block = render_mcp_block([McpServer("weather", (tool,)), McpServer("gone", error="did not start")])
    assert block == (
        "```python\n"
        "class weather:  # MCP server: call its tools as weather.<tool>(name=value, ...)\n"
        "    def get_weather(*, city: str, unit: Literal['C', 'F'] = 'C', days: int | None = None) -> dict | list | str:\n"
        '        """The weather.\n'
        "\n"
        "        From a service.\n"
        "\n"
        "        Args:\n"
        "            city: where (required)\n"
        "            unit: (optional, default 'C')\n"
        "            days: (optional)\n"
        '        """\n'
        "```"
    )
    assert render_mcp_block([McpServer("gone", error="did not start")]) == ""


def test_a_server_that_needs_the_network_is_not_started_in_a_sandbox_without_one() -> None:
    servers = {"web": McpServerConfig(command=["fetch-server"], network=True), "time": McpServerConfig(command=["mcp-server-time"])}
    sandboxed = McpLaunch(servers, network=False)
    assert list(sandboxed.servers) == ["time"]
    [refused] = sandboxed.refused
    assert refused.line().startswith("MCP server web: not started: it needs the network (mcp.servers.web.network: true)")
    assert "execution.network: true" in refused.line()
    assert list(McpLaunch(servers, network=True).servers) == ["web", "time"]
    assert McpLaunch({}, network=True).code() == "" and McpLaunch({}, network=True).wait == 0


def test_tool_names_become_python_names() -> None:
    assert [python_name(n) for n in ("get-sum", "class", "2fa", "ok_name")] == ["get_sum", "class_", "_2fa", "ok_name"]


def test_ask_arguments_are_checked_before_anything_is_opened() -> None:
    assert question_of({"question": "hi"}) == ("hi", None)
    assert question_of({"question": "hi", "session_id": "abc"}) == ("hi", "abc")
    for arguments, said in (
        ({"question": "x" * (MAX_QUESTION_CHARS + 1)}, f"at most {MAX_QUESTION_CHARS:,}"),
        ({"question": 7}, "ask needs a question"),
        ({"question": "hi", "session_id": 3}, "session_id must be the id of a session"),
        ({"question": "hi", "sesion_id": "a"}, "ask takes question and session_id, not sesion_id"),
    ):
        with pytest.raises(MCPError, match=said):
            question_of(arguments)


def test_resources_are_files_directly_in_a_sessions_folders(tmp_path: Path) -> None:
    folder = tmp_path / "s1"
    (folder / "cwd").mkdir(parents=True)
    (folder / "artifacts").mkdir()
    (folder / "cwd" / "my table.csv").write_text("a\n1\n", encoding="utf-8")
    (folder / "artifacts" / "cell-0001-1.png").write_bytes(b"\x89PNG\r\n")
    (folder / "cwd" / "link.csv").symlink_to(tmp_path / "outside.csv")
    (tmp_path / "outside.csv").write_text("secret", encoding="utf-8")

    def read(uri: str) -> object:
        return read_resource(uri, {}, stored=lambda session_id: folder if session_id == "s1" else None).contents[0]

    uri = resource_uri("s1", "files", "my table.csv")
    assert uri == "taskweaver-lite://session/s1/files/my%20table.csv"
    table = read(uri)
    assert (table.text, table.mime_type) == ("a\n1\n", "text/csv")  # type: ignore[attr-defined]
    image = read(resource_uri("s1", "artifacts", "cell-0001-1.png"))
    assert base64.b64decode(image.blob) == b"\x89PNG\r\n" and image.mime_type == "image/png"  # type: ignore[attr-defined]
    for bad in (
        resource_uri("s1", "files", "link.csv"),
        resource_uri("s1", "files", "../s1/cwd/my table.csv"),
        resource_uri("s2", "files", "x"),
        "file:///etc/passwd",
    ):
        with pytest.raises(MCPError):
            read(bad)


def test_config_shows_the_mcp_servers_with_their_env_values_hidden(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    servers = "mcp:\n  servers:\n    time:\n      command: [mcp-server-time, --local-timezone, UTC]\n      env: {API_TOKEN: s3cret}\n"
    (tmp_path / "taskweaver_config.yaml").write_text(servers, encoding="utf-8")
    assert main(["config", "-p", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    line = next(text for text in shown.splitlines() if text.startswith("mcp.servers "))
    assert (
        "command: [mcp-server-time, --local-timezone, UTC]" in line
        and "API_TOKEN: (hidden)" in line
        and line.endswith(f"(file {tmp_path / 'taskweaver_config.yaml'})")
    )
    assert main(["config", "--json", "-p", str(tmp_path)]) == 0
    rows = {row["key"]: row["value"] for row in json.loads(capsys.readouterr().out)}
    assert rows["mcp.servers"] == {
        "time": {
            "command": ["mcp-server-time", "--local-timezone", "UTC"],
            "env": {"API_TOKEN": "(hidden)"},
            "network": False,
            "start_timeout": 60.0,
            "call_timeout": 120.0,
        }
    }
    assert "s3cret" not in shown


def test_every_tool_has_annotations_and_its_answers_a_schema_they_fit() -> None:
    tools = {tool.name: tool for tool in TOOLS}
    assert set(tools) == {"ask", "sessions", "variables", "close_session"}
    schemas: dict[str, dict[str, Any]] = {}
    for tool in tools.values():
        assert tool.annotations is not None and tool.annotations.read_only_hint is not None, f"{tool.name} has no annotations"
        assert tool.output_schema is not None, f"{tool.name} has no outputSchema"
        schemas[tool.name] = tool.output_schema
    assert tools["sessions"].annotations.read_only_hint and tools["variables"].annotations.read_only_hint  # type: ignore[union-attr]
    assert tools["ask"].annotations.read_only_hint is False and tools["ask"].annotations.open_world_hint  # type: ignore[union-attr]
    row = {"id": "s1", "title": "t", "rounds": 1, "started": 1.0, "last_active": 2.0, "owner": None}
    jsonschema.validate({"sessions": [row]}, schemas["sessions"])
    jsonschema.validate(variables_result("s1", [Variable(name="x", type="int", description="42")]).structured_content, schemas["variables"])
    for state in ("failed", "cancelled"):
        jsonschema.validate(failed_answer("s1", "Cancelled.", state=state).structured_content, schemas["ask"])


def test_a_resource_over_the_size_limit_is_refused_as_too_large_not_as_missing(tmp_path: Path) -> None:
    folder = tmp_path / "s1"
    (folder / "cwd").mkdir(parents=True)
    with (folder / "cwd" / "big.csv").open("wb") as big:
        big.truncate(MAX_RESOURCE_BYTES + 1)  # sparse: no disk spent
    with pytest.raises(MCPError) as refused:
        read_resource(resource_uri("s1", "files", "big.csv"), {}, stored=lambda _: folder)
    assert refused.value.error.code == types.INVALID_PARAMS, "not -32002, which says the resource does not exist"
    assert "big.csv is too large to read as a resource: 26,214,401 bytes, more than 26,214,400" in str(refused.value)


def test_the_mcp_page_installs_from_a_checkout_and_its_host_configs_name_the_program_by_its_full_path() -> None:
    page = (REPO / "docs" / "mcp.md").read_text(encoding="utf-8")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "pip install 'taskweaver-lite[" not in page, "no index has the package: it installs from the checkout"
    assert ".venv/bin/pip install '.[mcp]'" in page and ".venv/bin/pip install '.[mcp]'" in readme
    configs = [json.loads(block) for block in re.findall(r"```json\n(.*?)```", page, re.DOTALL)]
    commands = [server["command"] for config in configs for server in (config.get("mcpServers") or config.get("servers")).values() if "command" in server]
    assert commands and all(command.startswith("/") and command.endswith("/.venv/bin/taskweaver-lite") for command in commands), commands


def test_the_mcp_servers_project_is_opened_once_by_calls_that_come_together_and_again_after_a_failed_opening(tmp_path: Path) -> None:
    (tmp_path / "taskweaver_config.yaml").write_text("session:\n  roles: [planner, code_interpreter, nope]\n  max_internal_hopz: 3\n", encoding="utf-8")
    said: list[str] = []
    with LazyWorkspace(tmp_path, say=said.append) as project:
        with pytest.raises(ConfigError, match="max_internal_hopz"):
            project.get()
        assert project.opened is None and len(said) == 1 and said[0].startswith("taskweaver-lite: the project could not be opened (the next call tries again)")
        (tmp_path / "taskweaver_config.yaml").write_text("session:\n  roles: [planner, code_interpreter, nope]\n", encoding="utf-8")
        said.clear()
        ready = threading.Barrier(8)
        got: list[object] = []

        def call() -> None:
            ready.wait()
            got.append(project.get())

        callers = [threading.Thread(target=call) for _ in range(8)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(timeout=60)
        assert len(got) == 8 and all(workspace is project.opened for workspace in got), "each call that came together opened a project of its own"
        assert [line for line in said if "no role is called 'nope'" in line] == [said[0]] and len(said) == 1, said
    assert project.opened is None
    with pytest.raises(TaskWeaverError, match="shutting down"):
        project.get()
