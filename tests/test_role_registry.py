"""The role registry: roles found built in, in the project and in installed packages; broken ones with one line."""

from __future__ import annotations

import sys
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest
import yaml

from taskweaver_lite.config.file import load_config
from taskweaver_lite.errors import ConfigError, ReplyFormatError
from taskweaver_lite.llm.replies import parse_reply, planner_schema
from taskweaver_lite.plugins import extensions
from taskweaver_lite.roles import registry
from taskweaver_lite.roles.registry import RoleCatalog, discover_roles
from taskweaver_lite.roles.worker import ModelOnlyRole

pytestmark = pytest.mark.unit

NOTES_ROLE = """\
alias: Notes
module: taskweaver.ext_role.notes.notes.Notes
intro : |-
  - Notes keeps the team's notes.
"""

NOTES_CLASS = """\
from taskweaver_lite.records.conversation import Post


class Notes:
    def reply(self, request, tools) -> Post:
        return request.answer("noted: " + request.message)
"""


def write_role(project: Path, name: str, text: str, *, code: str | None = None) -> Path:
    folder = project / "roles" / name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.role.yaml"
    path.write_text(text, encoding="utf-8")
    if code is not None:
        (folder / f"{name}.py").write_text(code, encoding="utf-8")
    return path


def catalog(project: Path, *enabled: str) -> RoleCatalog:
    return discover_roles(project, enabled=list(enabled) or ["planner", "code_interpreter"])


def state(found: RoleCatalog, name: str) -> tuple[str, str]:
    entry = found.find(name)
    assert entry is not None, f"{name} is not listed"
    return entry.state, entry.error


def test_the_planner_and_the_code_interpreter_are_registered_like_any_role_and_echo_is_off_by_default(tmp_path: Path) -> None:
    found = catalog(tmp_path)
    assert [spec.name for spec in found.enabled] == ["planner", "code_interpreter"]
    assert [spec.alias for spec in found.enabled] == ["Planner", "CodeInterpreter"]
    assert found.enabled[1].key == "code_generator", "the CodeInterpreter keeps its config section, prompts and examples"
    assert state(found, "echo") == ("disabled", "")
    assert found.recipients == ("CodeInterpreter", "User")


def test_a_taskweaver_role_file_with_its_class_beside_it_is_read_as_taskweaver_writes_it(tmp_path: Path) -> None:
    write_role(tmp_path, "notes", NOTES_ROLE, code=NOTES_CLASS)
    found = catalog(tmp_path, "planner", "notes")
    spec = found.by_alias("Notes")
    assert spec is not None and spec.intro == "- Notes keeps the team's notes." and spec.origin == "project"
    assert spec.handler is not None and callable(spec.handler().reply)
    assert found.recipients == ("Notes", "User")


def test_a_role_with_only_yaml_and_a_prompt_is_a_model_only_worker_with_its_own_settings(tmp_path: Path) -> None:
    text = "alias: Critic\nintro: checks results\nprompt: You are the {{ alias }}.\nllm: {model: big}\nrounds_to_retain: 1\nstyle: terse\n"
    write_role(tmp_path, "critic", text)
    spec = catalog(tmp_path, "planner", "critic").by_alias("Critic")
    assert spec is not None and spec.handler is ModelOnlyRole
    assert spec.settings == {"llm": {"model": "big"}, "rounds_to_retain": 1}
    assert spec.options == {"style": "terse"}, "keys that are neither TaskWeaver's nor ours are the role's own options"


