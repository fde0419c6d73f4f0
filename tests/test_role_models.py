"""A model per role: `planner.llm`, `code_generator.llm`, `round_compressor.llm` over `llm`, each call
to its own endpoint with its own model name, each role's budget from its own window, /info per model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import make_project, run_cli

from taskweaver_lite.config.file import load_config
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.session.assembly import open_session
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply

pytestmark = pytest.mark.kernel


@pytest.fixture
def servers() -> Iterator[tuple[ScriptedServer, ScriptedServer]]:
    with ScriptedServer(model="strong-planner") as planning, ScriptedServer(model="small-coder", api_key="coder-key") as coding:
        yield planning, coding


def project_for(tmp_path: Path, planning: ScriptedServer, coding: ScriptedServer) -> Path:
    return make_project(
        tmp_path,
        planning.url,  # the top-level llm; the planner keeps it but names its own model
        llm={"model": "strong-planner", "context_window": 32_000},
        planner={"llm": {"context_window": 16_000}},
        code_generator={"llm": {"api_base": coding.url, "api_key": "coder-key", "model": "small-coder", "context_window": 8_000}},
    )


def test_each_role_calls_its_own_endpoint_with_its_own_model_and_budget(tmp_path: Path, servers: tuple[ScriptedServer, ScriptedServer]) -> None:
    planning, coding = servers
    planning.enqueue("planner", planner_reply("Add two and two."), planner_reply("It is 4.", send_to="User"))
    coding.enqueue("code_generator", code_reply("print(2 + 2)"))
    config = load_config(project_for(tmp_path, planning, coding))
    with open_session(config) as session:
        rnd = session.ask("what is 2 + 2?")
        contexts = session.contexts()
        by_model = session.usage_by_model()
    assert rnd.posts[-1].message == "It is 4."
    assert [r.role for r in planning.requests] == ["planner", "planner"]
    assert [r.role for r in coding.requests] == ["code_generator"]
    assert {r.body["model"] for r in planning.requests} == {"strong-planner"}
    assert coding.requests[0].body["model"] == "small-coder"
    assert contexts["planner"].budget == 16_000 - 4_000 - 256, "each role's budget: its window less its own default reserve (a quarter)"
    assert contexts["code_generator"].budget == 8_000 - 2_000 - 256
    assert set(by_model) == {("planner", "strong-planner"), ("code_generator", "small-coder")}
    assert by_model["planner", "strong-planner"].calls == 2


def test_info_shows_each_roles_model_and_the_tokens_per_role_and_model(tmp_path: Path, servers: tuple[ScriptedServer, ScriptedServer]) -> None:
    planning, coding = servers
    planning.enqueue("planner", planner_reply("Add two and two."), planner_reply("It is 4.", send_to="User"))
    coding.enqueue("code_generator", code_reply("print(2 + 2)"))
    done = run_cli("chat", "-p", str(project_for(tmp_path, planning, coding)), stdin="what is 2 + 2?\n/info\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "It is 4.\n"
    assert "  planner: strong-planner (context window 16,000 tokens)" in done.stderr
    assert "  code_generator: small-coder (context window 8,000 tokens)" in done.stderr
    assert "  round_compressor: strong-planner (context window 32,000 tokens)" in done.stderr
    assert "  planner on strong-planner: " in done.stderr and "over 2 calls" in done.stderr
    assert "  code_generator on small-coder: " in done.stderr and "over 1 call\n" in done.stderr


def test_a_role_window_too_small_is_a_config_error_naming_the_role(tmp_path: Path) -> None:
    project = make_project(tmp_path, "http://127.0.0.1:9/v1", planner={"llm": {"context_window": 600}})
    with pytest.raises(ConfigError, match=r"planner\.llm \(over llm\): context_window 600 leaves .* raise planner\.llm\.context_window"):
        load_config(project)


def test_a_role_model_can_be_set_from_the_command_line(tmp_path: Path) -> None:
    project = make_project(tmp_path, "http://127.0.0.1:9/v1")
    config = load_config(project, ["round_compressor.llm.model=tiny", "planner.llm.json_mode=false"])
    assert config.llm_for("round_compressor").model == "tiny" and config.llm_for("planner").model == "scripted"
    assert config.llm_for("planner").structured == "off" and config.llm_for("code_generator").structured == "auto"  # json_mode: the older name
