"""Every command starts at once: `--help`, `--version` and the light commands import only what they run.

The import set of `taskweaver-lite --help` is held exactly, as tests/test_layout.py holds the layers'
imports: a module that joins it (a command's implementation imported to register the command, a
third-party package) fails here by name, before anyone feels the start-up slow down. So is the set
`taskweaver-lite mcp` has imported when it has answered `initialize` and listed its tools and
resources: the MCP SDK and the server's own modules, never the config's, the session's or the
store's, which the first call that needs the project imports.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.cli  # fresh interpreters, started as commands

# What registering every command may import: the command line's own light modules and the error tree.
HELP_MODULES = {
    "taskweaver_lite",
    "taskweaver_lite.cli",
    "taskweaver_lite.cli.audit",
    "taskweaver_lite.cli.eval",
    "taskweaver_lite.cli.gateway",
    "taskweaver_lite.cli.main",
    "taskweaver_lite.cli.users",
    "taskweaver_lite.errors",
}

# What `mcp` may have imported once it answered `initialize`, `tools/list` and `resources/list`: the
# command line, the server and what its answers are built from (the config, the session, the kernel
# and the store come with the first call that opens the project).
MCP_ANSWERING_MODULES = HELP_MODULES | {
    "taskweaver_lite.cli.mcp",
    "taskweaver_lite.cli.project",
    "taskweaver_lite.mcp",
    "taskweaver_lite.mcp.bounded_stdio",
    "taskweaver_lite.mcp.resources",
    "taskweaver_lite.mcp.server",
    "taskweaver_lite.safety",
    "taskweaver_lite.safety.bounded_lines",
    "taskweaver_lite.safety.terminal",
    "taskweaver_lite.safety.workfiles",
    "taskweaver_lite.session",
    "taskweaver_lite.session.lazy_workspace",
}
# Third-party packages the first call brings (the config's YAML, the prompts, the model client, the kernel's client).
NOT_BEFORE_A_CALL = {"yaml", "jinja2", "openai", "jupyter_client", "zmq", "psycopg", "rich", "prompt_toolkit", "bpe_openai", "json_repair"}

# Run a command's parser in a fresh interpreter and report, as it exits, what it imported.
PROBE = """
import atexit, json, sys
before = set(sys.modules)
def report():
    loaded = {m for m in set(sys.modules) - before if sys.modules[m] is not None}  # None: an import we block, not made
    ours = sorted(m for m in loaded if m.startswith("taskweaver_lite"))
    others = sorted({m.partition(".")[0] for m in loaded} - set(sys.stdlib_module_names) - {"taskweaver_lite", "_distutils_hack"})
    sys.__stderr__.write("\\nIMPORTED " + json.dumps({"ours": ours, "others": others}) + "\\n")
atexit.register(report)
from taskweaver_lite.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def imported_by(*argv: str, cwd: Path | None = None, stdin: str | None = None) -> dict[str, list[str]]:
    """The package's modules and the third-party packages that `taskweaver-lite ARGV` imported (`stdin`: what it reads)."""
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120, cwd=cwd, input=stdin)
    marker = done.stderr.rpartition("IMPORTED ")[2]
    assert marker, f"the probe did not report: {done.stderr[-2000:]}"
    loaded: dict[str, list[str]] = json.loads(marker)
    return loaded


def test_help_imports_only_the_command_lines_light_modules_and_no_third_party_package() -> None:
    loaded = imported_by("--help")
    assert set(loaded["ours"]) == HELP_MODULES, (
        "`taskweaver-lite --help` imports more (or less) of the package than registering the commands needs: "
        f"added {sorted(set(loaded['ours']) - HELP_MODULES)}, gone {sorted(HELP_MODULES - set(loaded['ours']))}; "
        "import a command's implementation inside its run function, not where the command is registered"
    )
    assert loaded["others"] == [], f"`taskweaver-lite --help` imports third-party packages: {loaded['others']}"


def test_version_reads_the_installed_metadata_and_nothing_more() -> None:
    loaded = imported_by("--version")
    assert set(loaded["ours"]) == HELP_MODULES
    assert loaded["others"] == []


