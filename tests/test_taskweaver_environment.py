"""A TaskWeaver project's environment: LLM_API_BASE and every key as KEY_UPPER_WITH_UNDERSCORES, `config --show`'s origins,
Azure endpoints and ${ModuleBaseDir} in its JSON, and a YAML project that reads none of those variables but says so."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from taskweaver_lite.cli.main import main
from taskweaver_lite.config.file import load_config
from taskweaver_lite.errors import ConfigError, LLMAuthError
from taskweaver_lite.llm.client import OpenAIChatModel
from taskweaver_lite.roles.registry import builtin_roles
from taskweaver_lite.session.model_choice import role_models, setting_hints
from taskweaver_lite.testing.scripted_server import ScriptedServer, planner_reply

pytestmark = pytest.mark.unit

# TaskWeaver's own project/taskweaver_config.json, as its repository ships it.
TASKWEAVER_CONFIG = {"llm.api_base": "https://api.openai.com/v1", "llm.api_key": "", "llm.model": "gpt-4-1106-preview"}


@pytest.fixture(autouse=True)
def _no_model_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "LLM_API_BASE", "LLM_API_KEY", "LLM_MODEL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer(model="tw-model", api_key="tw-key") as running:
        yield running


def taskweaver_project(tmp_path: Path, settings: Mapping[str, object] | None = None) -> Path:
    project = tmp_path / "project"
    project.mkdir(parents=True)
    (project / "taskweaver_config.json").write_text(json.dumps(TASKWEAVER_CONFIG if settings is None else settings, indent=2), encoding="utf-8")
    return project


def test_taskweavers_own_config_with_llm_variables_sends_its_prompts_to_the_server_they_name(tmp_path: Path, server: ScriptedServer) -> None:
    environ = {"LLM_API_BASE": server.url, "LLM_API_KEY": "tw-key", "LLM_MODEL": "tw-model"}
    config = load_config(taskweaver_project(tmp_path), [], environ=environ)
    server.enqueue("planner", planner_reply("hello", send_to="User"))
    model = role_models(config, roles=[spec for spec in builtin_roles() if spec.name == "planner"])
    try:
        model.complete([{"role": "system", "content": "init_plan"}, {"role": "user", "content": "hi"}], purpose="planner")
    finally:
        model.close()
    assert [request.body["model"] for request in server.requests] == ["tw-model"]
    path = tmp_path / "project" / "taskweaver_config.json"
    assert f"{path}: read from the environment, over the file (TaskWeaver's rule): LLM_API_BASE, LLM_API_KEY, LLM_MODEL" in config.notices


def test_precedence_is_set_then_environment_then_file_then_default_and_config_show_names_each_origin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    project = taskweaver_project(tmp_path, {**TASKWEAVER_CONFIG, "round_compressor.rounds_to_retain": 1, "session.max_internal_chat_round_num": 4})
    monkeypatch.setenv("LLM_MODEL", "from-env")
    monkeypatch.setenv("LLM_API_KEY", "sk-env-secret")
    monkeypatch.setenv("ROUND_COMPRESSOR_ROUNDS_TO_RETAIN", "2")
    monkeypatch.setenv("SESSION_ROLES", "planner, code_interpreter")
    assert main(["config", "--show", "--json", "-p", str(project), "--set", "llm.model=from-set"]) == 0
    rows = {row["key"]: row for row in json.loads(capsys.readouterr().out)}
    file = f"file {project / 'taskweaver_config.json'}"
    assert (rows["llm.model"]["value"], rows["llm.model"]["source"]) == ("from-set", "--set")
    assert (rows["llm.api_key"]["value"], rows["llm.api_key"]["source"]) == ("(hidden)", "env LLM_API_KEY")
    assert (rows["round_compressor.rounds_to_retain"]["value"], rows["round_compressor.rounds_to_retain"]["source"]) == (
        2,
        "env ROUND_COMPRESSOR_ROUNDS_TO_RETAIN",
    )
    assert (rows["session.roles"]["value"], rows["session.roles"]["source"]) == (["planner", "code_interpreter"], "env SESSION_ROLES")
    assert (rows["llm.api_base"]["value"], rows["llm.api_base"]["source"]) == ("https://api.openai.com/v1", file)
    assert (rows["session.max_internal_hops"]["value"], rows["session.max_internal_hops"]["source"]) == (4, file)
    assert (rows["execution.timeout"]["value"], rows["execution.timeout"]["source"]) == (120.0, "default")
    assert main(["config", "-p", str(project)]) == 0
    shown = capsys.readouterr().out
    assert "sk-env-secret" not in shown
    assert "--set > environment (KEY_UPPER_WITH_UNDERSCORES) > file > default" in shown.splitlines()[0]


def test_a_null_word_in_a_variable_is_null_and_a_bad_value_names_the_variable(tmp_path: Path) -> None:
    project = taskweaver_project(tmp_path)
    assert load_config(project, [], environ={"LLM_API_BASE": "none"}).llm.api_base is None
    with pytest.raises(ConfigError) as caught:
        load_config(project, [], environ={"LLM_CONTEXT_WINDOW": "lots"})
    assert str(caught.value).startswith("environment variable LLM_CONTEXT_WINDOW: key 'llm.context_window'"), caught.value


def test_a_json_project_without_a_key_names_its_file_and_its_variables(tmp_path: Path) -> None:
    config = load_config(taskweaver_project(tmp_path), [], environ={})
    with pytest.raises(LLMAuthError) as caught:
        OpenAIChatModel(config.llm, hints=setting_hints(config))
    path = tmp_path / "project" / "taskweaver_config.json"
    assert str(caught.value) == (
        f'no API key for https://api.openai.com/v1: set "llm.api_key" in {path}, or the LLM_API_KEY (or OPENAI_API_KEY) environment variable'
    )
    assert "taskweaver_config.yaml" not in str(caught.value)


def test_a_yaml_project_reads_no_llm_variable_and_says_which_it_left_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "taskweaver_config.yaml").write_text("llm:\n  model: from-file\n", encoding="utf-8")
    config = load_config(project, [], environ={"LLM_MODEL": "from-env", "LLM_API_BASE": "http://elsewhere:1/v1", "LLM_TIMEOUT": "3"})
    assert (config.llm.model, config.llm.api_base, config.llm.timeout) == ("from-file", None, 120.0)
    assert config.notices == [
        "LLM_API_BASE is set but not read: a YAML project takes llm.api_base from taskweaver_config.yaml or --set "
        "(TaskWeaver's variables are read by a taskweaver_config.json project only); to use it: --set llm.api_base=$LLM_API_BASE",
        "LLM_MODEL is set but not read: a YAML project takes llm.model from taskweaver_config.yaml or --set "
        "(TaskWeaver's variables are read by a taskweaver_config.json project only); to use it: --set llm.model=$LLM_MODEL",
    ]


def test_azure_endpoints_are_called_through_azures_openai_compatible_v1_api(tmp_path: Path) -> None:
    settings = {"llm.api_type": "azure", "llm.api_base": "https://contoso.openai.azure.com/", "llm.api_version": "2024-06-01", "llm.model": "gpt4o-deploy"}
    config = load_config(taskweaver_project(tmp_path, settings), [], environ={})
    assert (config.llm.api_base, config.llm.model) == ("https://contoso.openai.azure.com/openai/v1", "gpt4o-deploy")
    assert not any("ignored" in notice and "api_type" in notice for notice in config.notices)
    assert any("Azure's OpenAI-compatible v1 API at https://contoso.openai.azure.com/openai/v1" in notice for notice in config.notices)
    with pytest.raises(ConfigError) as caught:
        load_config(taskweaver_project(tmp_path / "ad", {**settings, "llm.api_type": "azure_ad"}), [], environ={})
    assert "Entra ID login is not made here" in str(caught.value) and '"llm.api_type": "azure"' in str(caught.value)


def test_module_base_dir_in_the_json_is_the_project_folder_and_does_not_stop_loading(tmp_path: Path) -> None:
    project = taskweaver_project(tmp_path, {**TASKWEAVER_CONFIG, "store.path": "${ModuleBaseDir}/kept.db"})
    config = load_config(project, [], environ={})
    assert config.store.path == f"{project}/kept.db"
    assert any("${ModuleBaseDir}" in notice and "project folder" in notice for notice in config.notices)
