"""Config errors blame the right source and line; optional sections take dotted --set; TaskWeaver's JSON is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import run_cli

from taskweaver_lite.config.file import load_config
from taskweaver_lite.errors import ConfigError

pytestmark = pytest.mark.unit


def project_with(tmp_path: Path, text: str | None = None, *, name: str = "taskweaver_config.yaml") -> Path:
    project = tmp_path / "project"
    project.mkdir()
    if text is not None:
        (project / name).write_text(text, encoding="utf-8")
    return project


def problem(project: Path, overrides: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(project, overrides or [])
    return str(caught.value)


def test_a_dotted_set_fills_an_unset_optional_section(tmp_path: Path) -> None:
    config = load_config(project_with(tmp_path), ["execution.kernel_gateway.url=http://bigbox:8888", "execution.kernel_gateway.kernel_name=py"])
    assert config.execution.kernel_gateway is not None
    assert (config.execution.kernel_gateway.url, config.execution.kernel_gateway.kernel_name) == ("http://bigbox:8888", "py")


def test_an_optional_section_missing_its_required_key_blames_the_set_that_opened_it_and_hides_the_token(tmp_path: Path) -> None:
    text = problem(project_with(tmp_path), ["execution.kernel_gateway.token=s3cret"])
    assert text.startswith("--set execution.kernel_gateway.token=***: key 'execution.kernel_gateway.url'"), text
    assert "s3cret" not in text


def test_a_dotted_key_in_the_file_is_blamed_on_the_file_and_its_line_not_on_a_valid_set(tmp_path: Path) -> None:
    project = project_with(tmp_path, "execution:\n  timeout: 30\nllm.model: gpt-4o\n")
    text = problem(project, ["llm.model=gpt-4o-mini"])
    assert f"{project / 'taskweaver_config.yaml'}, line 3: unknown key 'llm.model'" in text
    assert "--set" not in text.split("dotted keys are for --set")[0], text
    assert "keys nest" in text


def test_a_wrong_value_in_the_file_names_its_line(tmp_path: Path) -> None:
    project = project_with(tmp_path, "llm:\n  model: x\n  context_window: lots\n")
    assert f"{project / 'taskweaver_config.yaml'}, line 3: key 'llm.context_window'" in problem(project)


@pytest.mark.parametrize(
    ("text", "line", "fix"),
    [
        ("llm:\n  model gpt-4o\n  context_window: 8000\n", 2, "`model: gpt-4o`"),
        ("llm:\n  model: x\nplanner\n  prompt_compression: true\n", 3, "`planner:`"),
        ("llm:\n  model: gpt\n  context_window 8000\nplanner:\n  prompt_compression: true\n", 3, "`context_window: 8000`"),
    ],
)
def test_a_missing_colon_names_the_line_that_lacks_it(tmp_path: Path, text: str, line: int, fix: str) -> None:
    project = project_with(tmp_path, text)
    said = problem(project)
    assert said.startswith(f"{project / 'taskweaver_config.yaml'}, line {line}: "), said
    assert "has no colon after its key; write " + fix in said
    assert "mapping values" not in said and "could not find" not in said


TASKWEAVER_JSON = {
    "llm.api_base": "http://localhost:11434/v1",
    "llm.api_key": "ignored",
    "llm.api_type": "openai",
    "llm.model": "qwen2.5-coder:7b",
    "llm.response_format": None,
    "planner.prompt_compression": False,
    "code_generator.prompt_compression": True,
    "code_generator.enable_auto_plugin_selection": True,
    "round_compressor.rounds_to_retain": 1,
    "session.max_internal_chat_round_num": 6,
    "execution_service.kernel_mode": "container",
    "code_interpreter": {"code_verification_on": True, "allowed_modules": ["pandas"]},
    "logging.log_file": "taskweaver.log",
    "planner.use_experience": True,
}


def test_taskweavers_json_config_is_read_with_its_keys_mapped_and_the_rest_listed(tmp_path: Path) -> None:
    project = project_with(tmp_path, json.dumps(TASKWEAVER_JSON), name="taskweaver_config.json")
    config = load_config(project)
    assert (config.llm.api_base, config.llm.model, config.llm.structured) == ("http://localhost:11434/v1", "qwen2.5-coder:7b", "off")
    assert config.llm.api_key is not None and config.llm.api_key.get_secret_value() == "ignored"
    assert (config.planner.prompt_compression, config.code_generator.prompt_compression) == (False, True)
    assert config.code_generator.auto_plugin_selection and config.round_compressor.rounds_to_retain == 1
    assert config.session.max_internal_hops == 6 and config.execution.sandbox == "bubblewrap"
    assert config.code_interpreter.code_verification_on and config.code_interpreter.allowed_modules == ["pandas"]
    path = project / "taskweaver_config.json"
    assert config.experience.enabled is True
    assert config.notices == [
        f"{path}: planner.use_experience: true read as experience.enabled: true "
        "(here one switch shows tips to the Planner and the CodeGenerator; it is on by default)",
        f"{path}: TaskWeaver settings with no effect here, ignored: logging.log_file",
    ]


def test_taskweavers_use_experience_off_turns_experience_off_here_and_says_it_is_on_by_default(tmp_path: Path) -> None:
    settings = {"planner.use_experience": False, "code_generator.use_experience": False}
    config = load_config(project_with(tmp_path, json.dumps(settings), name="taskweaver_config.json"))
    assert config.experience.enabled is False
    assert len(config.notices) == 1 and "it is on by default" in config.notices[0] and "no effect" not in config.notices[0]


def test_environment_placeholders_in_taskweavers_json_are_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TWL_TEST_KEY", "sk-from-env")
    monkeypatch.setenv("TWL_TEST_HOST", "gpu-box")
    settings = {"llm.api_key": "${TWL_TEST_KEY}", "llm.api_base": "http://${TWL_TEST_HOST}:8000/v1", "store.path": "${AppBaseDir}/s.db"}
    project = project_with(tmp_path, json.dumps(settings), name="taskweaver_config.json")
    config = load_config(project)
    assert config.llm.api_key is not None and config.llm.api_key.get_secret_value() == "sk-from-env"
    assert config.llm.api_base == "http://gpu-box:8000/v1"
    assert config.store.path == f"{project}/s.db"


def test_an_unset_placeholder_names_the_file_the_key_and_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TWL_TEST_UNSET", raising=False)
    project = project_with(tmp_path, json.dumps({"llm.api_key": "${TWL_TEST_UNSET}"}), name="taskweaver_config.json")
    said = problem(project)
    assert said == (
        f"{project / 'taskweaver_config.json'}: key 'llm.api_key' uses ${{TWL_TEST_UNSET}}, but the environment variable "
        "TWL_TEST_UNSET is not set; set it, or write the value in the file"
    )


def test_the_yaml_wins_over_the_json_and_a_bad_json_value_names_the_json(tmp_path: Path) -> None:
    project = project_with(tmp_path, json.dumps({"round_compressor.rounds_to_retain": "many"}), name="taskweaver_config.json")
    assert str(project / "taskweaver_config.json") in problem(project)
    (project / "taskweaver_config.yaml").write_text("round_compressor:\n  rounds_to_retain: 2\n", encoding="utf-8")
    assert load_config(project).round_compressor.rounds_to_retain == 2


def test_broken_json_names_its_line(tmp_path: Path) -> None:
    project = project_with(tmp_path, '{\n  "llm.model": "x",\n  "llm.api_base" "y"\n}\n', name="taskweaver_config.json")
    assert problem(project).startswith(f"{project / 'taskweaver_config.json'}, line 3: not valid JSON")


@pytest.mark.cli
def test_chat_lists_the_ignored_taskweaver_keys_once(tmp_path: Path) -> None:
    project = project_with(tmp_path, json.dumps({"llm.api_base": "http://127.0.0.1:9/v1", "logging.log_folder": "logs"}), name="taskweaver_config.json")
    done = run_cli("chat", "-p", str(project), stdin="")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("ignored: logging.log_folder") == 1
    assert "not found: using the defaults" not in done.stderr


def test_taskweavers_document_retriever_index_folder_is_read_as_the_folder_the_built_in_retriever_indexes(tmp_path: Path) -> None:
    settings = {"session.roles": ["planner", "document_retriever"], "document_retriever.index_folder": "knowledge_base"}
    project = project_with(tmp_path, json.dumps(settings), name="taskweaver_config.json")
    config = load_config(project)
    assert config.document_retriever.folder == "knowledge_base" and "document_retriever" in config.session.roles
    [line] = config.notices
    assert line.startswith(f'{project / "taskweaver_config.json"}: document_retriever.index_folder: "knowledge_base" read as document_retriever.folder')