@pytest.mark.parametrize(
    ("text", "code", "expected"),
    [
        ("module: notes.Notes\nintro: x\n", NOTES_CLASS, "key 'alias' is missing"),
        ("alias: Notes\nmodule: notes.Notes\n", NOTES_CLASS, "key 'intro' is missing"),
        ("alias: Notes\nintro: x\n", None, "key 'module' is missing"),
        ("alias: User\nintro: x\nprompt: p\n", None, "key 'alias'"),
        ("alias: Notes\nintro: x\nmodule: notes.Notes\n", "import not_a_real_module_xyz\n", "could not be imported from"),
        ("alias: Notes\nintro: x\nmodule: notes.Missing\n", NOTES_CLASS, "has no class 'Missing'"),
        ("alias: Notes\nintro: x\nprompt: p\nllm: {modle: x}\n", None, "key 'llm.modle'"),
        ("alias: [Notes\n", None, "is not valid YAML"),
    ],
)
def test_a_broken_role_is_listed_with_one_line_naming_its_file_and_the_problem(tmp_path: Path, text: str, code: str | None, expected: str) -> None:
    path = write_role(tmp_path, "notes", text, code=code)
    found = catalog(tmp_path, "planner", "code_interpreter", "notes")
    role_state, error = state(found, "notes")
    assert role_state == "broken" and expected in error
    entry = found.find("notes")
    assert entry is not None and str(path) in entry.line() and "\n" not in entry.line()
    assert [spec.name for spec in found.enabled] == ["planner", "code_interpreter"], "the session goes on with the other roles"


def test_two_roles_with_one_alias_leave_the_second_out_naming_the_first(tmp_path: Path) -> None:
    write_role(tmp_path, "alpha", "alias: Helper\nintro: a\nprompt: p\n")
    write_role(tmp_path, "beta", "alias: Helper\nintro: b\nprompt: p\n")
    found = catalog(tmp_path, "planner", "alpha", "beta")
    assert state(found, "alpha")[0] == "enabled"
    role_state, error = state(found, "beta")
    assert role_state == "broken" and "alias 'Helper'" in error and "alpha" in error


def test_a_project_role_cannot_take_a_built_in_alias(tmp_path: Path) -> None:
    write_role(tmp_path, "impostor", "alias: CodeInterpreter\nintro: a\nprompt: p\n")
    found = catalog(tmp_path, "planner", "code_interpreter", "impostor")
    assert state(found, "impostor")[0] == "broken"
    spec = found.by_alias("CodeInterpreter")
    assert spec is not None and spec.name == "code_interpreter"


def test_a_project_role_cannot_take_the_name_of_a_config_section(tmp_path: Path) -> None:
    write_role(tmp_path, "code_generator", "alias: Coder\nintro: a\nprompt: p\n")
    found = catalog(tmp_path, "planner", "code_interpreter", "code_generator")
    role_state, error = state(found, "code_generator")
    assert role_state == "broken" and "already a section of taskweaver_config.yaml" in error


def test_a_project_document_retriever_takes_the_built_in_ones_place_with_its_section(tmp_path: Path) -> None:
    write_role(tmp_path, "document_retriever", "alias: DocumentRetriever\nintro: Finds passages.\nprompt: p\n")
    found = catalog(tmp_path, "planner", "document_retriever")
    assert [e.state for e in found.entries if e.name == "document_retriever"] == ["enabled"], "listed once, the project's"
    spec = found.by_alias("DocumentRetriever")
    assert spec is not None and spec.origin == "project"


def test_a_broken_project_document_retriever_is_listed_with_its_reason_and_the_built_in_one_stays_listed(tmp_path: Path) -> None:
    # TaskWeaver's own folder: its class imports what is not provided here.
    code = "from taskweaver.module.prompt_util import PromptUtil\nfrom taskweaver.role import Role\nclass DocumentRetriever(Role):\n    pass\n"
    module = "module: taskweaver.ext_role.document_retriever.document_retriever.DocumentRetriever\n"
    write_role(tmp_path, "document_retriever", f"alias: DocumentRetriever\n{module}intro: Finds passages.\n", code=code)
    found = catalog(tmp_path, "planner", "document_retriever")
    rows = [(e.state, e.where, e.error) for e in found.entries if e.name == "document_retriever"]
    assert [state for state, _, _ in rows] == ["broken", "replaced"], rows
    assert "already a section" not in rows[0][2]
    assert rows[1][1] == "built-in" and "remove that folder to use this one" in rows[1][2]
    assert found.by_alias("DocumentRetriever") is None, "the session does not run another class than the project's"