@pytest.mark.parametrize("command", ["users", "sessions", "config", "mcp", "chat", "serve", "export"])
def test_a_commands_own_help_imports_no_more_than_the_top_level_help(command: str) -> None:
    loaded = imported_by(command, "--help")
    assert set(loaded["ours"]) == HELP_MODULES, f"`taskweaver-lite {command} --help` imports {sorted(set(loaded['ours']) - HELP_MODULES)}"
    assert loaded["others"] == []


def test_listing_sessions_does_not_import_the_chat_the_kernel_or_the_model_client(tmp_path: Path) -> None:
    from taskweaver_lite.cli.init import init_project

    init_project(tmp_path / "project")
    loaded = imported_by("sessions", "-p", str(tmp_path / "project"))
    chat_stack = [
        m
        for m in loaded["ours"]
        if m.startswith(("taskweaver_lite.cli.chat", "taskweaver_lite.kernel", "taskweaver_lite.llm.client", "taskweaver_lite.session"))
    ]
    assert chat_stack == [], f"`sessions` imports the chat's stack: {chat_stack}"
    assert not {"openai", "jupyter_client", "rich", "prompt_toolkit"} & set(loaded["others"]), loaded["others"]


def mcp_request(number: int, method: str, params: dict[str, Any] | None = None) -> str:
    """One JSON-RPC line of the MCP stdio transport (a notification without a number)."""
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method} | ({"id": number} if number else {}) | ({"params": params} if params else {})
    return json.dumps(message) + "\n"


def test_mcp_answers_initialize_and_its_lists_before_reading_the_config_or_importing_the_session(tmp_path: Path) -> None:
    from taskweaver_lite.cli.init import init_project

    project = tmp_path / "project"
    init_project(project)
    initialize = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}
    argv = [sys.executable, "-c", PROBE, "mcp", "-p", str(project)]
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as server:
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write(mcp_request(1, "initialize", initialize) + mcp_request(0, "notifications/initialized"))
        server.stdin.write(mcp_request(2, "tools/list") + mcp_request(3, "resources/list"))
        server.stdin.flush()
        answers: dict[int, dict[str, Any]] = {}
        while len(answers) < 3:  # each answer in full before the input closes (a request still in flight at its end is dropped)
            line = server.stdout.readline()
            assert line, f"mcp ended before answering: {server.stderr.read()[-2000:] if server.stderr else ''}"
            answer = json.loads(line)
            answers[answer["id"]] = answer["result"]
        _, stderr = server.communicate(timeout=60)  # the input closed: the server ends
    assert answers[1]["serverInfo"]["name"] == "taskweaver-lite"
    assert [tool["name"] for tool in answers[2]["tools"]] == ["ask", "sessions", "variables", "close_session"]
    assert answers[3]["resources"] == []
    loaded = json.loads(stderr.rpartition("IMPORTED ")[2])
    assert set(loaded["ours"]) == MCP_ANSWERING_MODULES, (
        "`taskweaver-lite mcp` imports more (or less) of the package before its first call than answering needs: "
        f"added {sorted(set(loaded['ours']) - MCP_ANSWERING_MODULES)}, gone {sorted(MCP_ANSWERING_MODULES - set(loaded['ours']))}; "
        "what only a tool call needs is imported when the project is opened (session/lazy_workspace.py)"
    )
    assert not NOT_BEFORE_A_CALL & set(loaded["others"]), sorted(NOT_BEFORE_A_CALL & set(loaded["others"]))
    assert not (project / "sessions.db").exists(), "the store was opened before any call needed it"


