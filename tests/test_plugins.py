"""Plugins: TaskWeaver's files found, checked, loaded in a real kernel, shown to the models, listed by the CLI."""

from __future__ import annotations

import json
import os
import sqlite3
import textwrap
import time
from pathlib import Path

import pytest
from helpers import REPO, make_project, run_cli

from taskweaver_lite.config.file import load_config
from taskweaver_lite.config.settings import ExecutionConfig
from taskweaver_lite.errors import ContextOverflowError
from taskweaver_lite.kernel.executor import KernelExecutor
from taskweaver_lite.plugins.catalog import ENTRY_POINT_GROUP, discover, read_entry
from taskweaver_lite.plugins.prompt import planner_line, render_block, render_stub, select, used_plugins
from taskweaver_lite.records.execution import CellError
from taskweaver_lite.records.plugin_spec import Parameter, PluginSpec
from taskweaver_lite.session.assembly import open_session, resume_session
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply

pytestmark = pytest.mark.kernel

# A plugin file as TaskWeaver users write it: TaskWeaver's import, config, log, ctx and add_artifact.
TASKWEAVER_PLUGIN = """
from taskweaver.plugin import Plugin, register_plugin


@register_plugin
class Greeter(Plugin):
    def __call__(self, who: str, times: int = 1):
        self.log("info", f"greeting {who}")
        text = (self.config["greeting"] + " " + who + "! ") * times
        self.ctx.add_artifact("greeting", "greeting.txt", "txt", text, "the greeting")
        return text.strip(), self.ctx.session_id, self.ctx.execution_id
"""
GREETER_YAML = """
name: greeter
description: Greets someone by name.
parameters:
  - {name: who, type: str, required: true, description: the name}
  - {name: times, type: int, required: false, default: 1, description: how often}
returns:
  - {name: text, type: str, description: the greeting}
configurations:
  greeting: Hello
"""