def test_a_name_in_session_roles_that_is_no_role_is_reported_with_the_known_names(tmp_path: Path) -> None:
    found = catalog(tmp_path, "planner", "code_interpreter", "retreiver")
    role_state, error = state(found, "retreiver")
    assert role_state == "broken" and "no role is called 'retreiver'" in error and "echo" in error
    entry = found.find("retreiver")
    assert entry is not None and entry.where == "session.roles"


def test_installed_packages_add_role_folders_through_the_entry_point_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "pkg"
    write_role(package, "notes", NOTES_ROLE, code=NOTES_CLASS)
    (tmp_path / "team_roles_for_test.py").write_text(f"FOLDER = {str(package / 'roles')!r}\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    points = [
        EntryPoint("team", "team_roles_for_test:FOLDER", registry.ENTRY_POINT_GROUP),
        EntryPoint("gone", "no_such_module_for_roles:FOLDER", registry.ENTRY_POINT_GROUP),
    ]
    monkeypatch.setattr(extensions, "entry_points", lambda group: points if group == registry.ENTRY_POINT_GROUP else [])
    found = catalog(tmp_path / "project", "planner", "notes")
    spec = found.by_alias("Notes")
    assert spec is not None and spec.origin == "entry point team"
    assert state(found, "gone")[0] == "broken"
    sys.modules.pop("team_roles_for_test", None)


def test_the_planner_schema_takes_the_enabled_aliases_and_a_repair_names_them() -> None:
    schema = planner_schema(("User", "CodeInterpreter", "Notes"))
    reply: dict[str, Any] = {"response": {"init_plan": "1", "plan": "1", "current_plan_step": "1", "send_to": "Notes", "message": "m"}}
    assert parse_reply(yaml.safe_dump(reply, default_flow_style=True), schema)["send_to"] == "Notes"
    reply["response"]["send_to"] = "Boss"
    with pytest.raises(ReplyFormatError, match="User, CodeInterpreter, Notes"):
        parse_reply(yaml.safe_dump(reply, default_flow_style=True), schema)


def test_a_project_role_has_its_own_config_section_and_set_overrides_reach_it(tmp_path: Path) -> None:
    write_role(tmp_path, "critic", "alias: Critic\nintro: c\nprompt: p\nllm: {model: small, context_window: 16000}\n")
    (tmp_path / "taskweaver_config.yaml").write_text("critic:\n  llm: {model: big}\n  strategy: sliding_window\n", encoding="utf-8")
    config = load_config(tmp_path, ["critic.rounds_to_retain=1"])
    section = config.role_section("critic")
    assert section.llm.model == "big" and section.strategy == "sliding_window" and section.rounds_to_retain == 1
    spec = catalog(tmp_path, "planner", "critic").by_alias("Critic")
    assert spec is not None
    merged = spec.section(section)
    assert merged.llm.model == "big" and merged.llm.context_window == 16000, "the project's keys win over the role file's, key by key"


def test_a_section_for_a_role_that_does_not_exist_is_still_an_unknown_key(tmp_path: Path) -> None:
    (tmp_path / "taskweaver_config.yaml").write_text("critik:\n  strategy: none\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="unknown key 'critik'"):
        load_config(tmp_path)
    (tmp_path / "taskweaver_config.yaml").write_text("", encoding="utf-8")
    with pytest.raises(ConfigError, match="unknown config key 'critik'"):
        load_config(tmp_path, ["critik.strategy=none"])


def test_a_wrong_value_in_a_role_section_names_the_section(tmp_path: Path) -> None:
    (tmp_path / "taskweaver_config.yaml").write_text("session: {roles: [planner, echo]}\necho:\n  strategy: folding\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"key 'echo\.strategy'"):
        load_config(tmp_path)