# What `acp` may have imported once it answered `initialize`: the command line, the agent and what its updates are
# built from (the records), never the config's, the session's, the kernel's or the store's modules.
ACP_ANSWERING_MODULES = HELP_MODULES | {
    "taskweaver_lite.acp",
    "taskweaver_lite.acp.agent",
    "taskweaver_lite.acp.folders",
    "taskweaver_lite.acp.turn",
    "taskweaver_lite.acp.updates",
    "taskweaver_lite.cli.acp",
    "taskweaver_lite.cli.project",
    "taskweaver_lite.llm",
    "taskweaver_lite.llm.streaming",
    "taskweaver_lite.records",
    "taskweaver_lite.records.conversation",
    "taskweaver_lite.records.events",
    "taskweaver_lite.records.execution",
    "taskweaver_lite.records.mcp_tools",
    "taskweaver_lite.records.model_calls",
    "taskweaver_lite.records.plugin_spec",
    "taskweaver_lite.safety",
    "taskweaver_lite.safety.bounded_lines",
    "taskweaver_lite.safety.terminal",
    "taskweaver_lite.session",
    "taskweaver_lite.session.lazy_workspace",
}


def acp_answers(project: Path, *requests: str) -> tuple[list[dict[str, Any]], str, bool]:
    """`taskweaver-lite acp -p PROJECT` under the probe: its answer to each request in turn, its stderr, and whether the store existed at the first answer."""
    argv = [sys.executable, "-c", PROBE, "acp", "-p", str(project)]
    answers: list[dict[str, Any]] = []
    opened_at_first = False
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as agent:
        assert agent.stdin is not None and agent.stdout is not None
        for number, line in enumerate(requests):
            agent.stdin.write(line)
            agent.stdin.flush()
            answers.append(json.loads(agent.stdout.readline() or "{}"))
            if number == 0:
                opened_at_first = (project / "sessions.db").exists()
        _, stderr = agent.communicate(timeout=60)
    return answers, stderr, opened_at_first


def test_acp_answers_initialize_before_reading_the_config_or_importing_the_session_and_session_new_names_a_broken_config(tmp_path: Path) -> None:
    from taskweaver_lite.cli.init import init_project

    project = tmp_path / "project"
    init_project(project)
    config = project / "taskweaver_config.yaml"
    config.write_text(config.read_text(encoding="utf-8") + "\nsession:\n  max_internal_hopz: 3\n", encoding="utf-8")
    initialize = mcp_request(1, "initialize", {"protocolVersion": 1})

    [initialized], stderr, opened = acp_answers(project, initialize)
    assert initialized.get("result", {}).get("agentInfo", {}).get("name") == "taskweaver-lite", (initialized, stderr[-2000:])
    assert not opened and not (project / "sessions.db").exists(), "the store was opened though no request needed it"
    loaded = json.loads(stderr.rpartition("IMPORTED ")[2])
    assert set(loaded["ours"]) == ACP_ANSWERING_MODULES, (
        "`taskweaver-lite acp` imports more (or less) of the package before its first session than answering initialize needs: "
        f"added {sorted(set(loaded['ours']) - ACP_ANSWERING_MODULES)}, gone {sorted(ACP_ANSWERING_MODULES - set(loaded['ours']))}; "
        "what only a session needs is imported when the project is opened (session/lazy_workspace.py)"
    )
    assert not NOT_BEFORE_A_CALL & set(loaded["others"]), sorted(NOT_BEFORE_A_CALL & set(loaded["others"]))

    # The config is read by the first request that needs the project: a mistake in it answers that request, in one line.
    [_, refused], stderr, _ = acp_answers(project, initialize, mcp_request(2, "session/new", {"cwd": str(project), "mcpServers": []}))
    message = refused["error"]["message"]
    assert message.startswith("The project could not be opened") and "max_internal_hopz" in message and "\n" not in message, refused
    assert "max_internal_hopz" in stderr  # the agent's log says why too