def write_plugin(folder: Path, name: str, yaml_text: str, source: str | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.yaml").write_text(textwrap.dedent(yaml_text), encoding="utf-8")
    if source is not None:
        (folder / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")


def greeter_project(root: Path, server_url: str = "http://127.0.0.1:9") -> Path:
    project = make_project(root, server_url)
    write_plugin(project / "plugins", "greeter", GREETER_YAML, TASKWEAVER_PLUGIN)
    return project


def test_a_taskweaver_plugin_file_runs_unchanged_and_its_log_and_artifact_reach_the_result(tmp_path: Path) -> None:
    project = greeter_project(tmp_path)
    plugins = discover(project).enabled
    with KernelExecutor(tmp_path / "session-1", config=ExecutionConfig(timeout=30), plugins=plugins) as executor:
        result = executor.run("print(greeter('Ada', times=2))")
    assert result.success, result.prompt_text()
    assert "Hello Ada! Hello Ada!" in result.stdout and "'session-1', 'session-1-1'" in result.stdout
    text = result.prompt_text()
    assert "[greeter] INFO: greeting Ada" in text, "what a plugin logs reaches the result the model reads"
    artifact = tmp_path / "session-1" / "cwd" / "greeting.txt"
    assert result.artifacts == (str(artifact),) and artifact.read_text(encoding="utf-8").startswith("Hello Ada!")
    assert "greeter" not in [v.name for v in result.variables], "plugins are never listed as user variables"


def test_both_import_names_work_and_plugins_come_back_after_a_restart(tmp_path: Path) -> None:
    project = greeter_project(tmp_path)
    own = TASKWEAVER_PLUGIN.replace("from taskweaver.plugin", "from taskweaver_lite.plugin").replace("Greeter", "Own")
    write_plugin(project / "plugins", "own", "name: own\ndescription: Ours.\nconfigurations: {greeting: Hi}\n", own)
    plugins = discover(project).enabled
    with KernelExecutor(tmp_path / "s", config=ExecutionConfig(timeout=30), plugins=plugins) as executor:
        assert executor.run("own('Bo')[0]").result == "'Hi Bo!'"
        assert executor.run("greeter('Bo')[0]").result == "'Hello Bo!'"
        executor.restart()
        after = executor.run("greeter('Cy')[0]")
    assert after.success and after.result == "'Hello Cy!'", "a restarted kernel gets the plugins again"


def test_plugins_are_loaded_before_the_replay_of_a_resumed_session(tmp_path: Path, server: ScriptedServer) -> None:
    project = greeter_project(tmp_path, server.url)
    server.enqueue("planner", planner_reply("Greet Ada."), planner_reply("Done.", send_to="User"))
    server.enqueue("code_generator", code_reply("g = greeter('Ada')[0]\nprint(g)"))
    config = load_config(project)
    with open_session(config) as session:
        session.ask("greet Ada")
    server.enqueue("planner", planner_reply("Print g and greet Bo."), planner_reply("Done.", send_to="User"))
    server.enqueue("code_generator", code_reply("print(g, greeter('Bo')[0])"))
    resumed, report = resume_session(config, "last")
    with resumed:
        assert report.replayed == 1 and report.replay_failures == 0, "the replayed cell calls the plugin"
        rnd = resumed.ask("again")
    post = next(p for p in rnd.posts if p.execution is not None)
    assert post.execution is not None and "Hello Ada! Hello Bo!" in post.execution.stdout


def test_a_broken_yaml_and_a_failing_import_leave_the_session_running_without_them(tmp_path: Path, server: ScriptedServer) -> None:
    project = greeter_project(tmp_path, server.url)
    write_plugin(project / "plugins", "bad_yaml", "name: bad_yaml\ndescription: [unclosed\n")
    write_plugin(project / "plugins", "needs_lib", "name: needs_lib\ndescription: Needs a missing library.\n", "import not_installed_anywhere\n")
    catalog = discover(project)
    [broken] = catalog.broken
    assert broken.path.name == "bad_yaml.yaml" and "not valid YAML at line" in broken.line() and "starts without it" in broken.line()
    server.enqueue("planner", planner_reply("Greet Ada."), planner_reply("Done.", send_to="User"))
    server.enqueue("code_generator", code_reply("greeter('Ada')[0]"))
    with open_session(load_config(project)) as session:
        rnd = session.ask("greet Ada")
    post = next(p for p in rnd.posts if p.execution is not None)
    assert post.execution is not None and post.execution.success, "the other plugins still load"
    notice = next(n for n in post.execution.notices if "could not be loaded" in n)
    assert "needs_lib.py" in notice and "ModuleNotFoundError" in notice and "(line 1)" in notice


@pytest.mark.unit
@pytest.mark.parametrize(
    ("yaml_text", "problem"),
    [
        ("description: no name\n", "field 'name' is missing"),
        ("name: bad-name\ndescription: x\n", "field 'name': 'bad-name' may only hold letters"),
        ("name: p\ndescription: x\nparameters: [{name: a, typ: str}]\n", "field 'parameters[0].typ' is unknown"),
        ("name: p\ndescription: x\nenabled: maybe\n", "field 'enabled' must be true or false"),
        ("name: p\ndescription: x\ncode: elsewhere\n", "field 'code': the file"),
        ("name: p\ndescription: x\nfavourite: 1\n", "unknown field 'favourite'"),
        ("name: off\ndescription: x\n", "field 'name' must be text, not False; put quotes around it"),
    ],
)
def test_validation_names_the_field_that_is_wrong(tmp_path: Path, yaml_text: str, problem: str) -> None:
    write_plugin(tmp_path, "p", yaml_text, "x = 1\n")
    entry = read_entry(tmp_path / "p.yaml")
    assert entry.state == "broken" and problem in entry.error and str(tmp_path / "p.yaml") in entry.line()


@pytest.mark.unit
def test_the_stub_shows_required_optional_and_defaulted_parameters_exactly() -> None:
    spec = PluginSpec(
        name="detect",
        code="detect",
        description="Find outliers in a column.\nRows far from the rest are returned.",
        yaml_path=Path("detect.yaml"),
        source_path=Path("detect.py"),
        examples='found = detect(df, "sales")',
        parameters=(
            Parameter("df", "pandas.DataFrame", required=True, description="the data"),
            Parameter("column", "str", required=True, description="the column"),
            Parameter("threshold", "float", description="how far", default=3.0, has_default=True),
            Parameter("label", "str", description="a name for the result"),
        ),
        returns=(Parameter("outliers", "pandas.DataFrame", description="the rows"), Parameter("count", "int")),
    )
    assert render_stub(spec) == textwrap.dedent('''\
        def detect(df: pandas.DataFrame, column: str, threshold: float = 3.0, label: str | None = None) -> tuple[pandas.DataFrame, int]:
            """Find outliers in a column.

            Rows far from the rest are returned.

            Args:
                df: the data (required)
                column: the column (required)
                threshold: how far (optional, default 3.0)
                label: a name for the result (optional)

            Returns:
                outliers (pandas.DataFrame): the rows
                count (int)

            Examples:
                found = detect(df, "sales")
            """''')
    assert planner_line(spec) == "detect: Find outliers in a column."


@pytest.mark.unit
def test_a_required_parameter_after_an_optional_one_makes_the_rest_keyword_only() -> None:
    spec = PluginSpec("f", "f", "Do it.", Path("f.yaml"), Path("f.py"), parameters=(Parameter("a", "int"), Parameter("b", "str", required=True)))
    assert render_stub(spec).splitlines()[0] == "def f(*, a: int | None = None, b: str) -> None:"


def test_the_code_generator_sees_enabled_plugins_and_the_planner_one_line_each(tmp_path: Path, server: ScriptedServer) -> None:
    project = greeter_project(tmp_path, server.url)
    write_plugin(project / "plugins", "hidden", "name: hidden\nenabled: false\ndescription: Never shown.\n")
    server.enqueue("planner", planner_reply("Greet Ada."), planner_reply("Done.", send_to="User"))
    server.enqueue("code_generator", code_reply("greeter('Ada')"))
    with open_session(load_config(project)) as session:
        session.ask("greet Ada")
    planner_system = next(r for r in server.requests if r.role == "planner").messages[0]["content"]
    coder_system = next(r for r in server.requests if r.role == "code_generator").messages[0]["content"]
    assert "- greeter: Greets someone by name." in planner_system
    assert "def greeter(who: str, times: int = 1) -> str:" in coder_system and "who: the name (required)" in coder_system
    assert "anomaly_detection(df: pandas.DataFrame, column: str" in coder_system, "the shipped plugins too"
    assert all("hidden" not in r.messages[0]["content"] for r in server.requests), "a disabled plugin appears nowhere"


def many_plugins(count: int) -> list[PluginSpec]:
    topics = ["weather forecast", "stock prices", "sales revenue", "customer churn", "server logs", "survey answers"]
    return [
        PluginSpec(
            f"tool_{i}", f"tool_{i}", f"Fetch {topics[i % len(topics)]} number {i}.", Path("y"), Path("p"), parameters=(Parameter("day", "str", required=True),)
        )
        for i in range(count)
    ]


@pytest.mark.unit
def test_selection_ranks_lexically_and_keeps_plugins_used_before() -> None:
    specs = [*many_plugins(30), PluginSpec("anomaly_detection", "a", "Find anomalies in a column.", Path("y"), Path("p"))]
    chosen = select(specs, "Find the anomalies in the revenue column", top_k=3)
    assert chosen[-1].name == "anomaly_detection" and len(chosen) == 3
    assert used_plugins(specs, ["x = tool_7('mon')", "tool_70 = 1"]) == {"tool_7"}
    kept = select(specs, "anomalies", top_k=1, keep={"tool_7"})
    assert [s.name for s in kept] == ["tool_7", "anomaly_detection"]
    assert len(render_block(chosen)) < len(render_block(specs)) / 5


@pytest.mark.unit
def test_plugins_of_installed_packages_come_through_the_entry_point_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "site" / "team_plugins"
    write_plugin(package / "plugins", "team_tool", "name: team_tool\ndescription: Our warehouse pull.\n", "x = 1\n")
    (package / "__init__.py").write_text("from pathlib import Path\nFOLDER = Path(__file__).parent / 'plugins'\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert discover(tmp_path / "no-project").entries == (), "no package metadata yet: no entry point"
    # Entry points are kept between sessions; a package installed into a folder on the path since is seen at once.
    info = tmp_path / "site" / "team_plugins-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: team-plugins\nVersion: 1.0\n", encoding="utf-8")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nteam = team_plugins:FOLDER\n", encoding="utf-8")
    os.utime(tmp_path / "site", ns=(time.time_ns() + 10**9,) * 2)  # later than the first look, whatever the clock's grain
    entries = discover(tmp_path / "no-project").entries
    assert [(e.name, e.state, e.spec.origin if e.spec else "") for e in entries] == [("team_tool", "enabled", "entry point team")]


def test_the_shipped_sql_pull_and_anomaly_detection_work_in_a_kernel(tmp_path: Path) -> None:
    plugins = discover(REPO / "project").enabled
    assert [p.name for p in plugins] == ["anomaly_detection", "sql_pull"]
    session_dir = tmp_path / "s"
    (session_dir / "cwd").mkdir(parents=True)
    with sqlite3.connect(session_dir / "cwd" / "shop.db") as db:
        db.execute("CREATE TABLE orders (region TEXT, amount REAL)")
        db.executemany("INSERT INTO orders VALUES (?, ?)", [("north", 10.0)] * 20 + [("south", 500.0)])
    db.close()
    code = 'orders = sql_pull("shop.db", "SELECT * FROM orders")\nodd = anomaly_detection(orders, "amount")\nprint(len(orders), odd.region.tolist())'
    with KernelExecutor(session_dir, config=ExecutionConfig(timeout=60), plugins=plugins) as executor:
        result = executor.run(code)
        missing = executor.run('sql_pull("nowhere.db", "SELECT 1")')
        written = executor.run('sql_pull("shop.db", "DELETE FROM orders")')
    assert result.success and "21 ['south']" in result.stdout, result.prompt_text()
    assert result.artifacts == (str(session_dir / "cwd" / "anomalies_amount.csv"),)
    assert "21 rows x 2 columns from shop.db" in result.prompt_text() and "1 of 21 rows are anomalies" in result.prompt_text()
    assert missing.error is not None and "no SQLite file" in missing.error.value, "no empty database is created"
    assert written.error is not None and "readonly" in written.error.value


def test_the_plugins_command_lists_states_and_errors_and_chat_reports_broken_ones(tmp_path: Path) -> None:
    project = greeter_project(tmp_path)
    write_plugin(project / "plugins", "turned_off", "name: turned_off\nenabled: false\ndescription: Turned off.\n")
    write_plugin(project / "plugins", "needs_lib", "name: needs_lib\ndescription: Needs a lib.\n", "import not_installed_anywhere\n")
    write_plugin(project / "plugins", "bad_yaml", "name: [\n")
    listed = run_cli("plugins", "-p", str(project), "--json")
    states = {row["name"]: (row["state"], row["error"]) for row in json.loads(listed.stdout)}
    assert states["greeter"] == ("enabled", "") and states["turned_off"] == ("disabled", "") and states["sql_pull"][0] == "enabled"
    assert states["needs_lib"][0] == "broken" and "ModuleNotFoundError" in states["needs_lib"][1]
    assert states["bad_yaml"][0] == "broken" and "not valid YAML" in states["bad_yaml"][1]
    chat = run_cli("chat", "-p", str(project), stdin="/plugins\n")
    broken = [line for line in chat.stderr.splitlines() if line.startswith("plugin ")]
    reason = "is not valid YAML at line 2 (expected the node content, but found '<stream end>')"
    assert broken == [
        f"plugin {project / 'plugins' / 'bad_yaml.yaml'}: {reason}; the session starts without it",
        f"plugin {project / 'plugins' / 'needs_lib.py'}: ModuleNotFoundError: No module named 'not_installed_anywhere' (line 1); "
        "the session goes on without it",
    ]
    assert "greeter            enabled" in chat.stderr and "turned_off         disabled" in chat.stderr, "/plugins lists them too"


def test_auto_selection_shows_the_plugins_for_the_step_and_keeps_those_used_before(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url, code_generator={"auto_plugin_selection": True, "auto_plugin_selection_topk": 1})
    write_plugin(project / "plugins", "greeter", GREETER_YAML, TASKWEAVER_PLUGIN)
    server.enqueue("planner", planner_reply("Find the anomalies in column v of df."), planner_reply("Done.", send_to="User"))
    server.enqueue("code_generator", code_reply("print(greeter('Ada')[0])"))
    server.enqueue("planner", planner_reply("Pull the rows of the SQLite database shop.db with a SQL query."), planner_reply("Done.", send_to="User"))
    server.enqueue("code_generator", code_reply("print(1)"))
    with open_session(load_config(project)) as session:
        session.ask("anomalies?")
        session.ask("rows?")
    calls = [r.messages for r in server.requests if r.role == "code_generator"]
    # The step's plugins are in a message just before the step; the instructions stay as they were.
    first, second = ([str(m["content"]) for m in messages if str(m["content"]).startswith("## Plugins for this step")][-1] for messages in calls)
    assert calls[0][0] == calls[1][0] and "def anomaly_detection(" not in str(calls[0][0]), "the system message changed with the step"
    assert "def anomaly_detection(" in first and "def sql_pull(" not in first and "def greeter(" not in first
    assert "def sql_pull(" in second and "def greeter(" in second, "the step's plugin, and the one called before"
    assert "def anomaly_detection(" not in second


@pytest.mark.parametrize("selection", [False, True])
def test_the_plugin_block_counts_against_the_budget(tmp_path: Path, server: ScriptedServer, selection: bool) -> None:
    long_text = " ".join(f"Detail {n} of how the weather data is fetched, cached and cleaned." for n in range(12))
    project = make_project(tmp_path, server.url, llm={"context_window": 2048, "reply_reserve": 512}, code_generator={"auto_plugin_selection": selection})
    # Wide signatures: even the compact one-line stubs of all ten pass the budget.
    parameters = "".join(f"  - {{name: weather_station_setting_{n}, type: str, required: true, description: a setting}}\n" for n in range(12))
    for i in range(10):
        spec = f"name: tool_{i}\ndescription: |-\n  Fetch weather {i}.\n  {long_text}\nparameters:\n{parameters}"
        write_plugin(project / "plugins", f"tool_{i}", spec, "x = 1\n")
    server.enqueue("planner", planner_reply("Print 1."), planner_reply("Done.", send_to="User"))
    server.enqueue("code_generator", code_reply("print(1)"))
    with open_session(load_config(project)) as session:
        if selection:
            assert session.ask("print one").state == "finished", "the top 3 fit where all 10 did not"
            assert [r.role for r in server.requests] == ["planner", "code_generator", "planner"]
        else:
            with pytest.raises(ContextOverflowError, match="CodeGenerator's prompt does not fit") as raised:
                session.ask("print one")
            assert "set code_generator.auto_plugin_selection: true" in str(raised.value), "the error names the setting that fixes it"


def test_a_plugin_class_without_call_is_reported_when_it_loads(tmp_path: Path) -> None:
    project = make_project(tmp_path, "http://127.0.0.1:9")
    source = "from taskweaver.plugin import Plugin, register_plugin\n\n@register_plugin\nclass Mute(Plugin):\n    pass\n"
    write_plugin(project / "plugins", "mute", "name: mute\ndescription: Does nothing.\n", source)
    with KernelExecutor(tmp_path / "s", config=ExecutionConfig(timeout=30), plugins=discover(project).enabled) as executor:
        executor.wait_ready()
        assert any("mute.py" in line and "defines no __call__" in line for line in executor.plugin_failures), executor.plugin_failures
        assert "NameError" in (executor.run("mute").error or CellError("", "", "")).name


def test_in_a_small_window_the_plugin_block_shows_typed_signatures_within_its_share(tmp_path: Path) -> None:
    from taskweaver_lite.llm.tokens import get_tokenizer

    tokenizer = get_tokenizer()
    specs = discover(make_project(tmp_path, "http://127.0.0.1:9")).enabled
    full = render_block(specs)
    compact = render_block(specs, max_tokens=291, tokenizer=tokenizer)  # 8% of an 8k window's 3,648-token budget
    assert tokenizer.count(full) > 291 >= tokenizer.count(compact)
    assert "def sql_pull(database: str, query: str, max_rows: int = 100000) -> pandas.DataFrame: ...  # Run a read-only SQL query" in compact
    assert render_block(specs, max_tokens=5_000, tokenizer=tokenizer) == full, "a large window shows the full stubs"