def test_the_gateway_loads_kernel_gateway_and_its_schema_checks_without_building_the_iri_grammars() -> None:
    # jsonschema imports rfc3987_syntax where it is installed, which compiles 39 grammars with lark as it
    # loads: about 1 s of CPU at every gateway start for formats no schema of the gateway uses.
    probe = (
        "import json, sys\n"
        "from taskweaver_lite.kernel.gateway.launch import kernel_gateway_app\n"
        "kernel_gateway_app()\n"
        "from jupyter_events.validators import validate_schema\n"
        "from jupyter_events.schema import EventSchema\n"
        "schema = {'$id': 'https://example.org/twl', 'version': '1', 'type': 'object', 'properties': {'where': {'type': 'string'}}}\n"
        "validate_schema(schema)\n"
        "EventSchema(schema).validate({'where': 'here'})\n"
        "print(json.dumps(sorted(m for m in ('jsonschema', 'jupyter_events', 'jupyter_server', 'rfc3987_syntax', 'lark') if sys.modules.get(m))))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == ["jsonschema", "jupyter_events", "jupyter_server"], done.stdout


def test_export_writes_its_notebook_without_building_jsonschemas_iri_grammars(tmp_path: Path) -> None:
    from helpers import make_project

    from taskweaver_lite.records.conversation import Round
    from taskweaver_lite.records.events import RoundStarted
    from taskweaver_lite.store.database import SessionStore

    project = make_project(tmp_path, "http://127.0.0.1:9/v1")
    store = SessionStore(project / "sessions.db")
    store.create_session("20260101-000000-aaaaaa", started=1.0)
    store.record("20260101-000000-aaaaaa", RoundStarted(Round(index=1, user_query="a request")))
    store.close()
    notebook = tmp_path / "out.ipynb"
    loaded = imported_by("export", "last", "-p", str(project), "-o", str(notebook), cwd=tmp_path)
    assert json.loads(notebook.read_text(encoding="utf-8"))["nbformat"] == 4
    assert {"nbformat", "jsonschema"} <= set(loaded["others"]) and "lark" not in loaded["others"], loaded["others"]


def test_a_chat_turn_does_not_import_trio_where_it_is_installed(tmp_path: Path) -> None:
    # httpcore (under the openai client) imports trio wherever it is installed, only to tell which async library
    # runs it: 0.13 s of CPU at every command that asks a model (chat, serve, mcp, acp), for a loop that is asyncio's.
    import importlib.util

    from helpers import make_project

    from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply

    assert importlib.util.find_spec("trio") is not None, "precondition: trio is installed here (selenium, in the test extra, brings it)"
    with ScriptedServer() as server:
        server.enqueue("planner", planner_reply("Add the numbers."), planner_reply("The total is 42.", send_to="User"))
        server.enqueue("code_generator", code_reply("print(41 + 1)"))
        loaded = imported_by("chat", "-p", str(make_project(tmp_path, server.url)), stdin="add them\n")
    assert {"openai", "jupyter_client"} <= set(loaded["others"]), loaded["others"]  # the turn ran: the model was asked, a cell ran
    assert "trio" not in loaded["others"], loaded["others"]


# A server built and answering (its /healthz), then asked over MCP once: what it had imported before and after.
SERVE_PROBE = """
import json, sys
from starlette.testclient import TestClient
from taskweaver_lite.config.file import load_config
from taskweaver_lite.web.app import build_app
from taskweaver_lite.web.auth import Access
app = build_app(load_config(sys.argv[1]), Access(token=None))
hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}
initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}
with TestClient(app, client=("127.0.0.1", 50000), base_url="http://127.0.0.1") as client:
    health = client.get("/healthz").status_code
    before = "mcp" in sys.modules
    answer = client.post("/mcp", json=initialize, headers={"Accept": "application/json, text/event-stream"})
    print(json.dumps({"health": health, "before": before, "after": "mcp" in sys.modules, "status": answer.status_code, "body": answer.text}))
"""


def test_serve_loads_the_mcp_sdk_only_when_mcp_is_first_asked_and_then_answers(tmp_path: Path) -> None:
    from taskweaver_lite.cli.init import init_project

    init_project(tmp_path / "project")
    done = subprocess.run([sys.executable, "-c", SERVE_PROBE, str(tmp_path / "project")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["health"] == 200
    assert not seen["before"], "a server nobody asked over MCP imported the MCP SDK as it started (half a second of every replica's start)"
    assert seen["after"] and seen["status"] == 200 and '"serverInfo"' in seen["body"], f"/mcp did not answer its first request: {seen}"
